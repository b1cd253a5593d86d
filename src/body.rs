//! A response body that holds the request's in-flight permit until it ends.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use reqwest::ResponseBuilderExt;

use crate::limiter::InFlight;

/// Wraps a body and drops the permit when the body ends, fails, or is dropped.
#[derive(Debug)]
struct PermitBody {
    inner: reqwest::Body,
    permit: Option<InFlight>,
}

impl Body for PermitBody {
    type Data = Bytes;
    type Error = reqwest::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, reqwest::Error>>> {
        let frame = ready!(Pin::new(&mut self.inner).poll_frame(cx));
        if !matches!(frame, Some(Ok(_))) || self.inner.is_end_stream() {
            self.permit = None;
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Moves `permit` into `response`'s body, keeping status, version, headers, extensions, URL and
/// content length as they were. A body already at its end releases the permit now.
pub(crate) fn hold_until_body_ends(
    response: reqwest::Response,
    permit: InFlight,
) -> reqwest::Response {
    let url = response.url().clone();
    let (mut parts, inner) = http::Response::<reqwest::Body>::from(response).into_parts();
    let permit = (!inner.is_end_stream()).then_some(permit);
    let body = reqwest::Body::wrap(PermitBody { inner, permit });
    // reqwest keeps the URL outside the parts; its builder extension puts it back.
    if let Ok(with_url) = http::Response::builder().url(url).body(()) {
        parts.extensions.extend(with_url.into_parts().0.extensions);
    }
    reqwest::Response::from(http::Response::from_parts(parts, body))
}

/// Statuses whose body may hold an error code that changes the decision (a used-up quota,
/// a refused entitlement, an idempotency conflict).
fn may_carry_code(status: http::StatusCode) -> bool {
    matches!(status.as_u16(), 403 | 409 | 429)
}

/// Reads the body of an error answer that may carry a decisive code, when its
/// `Content-Length` is at most [`MAX_ERROR_BODY`](crate::headers::MAX_ERROR_BODY), and returns
/// the parsed body with the response rebuilt around the same bytes (status, version, headers,
/// extensions and URL kept). Other responses, and bodies that fail to read, are passed on.
pub(crate) async fn read_error_body(
    response: reqwest::Response,
) -> Result<(reqwest::Response, Option<crate::headers::ErrorBody>), reqwest::Error> {
    let small = response
        .content_length()
        .is_some_and(|n| n <= crate::headers::MAX_ERROR_BODY as u64);
    if !may_carry_code(response.status()) || !small {
        return Ok((response, None));
    }
    let mut response = response;
    let url = response.url().clone();
    let status = response.status();
    let version = response.version();
    let headers = std::mem::take(response.headers_mut());
    let extensions = std::mem::take(response.extensions_mut());
    let bytes = response.bytes().await?;
    let parsed = crate::headers::parse_error_body(&bytes);
    let mut rebuilt = http::Response::new(reqwest::Body::from(bytes));
    *rebuilt.status_mut() = status;
    *rebuilt.version_mut() = version;
    *rebuilt.headers_mut() = headers;
    *rebuilt.extensions_mut() = extensions;
    if let Ok(with_url) = http::Response::builder().url(url).body(()) {
        rebuilt
            .extensions_mut()
            .extend(with_url.into_parts().0.extensions);
    }
    Ok((reqwest::Response::from(rebuilt), parsed))
}
