//! Error bodies: problem details (RFC 9457) and OpenAI style `{"error": {...}}`.

use serde_json::{Map, Value};

/// Bodies longer than this many bytes (16 KiB) are not read: an error body that
/// large is not a short machine-readable error.
pub const MAX_ERROR_BODY: usize = 16 * 1024;

/// The machine-readable parts of an error response body.
///
/// Read from a problem details object (RFC 9457: `type`, `title`, `status`,
/// `detail`, and the extension members `reason` and `code`) and from the OpenAI
/// style `{"error": {"type", "code", "message"}}`. When both shapes are present,
/// the top-level problem member wins over the nested `error` member field by field.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ErrorBody {
    /// Problem type: RFC 9457 `type` (a URI reference such as
    /// `/errors/entitlement-required`), or the OpenAI `error.type`
    /// (such as `insufficient_quota`).
    pub problem_type: Option<String>,
    /// RFC 9457 `title`: a short human-readable summary.
    pub title: Option<String>,
    /// RFC 9457 `status`: the HTTP status code the server meant (an integer, 100 to 999).
    pub status: Option<u16>,
    /// RFC 9457 `detail`: a human-readable explanation of this occurrence.
    pub detail: Option<String>,
    /// Extension member `reason` (e.g. `limit_reached`, `not_in_plan`).
    pub reason: Option<String>,
    /// Extension member `code`, or the OpenAI `error.code` (e.g. `rate_limit_exceeded`).
    /// An integer code is kept as its decimal text.
    pub code: Option<String>,
    /// The OpenAI `error.message`: a human-readable explanation.
    pub message: Option<String>,
}

impl ErrorBody {
    /// The machine codes this body carries, in order: `code`, `reason`, and the last
    /// path segment of `problem_type` (so `/errors/entitlement-required` yields
    /// `entitlement-required`; a query or fragment is ignored, and `about:blank`,
    /// RFC 9457's "no particular type", yields nothing). Empty values are skipped.
    pub fn codes(&self) -> impl Iterator<Item = &str> + '_ {
        let segment = self.problem_type.as_deref().and_then(last_segment);
        [self.code.as_deref(), self.reason.as_deref(), segment]
            .into_iter()
            .flatten()
            .map(str::trim)
            .filter(|s| !s.is_empty())
    }

    fn is_empty(&self) -> bool {
        *self == ErrorBody::default()
    }
}

fn last_segment(uri: &str) -> Option<&str> {
    if uri.trim().eq_ignore_ascii_case("about:blank") {
        return None;
    }
    let path = uri.split(['?', '#']).next().unwrap_or(uri);
    path.trim_end_matches('/').rsplit('/').next()
}

fn text(object: &Map<String, Value>, key: &str) -> Option<String> {
    object.get(key)?.as_str().map(str::to_owned)
}

fn code(object: &Map<String, Value>) -> Option<String> {
    match object.get("code")? {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) if n.is_i64() || n.is_u64() => Some(n.to_string()),
        _ => None,
    }
}

