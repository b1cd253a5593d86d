//! Response bodies: the permit that rides on a body until it ends, and the short, bounded
//! read of an error body whose code may change the retry decision.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use reqwest::ResponseBuilderExt;

use crate::charge::{Charge, UsageFromBody};
use crate::engine::Lease;
use crate::headers::{parse_error_body, ErrorBody, MAX_ERROR_BODY};

/// Wraps a body and holds the in-flight permit for as long as the server may still count the
/// request: the permit is dropped when the body reaches its end, or when the body is dropped.
///
/// A body that fails (a client timeout, a broken chunk) keeps the permit until it is dropped:
/// the failed body still holds the connection, which the server counts as a request in
/// progress until the client closes it, and it closes it only when the response body goes.
#[derive(Debug)]
struct PermitBody {
    inner: reqwest::Body,
    permit: Option<Lease>,
}

impl Body for PermitBody {
    type Data = Bytes;
    type Error = reqwest::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, reqwest::Error>>> {
        let frame = ready!(Pin::new(&mut self.inner).poll_frame(cx));
        // The end releases at once; an error keeps the permit until the body is dropped.
        let ended = match &frame {
            None => true,
            Some(Ok(_)) => self.inner.is_end_stream(),
            Some(Err(_)) => false,
        };
        if ended {
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

/// Splits `response` into parts and body, keeping its URL (which reqwest keeps outside the parts).
fn split(response: reqwest::Response) -> (http::response::Parts, reqwest::Body, reqwest::Url) {
    let url = response.url().clone();
    let (parts, body) = http::Response::<reqwest::Body>::from(response).into_parts();
    (parts, body, url)
}

/// Puts a response back together: status, version, headers and extensions from `parts`, and
/// the URL through reqwest's builder extension.
fn join(
    mut parts: http::response::Parts,
    body: reqwest::Body,
    url: reqwest::Url,
) -> reqwest::Response {
    if let Ok(with_url) = http::Response::builder().url(url).body(()) {
        parts.extensions.extend(with_url.into_parts().0.extensions);
    }
    reqwest::Response::from(http::Response::from_parts(parts, body))
}

/// Moves `permit` into `response`'s body, keeping status, version, headers, extensions, URL and
/// content length as they were. A body already at its end releases the permit now.
pub(crate) fn hold_until_body_ends(
    response: reqwest::Response,
    permit: Option<Lease>,
) -> reqwest::Response {
    let (parts, inner, url) = split(response);
    let permit = permit.filter(|_| !inner.is_end_stream());
    join(
        parts,
        reqwest::Body::wrap(PermitBody { inner, permit }),
        url,
    )
}

/// Statuses whose body may hold an error code that changes the decision (a used-up quota,
/// a refused entitlement, an idempotency conflict).
fn may_carry_code(status: http::StatusCode) -> bool {
    matches!(status.as_u16(), 403 | 409 | 429)
}

/// Whether [`read_error_body`] would read `response`'s body: a 403, 409 or 429 whose
/// `Content-Length` is at most [`MAX_ERROR_BODY`](crate::headers::MAX_ERROR_BODY), or that
/// has none (chunked, HTTP/2).
pub(crate) fn has_error_body_to_read(response: &reqwest::Response) -> bool {
    // No length (chunked, HTTP/2): read too, up to the same bound.
    let small = response
        .content_length()
        .is_none_or(|n| n <= MAX_ERROR_BODY as u64);
    may_carry_code(response.status()) && small
}

/// How long the throttle waits for a small error body before deciding on the headers alone.
pub(crate) const ERROR_BODY_WAIT: Duration = Duration::from_secs(2);

/// Reads the body of an error answer that may carry a decisive code (403, 409, 429) when its
/// `Content-Length` is at most [`MAX_ERROR_BODY`](crate::headers::MAX_ERROR_BODY), for at most
/// [`ERROR_BODY_WAIT`] and never past `deadline`, and returns the response rebuilt around the
/// same bytes with the parsed body. A body that breaks off or stalls is not parsed: the response keeps the bytes read so
/// far, then the rest of the stream (or its error), so the caller sees what it would have seen
/// without the throttle. Other responses pass unread.
pub(crate) async fn read_error_body(
    response: reqwest::Response,
    deadline: Option<tokio::time::Instant>,
) -> (reqwest::Response, Option<ErrorBody>) {
    if !has_error_body_to_read(&response) {
        return (response, None);
    }
    let (parts, mut rest, url) = split(response);
    let total = rest.size_hint();
    let mut read = BytesMut::new();
    let until = tokio::time::Instant::now() + ERROR_BODY_WAIT;
    let until = deadline.map_or(until, |d| d.min(until));
    let outcome = tokio::time::timeout_at(until, async {
        loop {
            match std::future::poll_fn(|cx| Pin::new(&mut rest).poll_frame(cx)).await {
                None => return Ok(Read::Whole),
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        read.extend_from_slice(data);
                    }
                    // A body without a length may be long: past the bound it is no small
                    // error body, and the rest is left to the caller.
                    if read.len() > MAX_ERROR_BODY {
                        return Ok(Read::TooLong);
                    }
                }
                Some(Err(e)) => return Err(e),
            }
        }
    })
    .await;
    let read = read.freeze();
    let (parsed, body) = match outcome {
        Ok(Ok(Read::Whole)) => (parse_error_body(&read), reqwest::Body::from(read)),
        Ok(Ok(Read::TooLong)) | Err(_) => (None, Prefixed::body(read, Ok(rest), total)),
        Ok(Err(error)) => (None, Prefixed::body(read, Err(error), total)),
    };
    (join(parts, body, url), parsed)
}

/// How far an error body was read.
enum Read {
    /// To its end.
    Whole,
    /// Past [`MAX_ERROR_BODY`] bytes, the rest unread.
    TooLong,
}

/// The bytes already read from a body, then what is left of it: the rest of the stream, or
/// the error that cut it off.
#[derive(Debug)]
struct Prefixed {
    read: Option<Bytes>,
    rest: Option<Result<reqwest::Body, reqwest::Error>>,
    /// The size hint of the whole body before any of it was read (from `Content-Length`), so
    /// that `content_length()` stays what the caller would have seen without the throttle.
    total: SizeHint,
}

impl Prefixed {
    fn body(
        read: Bytes,
        rest: Result<reqwest::Body, reqwest::Error>,
        total: SizeHint,
    ) -> reqwest::Body {
        reqwest::Body::wrap(Prefixed {
            read: (!read.is_empty()).then_some(read),
            rest: Some(rest),
            total,
        })
    }
}

impl Body for Prefixed {
    type Data = Bytes;
    type Error = reqwest::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, reqwest::Error>>> {
        if let Some(read) = self.read.take() {
            return Poll::Ready(Some(Ok(Frame::data(read))));
        }
        match self.rest.as_mut() {
            Some(Ok(rest)) => Pin::new(rest).poll_frame(cx),
            Some(Err(_)) => Poll::Ready(self.rest.take().and_then(Result::err).map(Err)),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.read.is_none() && matches!(&self.rest, Some(Ok(rest)) if rest.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        match (&self.read, &self.rest) {
            (Some(_), _) => self.total,
            (None, Some(Ok(rest))) => rest.size_hint(),
            (None, _) => SizeHint::default(),
        }
    }
}

/// Passes a body through unchanged while keeping a copy of its first bytes (up to the hook's
/// bound); when the body reaches its end, the hook reads the true cost from the copy and the
/// charge is settled with it. A body dropped, failed or longer than the bound settles nothing
/// (the estimate stands).
struct UsageBody {
    inner: reqwest::Body,
    /// The bytes so far; `None` once past the bound.
    seen: Option<BytesMut>,
    hook: UsageFromBody,
    /// Until settled.
    charge: Option<Charge>,
}

impl Body for UsageBody {
    type Data = Bytes;
    type Error = reqwest::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, reqwest::Error>>> {
        let frame = ready!(Pin::new(&mut self.inner).poll_frame(cx));
        let this = &mut *self;
        let ended = match &frame {
            None => true,
            Some(Ok(frame)) => {
                if let (Some(seen), Some(data)) = (this.seen.as_mut(), frame.data_ref()) {
                    if seen.len() + data.len() > this.hook.max_bytes() {
                        this.seen = None;
                    } else {
                        seen.extend_from_slice(data);
                    }
                }
                this.inner.is_end_stream()
            }
            Some(Err(_)) => {
                this.charge = None;
                false
            }
        };
        if ended {
            if let (Some(charge), Some(seen)) = (this.charge.take(), this.seen.take()) {
                if let Some(actual) = this.hook.read(&seen) {
                    settle_soon(charge, actual);
                }
            }
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

/// Settles `charge` with `actual` from inside a body's poll: at once when the store answers at
/// once (the in-memory store does), else on a spawned task of the current runtime.
fn settle_soon(charge: Charge, actual: u32) {
    let mut settle = Box::pin(async move {
        if let Err(e) = charge.settle(actual).await {
            tracing::warn!(error = %e, "charge not settled from the body");
        }
    });
    let mut cx = Context::from_waker(std::task::Waker::noop());
    if settle.as_mut().poll(&mut cx).is_pending() {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(settle);
        }
    }
}

/// Wraps `response`'s body so that `charge` is settled with what `hook` reads from the whole
/// body once the caller has read it to its end; the bytes, status, headers, extensions, URL
/// and length are kept as they were.
pub(crate) fn settle_at_body_end(
    response: reqwest::Response,
    charge: Charge,
    hook: UsageFromBody,
) -> reqwest::Response {
    let (parts, inner, url) = split(response);
    let body = UsageBody {
        inner,
        seen: Some(BytesMut::new()),
        hook,
        charge: Some(charge),
    };
    join(parts, reqwest::Body::wrap(body), url)
}
