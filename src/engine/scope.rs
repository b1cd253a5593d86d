//! [`Scope`]: what a server counts a request against, and how a request finds its scope.

use std::fmt;
use std::hash::Hasher;
use std::sync::Arc;

use http::{HeaderName, HeaderValue};
use reqwest::Request;

use crate::store::ScopeId;

type KeyFn = dyn Fn(&Request) -> Option<String> + Send + Sync;

/// What the server counts a request against. Every scope has its own quotas (the configured
/// limits apply to each scope), in-flight cap, cooldown and hints: a `429` from one scope
/// never slows another. Set with [`ThrottleBuilder::scope`](crate::ThrottleBuilder::scope);
/// the default is [`Scope::per_authority`].
///
/// Scopes are told apart by a 128-bit keyed hash of their key (two keys share a scope with
/// probability about n² / 2¹²⁹ for n keys). Idle scopes are forgotten after a while and their
/// number is capped: see [`ThrottleBuilder::max_scopes`](crate::ThrottleBuilder::max_scopes).
#[derive(Clone)]
pub struct Scope {
    by: By,
}

#[derive(Clone)]
enum By {
    Global,
    Authority,
    Header(HeaderName),
    Custom(Arc<KeyFn>),
}

impl Scope {
    /// One scope for every request: the limits apply to everything the client sends.
    pub fn global() -> Self {
        Self { by: By::Global }
    }

    /// One scope per authority: scheme, host and port (the scheme's default port when the URL
    /// gives none). The default. Redirects are counted against the scope of the request sent.
    pub fn per_authority() -> Self {
        Self { by: By::Authority }
    }

    /// One scope per value of header `name` (e.g. `Authorization`, for a limit per API key).
    /// Requests without the header share one scope. The value is hashed at once and never
    /// stored or logged: a scope's label shows the header's name and 16 hex digits of the hash.
    pub fn per_header(name: HeaderName) -> Self {
        Self {
            by: By::Header(name),
        }
    }

    /// One scope per key that `key` returns for a request; requests for which it returns
    /// `None` share the unkeyed scope (the one [`Throttle::acquire`](crate::Throttle::acquire)
    /// uses). The key is hashed for lookups and kept as the scope's label in
    /// [`ScopeStats`](crate::ScopeStats): hash it first if it is a secret.
    pub fn from_fn(key: impl Fn(&Request) -> Option<String> + Send + Sync + 'static) -> Self {
        Self {
            by: By::Custom(Arc::new(key)),
        }
    }

    pub(crate) fn is_global(&self) -> bool {
        matches!(self.by, By::Global)
    }
}

impl Default for Scope {
    fn default() -> Self {
        Self::per_authority()
    }
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.by {
            By::Global => f.write_str("Scope::global()"),
            By::Authority => f.write_str("Scope::per_authority()"),
            By::Header(name) => write!(f, "Scope::per_header({name})"),
            By::Custom(_) => f.write_str("Scope::from_fn(..)"),
        }
    }
}

/// The key of one request's scope, borrowed from the request where it can be. Its `Debug`
/// never shows a header value.
pub(crate) enum Key<'r> {
    /// The unkeyed scope.
    Unkeyed,
    Authority {
        scheme: &'r str,
        host: &'r str,
        port: u16,
    },
    Header {
        name: &'r HeaderName,
        value: Option<&'r HeaderValue>,
    },
    Custom(String),
}

impl fmt::Debug for Key<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Key::Unkeyed => f.write_str("Unkeyed"),
            Key::Authority { scheme, host, port } => {
                write!(f, "Authority({scheme}://{host}:{port})")
            }
            Key::Header { name, value } => {
                let shown = if value.is_some() {
                    "(hashed)"
                } else {
                    "(none)"
                };
                write!(f, "Header({name}={shown})")
            }
            Key::Custom(key) => write!(f, "Custom({key:?})"),
        }
    }
}

impl Key<'_> {
    /// The scope's label, as shown in [`ScopeStats`](crate::ScopeStats); never a header value.
    pub(crate) fn label(&self, id: ScopeId) -> String {
        match self {
            Key::Unkeyed => "(unkeyed)".to_owned(),
            Key::Authority { scheme, host, port } => format!("{scheme}://{host}:{port}"),
            Key::Header { name, value: None } => format!("{name}=(none)"),
            Key::Header { name, .. } => format!("{name}=#{:016x}", id.as_u128() >> 64),
            Key::Custom(key) => key.clone(),
        }
    }

    /// Feeds the key to `h` in an encoding of its own (a tag byte, then each part as its
    /// length in 8 little-endian bytes and its bytes), so that the id is the same on every
    /// machine and Rust version: a shared store's processes name a scope alike.
    fn feed(&self, h: &mut impl Hasher) {
        fn part(h: &mut impl Hasher, bytes: &[u8]) {
            h.write(&(bytes.len() as u64).to_le_bytes());
            h.write(bytes);
        }
        match self {
            Key::Unkeyed => h.write(&[0]),
            Key::Authority { scheme, host, port } => {
                h.write(&[1]);
                part(h, scheme.as_bytes());
                part(h, host.as_bytes());
                part(h, &port.to_le_bytes());
            }
            Key::Header { name, value } => {
                h.write(&[2]);
                part(h, name.as_str().as_bytes());
                match value {
                    Some(v) => part(h, v.as_bytes()),
                    None => h.write(&[0xff]),
                }
            }
            Key::Custom(key) => {
                h.write(&[3]);
                part(h, key.as_bytes());
            }
        }
    }
}

