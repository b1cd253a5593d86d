//! A small parser for Structured Field lists (RFC 9651, formerly RFC 8941 §4.2),
//! enough for `RateLimit` and `RateLimit-Policy`.
//!
//! It follows the RFC's parsing algorithm: any syntax error fails the whole field
//! (the caller then treats the field as absent). Inner lists are parsed and kept
//! only as a marker, since nothing here uses them. Byte sequences are checked for
//! their alphabet but not decoded; display strings (`%"..."`) are rejected.

/// A bare item's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Bare {
    /// `sf-integer`: at most 15 digits, optional `-`.
    Integer(i64),
    /// `sf-decimal` (its value is not needed here).
    Decimal,
    /// `sf-string`, unescaped.
    String(String),
    /// `sf-token`.
    Token(String),
    /// `sf-binary` (not decoded).
    Bytes,
    /// `sf-boolean`.
    Boolean(bool),
    /// `sf-date` (`@` and an integer).
    Date(i64),
}

/// A list member: an item with parameters, or an inner list (kept as `None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Member {
    /// The bare item, or `None` for an inner list.
    pub(super) item: Option<Bare>,
    /// The member's parameters, in order; look them up with [`Member::param`].
    pub(super) params: Vec<(String, Bare)>,
}

impl Member {
    /// The value of parameter `key` (the last one wins, as RFC 9651 §4.2.3.2 says).
    pub(super) fn param(&self, key: &str) -> Option<&Bare> {
        self.params
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }

    /// The item as text, when it is a string or a token.
    pub(super) fn name(&self) -> Option<&str> {
        match &self.item {
            Some(Bare::String(s) | Bare::Token(s)) => Some(s),
            _ => None,
        }
    }
}

struct Parser<'a> {
    input: &'a [u8],
    pos: usize,
}

/// Parses a whole field value as an `sf-list`. `None` on any syntax error.
pub(super) fn parse_list(input: &str) -> Option<Vec<Member>> {
    let mut p = Parser {
        input: input.as_bytes(),
        pos: 0,
    };
    p.skip_sp();
    let mut members = Vec::new();
    while !p.done() {
        members.push(p.member()?);
        p.skip_ows();
        if p.done() {
            break;
        }
        p.expect(b',')?;
        p.skip_ows();
        if p.done() {
            return None; // trailing comma
        }
    }
    Some(members)
}

