//! The benches' stand-in for the network: a last middleware that answers at once, so that
//! the throttle's own work per request is all that differs.

/// Answers every request at once with a 2-byte body.
pub struct Answer;

#[async_trait::async_trait]
impl reqwest_middleware::Middleware for Answer {
    async fn handle(
        &self,
        _req: reqwest::Request,
        _extensions: &mut http::Extensions,
        _next: reqwest_middleware::Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let response = http::Response::builder()
            .header("content-length", "2")
            .body(reqwest::Body::from("ok"))
            .expect("a valid response");
        Ok(reqwest::Response::from(response))
    }
}