/// Reads the machine-readable parts of an error body.
///
/// Returns `None` when the body is larger than [`MAX_ERROR_BODY`], is not JSON,
/// is not a JSON object, or has none of the members listed on [`ErrorBody`].
/// Members of the wrong JSON type (e.g. a numeric `title`) are ignored; `status`
/// must be an integer from 100 to 999. The content type is not checked.
pub fn parse_error_body(body: &[u8]) -> Option<ErrorBody> {
    if body.len() > MAX_ERROR_BODY {
        return None;
    }
    let value: Value = serde_json::from_slice(body).ok()?;
    let top = value.as_object()?;
    let nested = top.get("error").and_then(Value::as_object);
    let either =
        |f: &dyn Fn(&Map<String, Value>) -> Option<String>| f(top).or_else(|| nested.and_then(f));
    let parsed = ErrorBody {
        problem_type: either(&|o| text(o, "type")),
        title: text(top, "title"),
        status: top
            .get("status")
            .and_then(Value::as_u64)
            .filter(|s| (100..=999).contains(s))
            .and_then(|s| u16::try_from(s).ok()),
        detail: text(top, "detail"),
        reason: text(top, "reason"),
        code: either(&code),
        message: nested.and_then(|o| text(o, "message")),
    };
    (!parsed.is_empty()).then_some(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(
        problem_type: Option<&str>,
        title: Option<&str>,
        status: Option<u16>,
        detail: Option<&str>,
        reason: Option<&str>,
        code: Option<&str>,
        message: Option<&str>,
    ) -> Option<ErrorBody> {
        let s = |v: Option<&str>| v.map(str::to_owned);
        Some(ErrorBody {
            problem_type: s(problem_type),
            title: s(title),
            status,
            detail: s(detail),
            reason: s(reason),
            code: s(code),
            message: s(message),
        })
    }

    #[test]
    fn bodies() {
        let cases: Vec<(&[u8], Option<ErrorBody>)> = vec![
            (
                br#"{"title":"Too many requests.","status":429,"detail":"Retry after 12 seconds.","instance":"/v1/x"}"#,
                body(None, Some("Too many requests."), Some(429), Some("Retry after 12 seconds."), None, None, None),
            ),
            (
                br#"{"type":"/errors/entitlement-required","title":"Plan entitlement required.","status":403,"detail":"amy.tokens.month","reason":"limit_reached","limit":100000,"remaining":0}"#,
                body(Some("/errors/entitlement-required"), Some("Plan entitlement required."), Some(403), Some("amy.tokens.month"), Some("limit_reached"), None, None),
            ),
            (
                br#"{"error":{"message":"You exceeded your current quota.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#,
                body(Some("insufficient_quota"), None, None, None, None, Some("insufficient_quota"), Some("You exceeded your current quota.")),
            ),
            (
                br#"{"error":{"message":"slow down","type":"requests","code":null}}"#,
                body(Some("requests"), None, None, None, None, None, Some("slow down")),
            ),
            (
                br#"{"status":409,"code":"idempotency_in_progress"}"#,
                body(None, None, Some(409), None, None, Some("idempotency_in_progress"), None),
            ),
            (br#"{"code":42}"#, body(None, None, None, None, None, Some("42"), None)),
            // top-level members win over nested ones
            (
                br#"{"code":"run_already_started","error":{"code":"other","type":"t"}}"#,
                body(Some("t"), None, None, None, None, Some("run_already_started"), None),
            ),
            // wrong member types are ignored
            (br#"{"status":"429","title":7}"#, None),
            (br#"{"status":70000}"#, None),
            (br#"{"status":-1}"#, None),
            (br#"{"status":429.5}"#, None),
            (br#"{"status":99}"#, None),
            (br#"{"error":"rate limited"}"#, None),
            // not an object, not JSON, empty
            (br#"[{"code":"x"}]"#, None),
            (br#""quota_exceeded""#, None),
            (b"{}", None),
            (b"", None),
            (b"<html>429</html>", None),
            (b"{\"code\":\"x\"", None),
            (b"\xff\xfe", None),
        ];
        for (input, want) in cases {
            assert_eq!(
                parse_error_body(input),
                want,
                "{}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn size_limit() {
        let mut at_limit = br#"{"code":"quota_exceeded"}"#.to_vec();
        at_limit.resize(MAX_ERROR_BODY, b' ');
        assert_eq!(
            parse_error_body(&at_limit).and_then(|b| b.code),
            Some("quota_exceeded".to_owned())
        );
        at_limit.push(b' ');
        assert_eq!(parse_error_body(&at_limit), None);
    }

    #[test]
    fn codes() {
        let cases: Vec<(&[u8], Vec<&str>)> = vec![
            (
                br#"{"type":"/errors/entitlement-required","reason":"not_in_plan"}"#,
                vec!["not_in_plan", "entitlement-required"],
            ),
            (
                br#"{"type":"https://example.com/errors/quota_exceeded/?x=1#y","code":"  "}"#,
                vec!["quota_exceeded"],
            ),
            (br#"{"type":"about:blank","status":429}"#, vec![]),
            (
                br#"{"type":"idempotency_key_reused"}"#,
                vec!["idempotency_key_reused"],
            ),
            (
                br#"{"code":"run_already_started","reason":""}"#,
                vec!["run_already_started"],
            ),
            (
                br#"{"error":{"type":"insufficient_quota","code":"insufficient_quota"}}"#,
                vec!["insufficient_quota", "insufficient_quota"],
            ),
        ];
        for (input, want) in cases {
            let parsed = parse_error_body(input).unwrap_or_default();
            assert_eq!(
                parsed.codes().collect::<Vec<_>>(),
                want,
                "{}",
                String::from_utf8_lossy(input)
            );
        }
    }
}