impl Parser<'_> {
    fn done(&self) -> bool {
        self.pos >= self.input.len()
    }

    fn peek(&self) -> Option<u8> {
        self.input.get(self.pos).copied()
    }

    fn bump(&mut self) -> Option<u8> {
        let c = self.peek()?;
        self.pos += 1;
        Some(c)
    }

    fn expect(&mut self, c: u8) -> Option<()> {
        (self.bump()? == c).then_some(())
    }

    fn skip_sp(&mut self) {
        while self.peek() == Some(b' ') {
            self.pos += 1;
        }
    }

    fn skip_ows(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.pos += 1;
        }
    }

    fn member(&mut self) -> Option<Member> {
        if self.peek() == Some(b'(') {
            self.inner_list()?;
            let params = self.params()?;
            return Some(Member { item: None, params });
        }
        let item = self.bare()?;
        let params = self.params()?;
        Some(Member {
            item: Some(item),
            params,
        })
    }

    fn inner_list(&mut self) -> Option<()> {
        self.expect(b'(')?;
        loop {
            self.skip_sp();
            if self.peek() == Some(b')') {
                self.pos += 1;
                return Some(());
            }
            self.bare()?;
            self.params()?;
            if !matches!(self.peek(), Some(b' ' | b')')) {
                return None;
            }
        }
    }

    fn params(&mut self) -> Option<Vec<(String, Bare)>> {
        let mut params = Vec::new();
        while self.peek() == Some(b';') {
            self.pos += 1;
            self.skip_sp();
            let key = self.key()?;
            let value = if self.peek() == Some(b'=') {
                self.pos += 1;
                self.bare()?
            } else {
                Bare::Boolean(true)
            };
            params.push((key, value));
        }
        Some(params)
    }

    fn key(&mut self) -> Option<String> {
        let start = self.pos;
        match self.peek()? {
            b'a'..=b'z' | b'*' => self.pos += 1,
            _ => return None,
        }
        while matches!(
            self.peek(),
            Some(b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' | b'*')
        ) {
            self.pos += 1;
        }
        Some(String::from_utf8_lossy(&self.input[start..self.pos]).into_owned())
    }

    fn bare(&mut self) -> Option<Bare> {
        match self.peek()? {
            b'-' | b'0'..=b'9' => self.number(),
            b'"' => self.string(),
            b'*' | b'a'..=b'z' | b'A'..=b'Z' => Some(self.token()),
            b':' => self.bytes(),
            b'?' => self.boolean(),
            b'@' => {
                self.pos += 1;
                match self.number()? {
                    Bare::Integer(n) => Some(Bare::Date(n)),
                    _ => None,
                }
            }
            _ => None,
        }
    }

    fn number(&mut self) -> Option<Bare> {
        let negative = self.peek() == Some(b'-');
        if negative {
            self.pos += 1;
        }
        let start = self.pos;
        let mut dot: Option<usize> = None;
        loop {
            match self.peek() {
                Some(b'0'..=b'9') => self.pos += 1,
                Some(b'.') if dot.is_none() => {
                    dot = Some(self.pos);
                    self.pos += 1;
                }
                _ => break,
            }
        }
        let text = &self.input[start..self.pos];
        match dot {
            None => {
                if text.is_empty() || text.len() > 15 {
                    return None;
                }
                let value = text
                    .iter()
                    .fold(0i64, |acc, b| acc * 10 + i64::from(b - b'0'));
                Some(Bare::Integer(if negative { -value } else { value }))
            }
            Some(at) => {
                let int = at - start;
                let frac = self.pos - at - 1;
                ((1..=12).contains(&int) && (1..=3).contains(&frac)).then_some(Bare::Decimal)
            }
        }
    }

    fn string(&mut self) -> Option<Bare> {
        self.expect(b'"')?;
        let mut out = String::new();
        loop {
            match self.bump()? {
                b'"' => return Some(Bare::String(out)),
                b'\\' => match self.bump()? {
                    c @ (b'"' | b'\\') => out.push(char::from(c)),
                    _ => return None,
                },
                c @ 0x20..=0x7e => out.push(char::from(c)),
                _ => return None,
            }
        }
    }

    fn token(&mut self) -> Bare {
        let start = self.pos;
        self.pos += 1;
        while let Some(c) = self.peek() {
            let tchar = c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(&c);
            if !tchar {
                break;
            }
            self.pos += 1;
        }
        Bare::Token(String::from_utf8_lossy(&self.input[start..self.pos]).into_owned())
    }

    fn bytes(&mut self) -> Option<Bare> {
        self.expect(b':')?;
        loop {
            match self.bump()? {
                b':' => return Some(Bare::Bytes),
                c if c.is_ascii_alphanumeric() || matches!(c, b'+' | b'/' | b'=') => {}
                _ => return None,
            }
        }
    }

    fn boolean(&mut self) -> Option<Bare> {
        self.expect(b'?')?;
        match self.bump()? {
            b'0' => Some(Bare::Boolean(false)),
            b'1' => Some(Bare::Boolean(true)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(bare: Bare, params: &[(&str, Bare)]) -> Member {
        Member {
            item: Some(bare),
            params: params
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        }
    }

    fn s(v: &str) -> Bare {
        Bare::String(v.into())
    }

    #[test]
    fn lists() {
        use Bare::*;
        let cases: Vec<(&str, Option<Vec<Member>>)> = vec![
            (
                r#""default";q=100;w=60"#,
                Some(vec![item(
                    s("default"),
                    &[("q", Integer(100)), ("w", Integer(60))],
                )]),
            ),
            (
                r#"  "a";r=1, "b" ;x"#,
                None, // SP before ';' is not allowed
            ),
            (
                "burst;q=10,\t\"day\";q=1000;pk=:AQID:",
                Some(vec![
                    item(Token("burst".into()), &[("q", Integer(10))]),
                    item(s("day"), &[("q", Integer(1000)), ("pk", Bytes)]),
                ]),
            ),
            (
                r#""a\"b\\c";flag;n=-5;d=1.5;b=?0;t=@17"#,
                Some(vec![item(
                    s("a\"b\\c"),
                    &[
                        ("flag", Boolean(true)),
                        ("n", Integer(-5)),
                        ("d", Decimal),
                        ("b", Boolean(false)),
                        ("t", Date(17)),
                    ],
                )]),
            ),
            (
                r#"("x" "y");q=1, "z""#,
                Some(vec![
                    Member {
                        item: None,
                        params: vec![("q".into(), Integer(1))],
                    },
                    item(s("z"), &[]),
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
            ("%\"x\"", None),
            ("?2", None),
            (":not base64!:", None),
            ("(\"x\"", None),
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
}
