//! IETF `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers-11).
//!
//! Both are Structured Field lists (RFC 9651, parsed by the [`sfv`] crate); every
//! line of a field is joined with `", "` first. A policy item is a name (string, or token as older
//! drafts sent) with `q` (quota), optional `qu` (quota unit) and `w` (window
//! seconds). A `RateLimit` item names its policy and carries `r` (remaining quota)
//! and `t` (seconds until the quota resets).
//!
//! Mapping to a request [`Allowance`]:
//!
//! * Only request quotas count: a policy whose `qu` is present and is not
//!   `"request"` (e.g. `"content-bytes"`, `"concurrency"`) is skipped, and so is a
//!   `RateLimit` item naming such a policy.
//! * Of the `RateLimit` items with a valid `r` (a non-negative integer), the most
//!   restrictive wins: smallest `r`, and on a tie the longest `t`. The allowance is
//!   `remaining = r`, `reset_after = t` seconds, `limit = q` of the policy of the
//!   same name (if there is one).
//! * With no usable `RateLimit` item, the policy with the smallest `q` gives
//!   `limit` alone.
//! * A field that does not parse as a list is treated as absent. That includes a
//!   field with a display string (`%"..."`) anywhere in it: no draft uses them.

use std::cmp::Reverse;
use std::fmt;
use std::time::Duration;

use http::HeaderMap;
use sfv::visitor::{EntryVisitor, InnerListVisitor, ItemVisitor, ListVisitor, ParameterVisitor};
use sfv::{BareItemFromInput, KeyRef};

use super::{allowance, field, Allowance};

/// A bare item, as far as these fields need it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Bare {
    Integer(i64),
    String(String),
    Token(String),
    /// A decimal, byte sequence, boolean or date: never a usable value here.
    Other,
}

/// A list member: its name (a string or token item; `None` for any other item
/// and for an inner list) and its parameters, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Member {
    name: Option<String>,
    params: Vec<(String, Bare)>,
}

impl Member {
    /// The value of parameter `key` (the last one wins, as RFC 9651 §4.2.3.2 says).
    fn param(&self, key: &str) -> Option<&Bare> {
        self.params
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }

    fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }
}

/// Why a syntactically valid field is still refused: it holds a display string.
#[derive(Debug)]
struct DisplayString;

impl fmt::Display for DisplayString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("display strings are not used in RateLimit fields")
    }
}

impl std::error::Error for DisplayString {}

fn bare(item: BareItemFromInput<'_>) -> Result<Bare, DisplayString> {
    Ok(match item {
        BareItemFromInput::Integer(n) => Bare::Integer(n.into()),
        BareItemFromInput::String(s) => Bare::String(s.as_str().to_owned()),
        BareItemFromInput::Token(t) => Bare::Token(t.as_str().to_owned()),
        BareItemFromInput::DisplayString(_) => return Err(DisplayString),
        BareItemFromInput::Decimal(_)
        | BareItemFromInput::ByteSequence(_)
        | BareItemFromInput::Boolean(_)
        | BareItemFromInput::Date(_) => Bare::Other,
    })
}

/// Collects list members for [`sfv::Parser::parse_list_with_visitor`].
struct Members(Vec<Member>);

/// Parameters go to `Some` list; with `None` (inside an inner list) they are only checked.
struct Params<'a>(Option<&'a mut Vec<(String, Bare)>>);

/// An inner list: its items are only checked; its parameters are kept.
struct Inner<'a>(&'a mut Member);

impl<'de> ListVisitor<'de> for Members {
    type Out = Vec<Member>;
    type Error = DisplayString;

    fn entry(&mut self) -> Result<impl EntryVisitor<'de>, Self::Error> {
        self.0.push(Member::default());
        Ok(self.0.last_mut())
    }

    fn finish(self) -> Result<Self::Out, Self::Error> {
        Ok(self.0)
    }
}

impl<'de> EntryVisitor<'de> for &mut Member {
    type Error = DisplayString;

    fn item(self) -> Result<impl ItemVisitor<'de>, Self::Error> {
        Ok(self)
    }

    fn inner_list(self) -> Result<impl InnerListVisitor<'de>, Self::Error> {
        Ok(Inner(self))
    }
}

impl<'de> ItemVisitor<'de> for &mut Member {
    type Out = ();
    type Error = DisplayString;

    fn bare_item(
        self,
        item: BareItemFromInput<'de>,
    ) -> Result<impl ParameterVisitor<'de, Out = ()>, Self::Error> {
        self.name = match bare(item)? {
            Bare::String(s) | Bare::Token(s) => Some(s),
            Bare::Integer(_) | Bare::Other => None,
        };
        Ok(Params(Some(&mut self.params)))
    }
}

/// An inner-list item: checked, then dropped.
impl<'de> ItemVisitor<'de> for Params<'_> {
    type Out = ();
    type Error = DisplayString;

    fn bare_item(
        self,
        item: BareItemFromInput<'de>,
    ) -> Result<impl ParameterVisitor<'de, Out = ()>, Self::Error> {
        bare(item)?;
        Ok(self)
    }
}

