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
