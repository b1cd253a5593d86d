//! Transport failures: which ones a later attempt may get past.

use reqwest_middleware::Error;

/// Whether a transport error may clear on a later attempt: a timeout, a connection refused,
/// reset or closed early, a body cut off. Not: a bad URL or scheme, a TLS backend that is not
/// compiled in (a connect error with no I/O cause), an invalid certificate or input (I/O errors
/// of kind `InvalidData`, `InvalidInput`, `Unsupported`, `PermissionDenied`), or an error of
/// another middleware.
pub(crate) fn is_transient(err: &Error) -> bool {
    let Error::Reqwest(e) = err else {
        return false;
    };
    if e.is_timeout() {
        return true;
    }
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            return !matches!(
                io.kind(),
                InvalidData | InvalidInput | Unsupported | PermissionDenied
            );
        }
        source = cause.source();
    }
    !e.is_connect() && (e.is_request() || e.is_body())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A loopback port with nothing listening on it (it was bound, then released).
    fn closed_port() -> u16 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        listener.local_addr().expect("its address").port()
    }

    /// The error of sending a GET to `url` with `client`.
    async fn get_error(client: &reqwest::Client, url: &str) -> reqwest::Error {
        match client.get(url).send().await {
            Ok(response) => panic!("{url} answered {}", response.status()),
            Err(e) => e,
        }
    }

    #[tokio::test]
    async fn a_refused_connection_is_transient() {
        let url = format!("http://127.0.0.1:{}/", closed_port());
        let e = get_error(&reqwest::Client::new(), &url).await;
        assert!(e.is_connect(), "{e:?}");
        let err = Error::Reqwest(e);
        assert!(is_transient(&err), "{err:?}");
    }

    #[tokio::test]
    async fn a_timeout_is_transient() {
        // A server that accepts connections and never answers.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        let silent = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                open.push(stream);
            }
        });
        let client = reqwest::Client::builder()
            .timeout(Duration::from_millis(50))
            .build()
            .unwrap();
        let e = get_error(&client, &url).await;
        silent.abort();
        assert!(e.is_timeout(), "{e:?}");
        let err = Error::Reqwest(e);
        assert!(is_transient(&err), "{err:?}");
    }

    #[tokio::test]
    async fn a_bad_url_or_scheme_is_not_transient() {
        let client = reqwest::Client::new();
        for url in ["http://[::1", "ftp://127.0.0.1/", "no scheme"] {
            let e = get_error(&client, url).await;
            assert!(e.is_builder(), "{url}: {e:?}");
            let err = Error::Reqwest(e);
            assert!(!is_transient(&err), "{url}: {err:?}");
        }
    }

    #[tokio::test]
    async fn https_without_a_tls_backend_is_not_transient() {
        // This crate compiles reqwest without TLS: the connector refuses https before any I/O.
        let url = format!("https://127.0.0.1:{}/", closed_port());
        let e = get_error(&reqwest::Client::new(), &url).await;
        assert!(e.is_connect(), "{e:?}");
        let err = Error::Reqwest(e);
        assert!(!is_transient(&err), "{err:?}");
    }

    #[test]
    fn an_error_of_another_middleware_is_not_transient() {
        // Even one made of an I/O error that would be transient from reqwest.
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        let err = Error::middleware(io);
        assert!(matches!(err, Error::Middleware(_)));
        assert!(!is_transient(&err), "{err:?}");
    }
}