impl<'de> InnerListVisitor<'de> for Inner<'_> {
    type Error = DisplayString;

    fn item(&mut self) -> Result<impl ItemVisitor<'de>, Self::Error> {
        Ok(Params(None))
    }

    fn finish(self) -> Result<impl ParameterVisitor<'de>, Self::Error> {
        Ok(Params(Some(&mut self.0.params)))
    }
}

impl<'de> ParameterVisitor<'de> for Params<'_> {
    type Out = ();
    type Error = DisplayString;

    fn parameter(
        &mut self,
        key: &'de KeyRef,
        value: BareItemFromInput<'de>,
    ) -> Result<(), Self::Error> {
        let value = bare(value)?;
        if let Some(params) = &mut self.0 {
            params.push((key.as_str().to_owned(), value));
        }
        Ok(())
    }

    fn finish(self) -> Result<(), Self::Error> {
        Ok(())
    }
}

/// Parses a whole field value as an `sf-list`. `None` on any syntax error (RFC 9651
/// fails the whole field) and on a display string.
fn parse_list(input: &str) -> Option<Vec<Member>> {
    sfv::Parser::new(input)
        .parse_list_with_visitor(Members(Vec::new()))
        .ok()
}

fn non_negative(member: &Member, key: &str) -> Option<u64> {
    match member.param(key)? {
        Bare::Integer(n) => u64::try_from(*n).ok(),
        _ => None,
    }
}

fn counts_requests(policy: &Member) -> bool {
    match policy.param("qu") {
        None => true,
        Some(Bare::String(unit) | Bare::Token(unit)) => unit == "request" || unit == "requests",
        Some(Bare::Integer(_) | Bare::Other) => false,
    }
}

fn list(headers: &HeaderMap, name: &str) -> Vec<Member> {
    field::joined(headers, name)
        .and_then(|v| parse_list(&v))
        .unwrap_or_default()
}

