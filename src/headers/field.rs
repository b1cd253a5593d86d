//! Reading raw field values out of a [`HeaderMap`].
//!
//! Every family goes through these helpers, so the rules on bytes and on repeated
//! field lines are the same everywhere:
//!
//! * A value must decode as text. Most families need visible ASCII plus SP/HTAB
//!   ([`http::HeaderValue::to_str`]); Go durations also need `µ`, so they use
//!   [`single_utf8`], which accepts any valid UTF-8. Anything else is "no hint".
//! * Leading and trailing SP/HTAB are removed (RFC 9110 §5.5: they are not part of
//!   the field value).
//! * A single-valued field sent on several lines is only accepted when every line
//!   carries the same value; conflicting lines are ambiguous, so they give `None`.

use http::{HeaderMap, HeaderValue};

fn trim_ows(s: &str) -> &str {
    s.trim_matches(|c| c == ' ' || c == '\t')
}

fn ascii(v: &HeaderValue) -> Option<&str> {
    v.to_str().ok()
}

fn utf8(v: &HeaderValue) -> Option<&str> {
    std::str::from_utf8(v.as_bytes()).ok()
}

fn single_with<'a>(
    headers: &'a HeaderMap,
    name: &str,
    decode: fn(&HeaderValue) -> Option<&str>,
) -> Option<&'a str> {
    let mut found: Option<&str> = None;
    for value in headers.get_all(name) {
        let text = trim_ows(decode(value)?);
        match found {
            None => found = Some(text),
            Some(previous) if previous == text => {}
            Some(_) => return None,
        }
    }
    found
}

/// The trimmed value of a single-valued field whose grammar is visible ASCII.
pub(super) fn single<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    single_with(headers, name, ascii)
}

/// Like [`single`], but any valid UTF-8 is let through (for `µs` in Go durations).
pub(super) fn single_utf8<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    single_with(headers, name, utf8)
}

/// All lines of a list-valued field joined with `", "` (RFC 9110 §5.3), or `None`
/// when the field is absent or any line is not visible ASCII.
pub(super) fn joined(headers: &HeaderMap, name: &str) -> Option<String> {
    let mut out: Option<String> = None;
    for value in headers.get_all(name) {
        let text = ascii(value)?;
        match out.as_mut() {
            None => out = Some(text.to_owned()),
            Some(acc) => {
                acc.push_str(", ");
                acc.push_str(text);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::test_support::{map, Pairs};

    #[test]
    fn single_values() {
        let cases: &[(Pairs, Option<&str>)] = &[
            (&[], None),
            (&[("x", b"  12\t")], Some("12")),
            (&[("x", b"12"), ("x", b"12")], Some("12")),
            (&[("x", b"12"), ("x", b" 12 ")], Some("12")),
            (&[("x", b"12"), ("x", b"13")], None),
            (&[("x", b"\xc2\xb5s")], None),
            (&[("x", b"")], Some("")),
        ];
        for (pairs, want) in cases {
            let h = map(pairs);
            assert_eq!(single(&h, "x"), *want, "{pairs:?}");
        }
    }

    #[test]
    fn utf8_values() {
        let h = map(&[("x", b" 5\xc2\xb5s ")]);
        assert_eq!(single_utf8(&h, "x"), Some("5µs"));
        let h = map(&[("x", b"5\xffs")]);
        assert_eq!(single_utf8(&h, "x"), None);
    }

    #[test]
    fn joined_values() {
        let h = map(&[("x", &b"a"[..]), ("x", b"b;q=1")]);
        assert_eq!(joined(&h, "x").as_deref(), Some("a, b;q=1"));
        assert_eq!(joined(&h, "y"), None);
        let h = map(&[("x", &b"a"[..]), ("x", b"\xe9")]);
        assert_eq!(joined(&h, "x"), None);
    }
}
