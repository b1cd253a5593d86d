//! Which requests are safe to send again.

use http::{HeaderName, Method};

/// Whether `method` is idempotent: sending it twice has the effect of sending it once
/// (RFC 9110 §9.2.2: GET, HEAD, OPTIONS, TRACE, PUT, DELETE).
pub fn is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

/// Whether `headers` carry a non-blank value in `name`: an empty or all-space key counts as
/// no key.
pub fn has_idempotency_key(headers: &http::HeaderMap, name: &HeaderName) -> bool {
    headers
        .get(name)
        .is_some_and(|v| !v.as_bytes().iter().all(u8::is_ascii_whitespace))
}

/// Whether a request that may have reached the server (a 5xx answer, a broken connection) may be
/// sent again: its method is idempotent, or it carries a non-blank idempotency key in the header
/// `key_header` (a blank or all-space value counts as no key).
pub fn may_resend_after_failure(
    method: &Method,
    headers: &http::HeaderMap,
    key_header: Option<&HeaderName>,
) -> bool {
    is_idempotent(method) || key_header.is_some_and(|name| has_idempotency_key(headers, name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, HeaderValue};

    #[test]
    fn idempotent_methods() {
        let yes = ["GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"];
        let no = ["POST", "PATCH", "CONNECT"];
        for m in yes {
            assert!(is_idempotent(&m.parse().unwrap()), "{m}");
        }
        for m in no {
            assert!(!is_idempotent(&m.parse().unwrap()), "{m}");
        }
    }

    #[test]
    fn a_key_makes_post_resendable_unless_blank() {
        let name = HeaderName::from_static("idempotency-key");
        let mut h = HeaderMap::new();
        assert!(!may_resend_after_failure(&Method::POST, &h, Some(&name)));
        h.insert(&name, HeaderValue::from_static("   "));
        assert!(!may_resend_after_failure(&Method::POST, &h, Some(&name)));
        h.insert(&name, HeaderValue::from_static("order-1"));
        assert!(may_resend_after_failure(&Method::POST, &h, Some(&name)));
        assert!(!may_resend_after_failure(&Method::POST, &h, None));
        assert!(may_resend_after_failure(
            &Method::GET,
            &HeaderMap::new(),
            None
        ));
    }
}