/// The request allowance from `RateLimit-Policy` and `RateLimit`.
pub(super) fn requests(headers: &HeaderMap) -> Option<Allowance> {
    let policies = list(headers, "ratelimit-policy");
    let current = list(headers, "ratelimit");
    let policy =
        |name: Option<&str>| name.and_then(|name| policies.iter().find(|p| p.name() == Some(name)));
    let best = current
        .iter()
        .filter(|item| policy(item.name()).is_none_or(counts_requests))
        .filter_map(|item| {
            let r = non_negative(item, "r")?;
            Some((r, non_negative(item, "t"), item))
        })
        .min_by_key(|(r, t, _)| (*r, Reverse(*t)));
    if let Some((r, t, item)) = best {
        let limit = policy(item.name()).and_then(|p| non_negative(p, "q"));
        let reset = t.map(|t| Duration::from_secs(t).min(super::MAX_HINT_DELAY));
        return allowance(limit, Some(r), reset);
    }
    let limit = policies
        .iter()
        .filter(|p| counts_requests(p))
        .filter_map(|p| non_negative(p, "q"))
        .min();
    allowance(limit, None, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::test_support::{map, Pairs};
    use crate::headers::MAX_HINT_DELAY;

    fn a(limit: Option<u64>, remaining: Option<u64>, reset_s: Option<u64>) -> Option<Allowance> {
        Some(Allowance::new(
            limit,
            remaining,
            reset_s.map(Duration::from_secs),
        ))
    }

    fn member(name: Option<&str>, params: &[(&str, Bare)]) -> Member {
        Member {
            name: name.map(str::to_owned),
            params: params
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        }
    }

    /// The cases the hand-written parser was tested with, now against `sfv`.
    #[test]
    fn lists() {
        use Bare::*;
        let cases: Vec<(&str, Option<Vec<Member>>)> = vec![
            (
                r#""default";q=100;w=60"#,
                Some(vec![member(
                    Some("default"),
                    &[("q", Integer(100)), ("w", Integer(60))],
                )]),
            ),
            (r#"  "a";r=1, "b" ;x"#, None), // SP before ';' is not allowed
            (
                "burst;q=10,\t\"day\";q=1000;pk=:AQID:",
                Some(vec![
                    member(Some("burst"), &[("q", Integer(10))]),
                    member(Some("day"), &[("q", Integer(1000)), ("pk", Other)]),
                ]),
            ),
            (
                r#""a\"b\\c";flag;n=-5;d=1.5;b=?0;t=@17"#,
                Some(vec![member(
                    Some("a\"b\\c"),
                    &[
                        ("flag", Other),
                        ("n", Integer(-5)),
                        ("d", Other),
                        ("b", Other),
                        ("t", Other),
                    ],
                )]),
            ),
            (
                r#"("x" "y");q=1, "z", 7;r=1"#,
                Some(vec![
                    member(None, &[("q", Integer(1))]),
                    member(Some("z"), &[]),
                    member(None, &[("r", Integer(1))]),
                ]),
            ),
            ("", Some(vec![])),
            ("   ", Some(vec![])),
            (r#""a","#, None),
            (r#","a""#, None),
            (r#""a",,"b""#, None),
            (r#""unterminated"#, None),
            (r#""bad\n""#, None),
            ("\"a\";Q=1", None),
            ("\"a\";q=1234567890123456", None),
            ("\"a\";q=1.2345", None),
            ("\"a\";q=", None),
            ("\"a\" \"b\"", None),
            ("?2", None),
            (":not base64!:", None),
            ("(\"x\"", None),
            // display strings are valid RFC 9651 but refused, anywhere in the field
            ("%\"x\"", None),
            ("\"a\";r=1;n=%\"x\"", None),
            ("(%\"x\");r=1", None),
            // byte sequences must now decode as base64 (the old parser only
            // checked the alphabet and accepted these)
            ("\"a\";r=1;pk=:A:", None),
            ("\"a\";r=1;pk=:A=B=:", None),
        ];
        for (input, want) in cases {
            assert_eq!(parse_list(input), want, "{input:?}");
        }
    }

    #[test]
    fn params_last_wins() {
        let list = parse_list(r#""p";q=1;q=2"#).unwrap_or_default();
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].param("q"), Some(&Bare::Integer(2)));
        assert_eq!(list[0].param("w"), None);
        assert_eq!(list[0].name(), Some("p"));
    }

    #[test]
    fn ietf_family() {
        const P: &str = "ratelimit-policy";
        const R: &str = "ratelimit";
        let cases: &[(Pairs, Option<Allowance>)] = &[
            (
                &[
                    (P, b"\"default\";q=100;w=60"),
                    (R, b"\"default\";r=50;t=30"),
                ],
                a(Some(100), Some(50), Some(30)),
            ),
            (
                &[(R, b"\"default\";r=50;t=30")],
                a(None, Some(50), Some(30)),
            ),
            (&[(P, b"\"default\";q=100;w=60")], a(Some(100), None, None)),
            // several policies: the smallest r, with its t and its q
            (
                &[
                    (P, b"\"burst\";q=10;w=1, \"day\";q=1000;w=86400"),
                    (R, b"\"burst\";r=9;t=1, \"day\";r=3;t=4000"),
                ],
                a(Some(1000), Some(3), Some(4000)),
            ),
            // split over several lines
            (
                &[
                    (P, b"\"burst\";q=10;w=1"),
                    (P, b"\"day\";q=1000;w=86400"),
                    (R, b"\"burst\";r=2;t=1"),
                    (R, b"\"day\";r=700;t=4000"),
                ],
                a(Some(10), Some(2), Some(1)),
            ),
            // tie on r: the longer t
            (
                &[(R, b"\"a\";r=0;t=5, \"b\";r=0;t=50")],
                a(None, Some(0), Some(50)),
            ),
            // policies without RateLimit: the smallest q
            (
                &[(P, b"\"a\";q=500;w=60, \"b\";q=20;w=1")],
                a(Some(20), None, None),
            ),
            // non-request quota units are skipped
            (
                &[
                    (
                        P,
                        b"\"bytes\";q=1000;qu=\"content-bytes\", \"req\";q=100;qu=\"request\"",
                    ),
                    (R, b"\"bytes\";r=1;t=9, \"req\";r=60;t=10"),
                ],
                a(Some(100), Some(60), Some(10)),
            ),
            // older drafts used tokens for names
            (
                &[(P, b"default;q=100;w=60"), (R, b"default;r=5;t=6")],
                a(Some(100), Some(5), Some(6)),
            ),
            // r greater than q: remaining dropped
            (
                &[(P, b"\"d\";q=10"), (R, b"\"d\";r=11;t=3")],
                a(Some(10), None, Some(3)),
            ),
            // huge t saturates
            (
                &[(R, b"\"d\";r=1;t=999999999999999")],
                a(None, Some(1), Some(MAX_HINT_DELAY.as_secs())),
            ),
            // malformed
            (&[(R, b"\"d\";r=-1;t=3")], None),
            (&[(R, b"\"d\";r=1.5;t=3")], None),
            (&[(R, b"\"d\";r=\"5\"")], None),
            (&[(R, b"\"d\";r=5;t=-3")], a(None, Some(5), None)),
            (&[(R, b"\"d\";r=5,")], None),
            (&[(R, b"\"d\"; r=5")], a(None, Some(5), None)),
            (
                &[(P, b"\"d\";q=100"), (R, b"\"d\";r=5 junk")],
                a(Some(100), None, None),
            ),
            (&[(R, b"\"d\xe9\";r=5")], None),
            (&[(R, b"limit=100, remaining=5")], None),
            (&[(R, b"%\"d\";r=5")], None),
            // a byte sequence that is not base64 fails the field (before sfv: a hint)
            (&[(R, b"\"d\";r=5;pk=:A:")], None),
            (&[], None),
        ];
        for (pairs, want) in cases {
            assert_eq!(requests(&map(pairs)), *want, "{pairs:?}");
        }
    }
}
