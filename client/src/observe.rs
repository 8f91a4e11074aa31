//! How a process watches the gRPC calls it makes and answers: an
//! [`Observer`] installed once is told when each call a [`crate::balance`]
//! channel makes starts, and how it ended (the code of its trailers, or of
//! a trailers-only answer; `Cancelled` when the caller dropped it first;
//! `Unavailable` when it could not be sent). The services' runtime records
//! them as the standard gRPC client metrics, and measures the calls it
//! answers with the same [`Reported`] body.

use std::{
    pin::Pin,
    sync::OnceLock,
    task::{Context, Poll},
};

use tonic::{Code, body::Body};

/// Told when a call starts.
pub trait Observer: Send + Sync + 'static {
    /// A call of the method at `path` (`/package.Service/Method`) starts;
    /// what is returned hears how it ended.
    fn started(&self, path: &str) -> Box<dyn Ended>;
}

/// Told once how a call ended.
pub trait Ended: Send + 'static {
    /// The call ended with `code`.
    fn ended(self: Box<Self>, code: Code);
}

static OBSERVER: OnceLock<Box<dyn Observer>> = OnceLock::new();

/// Installs the process's observer of the calls its clients make; `false`
/// when one was installed already (the first stays).
pub fn install(observer: impl Observer) -> bool {
    OBSERVER.set(Box::new(observer)).is_ok()
}

/// The installed observer told that a call of `path` starts.
pub(crate) fn started(path: &str) -> Option<Box<dyn Ended>> {
    OBSERVER.get().map(|observer| observer.started(path))
}

/// The `grpc-status` of a header map.
pub fn status_of(headers: &http::HeaderMap) -> Option<Code> {
    headers.get("grpc-status")?.to_str().ok()?.parse::<i32>().ok().map(Code::from)
}

/// An answer whose call is reported when it ends: at once when its headers
/// carry the status (a trailers-only answer), else when its body's trailers
/// come (or the body fails or ends without them); dropped before its end,
/// the call was cancelled.
pub fn reported(response: http::Response<Body>, ended: Box<dyn Ended>) -> http::Response<Body> {
    if let Some(code) = status_of(response.headers()) {
        ended.ended(code);
        return response;
    }
    response.map(|body| Body::new(Reported { body, ended: Some(ended) }))
}

/// A response body that reports its call's end once.
struct Reported {
    body: Body,
    ended: Option<Box<dyn Ended>>,
}

impl Reported {
    fn end(&mut self, code: Code) {
        if let Some(ended) = self.ended.take() {
            ended.ended(code);
        }
    }
}

impl Drop for Reported {
    fn drop(&mut self) {
        self.end(Code::Cancelled);
    }
}

impl http_body::Body for Reported {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(context);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(trailers) = frame.trailers_ref() {
                    let code = status_of(trailers).unwrap_or(Code::Ok);
                    self.end(code);
                }
            }
            Poll::Ready(Some(Err(status))) => {
                let code = status.code();
                self.end(code);
            }
            Poll::Ready(None) => self.end(Code::Ok),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