/// Finds a request's scope key and hashes it to a [`ScopeId`], allocating nothing for the
/// authority and header scopes.
pub(crate) struct Resolver {
    by: By,
    /// The key of the 128-bit SipHash-1-3 that makes ids.
    hash_key: [u64; 2],
}

impl Resolver {
    /// A resolver hashing under `hash_key` (a shared store's, so that every process names a
    /// scope alike), or under a fresh random key.
    pub(crate) fn new(scope: Scope, hash_key: Option<[u64; 2]>) -> Self {
        Self {
            by: scope.by,
            hash_key: hash_key.unwrap_or_else(rand::random),
        }
    }

    /// The key of `req`'s scope.
    pub(crate) fn key<'r>(&'r self, req: &'r Request) -> Key<'r> {
        match &self.by {
            By::Global => Key::Unkeyed,
            By::Authority => {
                let url = req.url();
                Key::Authority {
                    scheme: url.scheme(),
                    host: url.host_str().unwrap_or(""),
                    port: url.port_or_known_default().unwrap_or(0),
                }
            }
            By::Header(name) => Key::Header {
                name,
                value: req.headers().get(name),
            },
            By::Custom(f) => f(req).map_or(Key::Unkeyed, Key::Custom),
        }
    }

    /// The id of scope `key`.
    pub(crate) fn id(&self, key: &Key<'_>) -> ScopeId {
        let [k0, k1] = self.hash_key;
        use siphasher::sip128::Hasher128;
        let mut h = siphasher::sip128::SipHasher13::new_with_keys(k0, k1);
        key.feed(&mut h);
        ScopeId::from_u128(h.finish128().as_u128())
    }
}

impl fmt::Debug for Resolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Resolver")
            .field(
                "by",
                &Scope {
                    by: self.by.clone(),
                },
            )
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(url: &str) -> Request {
        Request::new(http::Method::GET, url.parse().unwrap())
    }

    fn with_header(url: &str, name: &str, value: &str) -> Request {
        let mut req = get(url);
        req.headers_mut().insert(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
        req
    }

    #[test]
    fn authority_is_scheme_host_and_port() {
        let r = Resolver::new(Scope::per_authority(), None);
        let id = |url| r.id(&r.key(&get(url)));
        assert_eq!(id("http://a.test/x"), id("http://a.test:80/y?q=1"));
        assert_ne!(id("http://a.test/"), id("https://a.test/"));
        assert_ne!(id("http://a.test/"), id("http://b.test/"));
        assert_ne!(id("http://a.test:8080/"), id("http://a.test/"));
        let req = get("https://a.test/v1");
        let key = r.key(&req);
        assert_eq!(key.label(r.id(&key)), "https://a.test:443");
    }

    #[test]
    fn header_scopes_hash_the_value_and_never_show_it() {
        let r = Resolver::new(Scope::per_header(http::header::AUTHORIZATION), None);
        let secret = "Bearer sk-very-secret";
        let a = with_header("http://a.test/", "authorization", secret);
        let b = with_header("http://b.test/", "authorization", secret);
        let c = with_header("http://a.test/", "authorization", "Bearer other");
        let none = get("http://a.test/");
        let (ka, kb, kc, kn) = (r.key(&a), r.key(&b), r.key(&c), r.key(&none));
        assert_eq!(r.id(&ka), r.id(&kb), "the host does not matter");
        assert_ne!(r.id(&ka), r.id(&kc));
        assert_ne!(r.id(&ka), r.id(&kn));
        let label = ka.label(r.id(&ka));
        assert!(label.starts_with("authorization=#"), "{label}");
        assert!(!label.contains("secret"), "{label}");
        assert_eq!(kn.label(r.id(&kn)), "authorization=(none)");
        let debug = format!("{ka:?} {r:?}");
        assert!(!debug.contains("secret"), "{debug}");
    }

    #[test]
    fn global_and_custom_scopes() {
        let g = Resolver::new(Scope::global(), None);
        assert_eq!(
            g.id(&g.key(&get("http://a.test/"))),
            g.id(&g.key(&get("http://b.test/")))
        );
        let c = Resolver::new(
            Scope::from_fn(|req| req.url().path_segments()?.next().map(str::to_owned)),
            None,
        );
        let (x, y) = (
            get("http://a.test/tenant1/a"),
            get("http://b.test/tenant1/b"),
        );
        assert_eq!(c.id(&c.key(&x)), c.id(&c.key(&y)));
        assert_eq!(c.key(&x).label(c.id(&c.key(&x))), "tenant1");
        assert!(matches!(c.key(&get("http://a.test")), Key::Custom(k) if k.is_empty()));
    }

    #[test]
    fn ids_differ_between_throttles() {
        let (r1, r2) = (
            Resolver::new(Scope::per_authority(), None),
            Resolver::new(Scope::per_authority(), None),
        );
        let req = get("http://a.test/");
        assert_ne!(r1.id(&r1.key(&req)), r2.id(&r2.key(&req)));
    }

    #[test]
    fn ids_under_one_hash_key_agree_and_are_stable() {
        let key = Some([7, 11]);
        let (r1, r2) = (
            Resolver::new(Scope::per_authority(), key),
            Resolver::new(Scope::per_authority(), key),
        );
        let req = get("http://a.test/");
        let id = r1.id(&r1.key(&req));
        assert_eq!(id, r2.id(&r2.key(&req)));
        // The encoding is the crate's own: this value holds on every machine and Rust
        // version, so processes of a fleet built apart still name the scope alike.
        assert_eq!(format!("{:032x}", id.as_u128()), STABLE_ID);
    }
    const STABLE_ID: &str = "2ca1022470b6db1441468ad5123a9f62";
}
