//! Request limits, checked on the wire before a handler sees the request.
//!
//! Every field of every request message has a maximum: the one its contract
//! declares with the `(muster.common.v1.limits)` option, or the default of
//! its kind (the table is [`muster_proto::limits`]). [`LimitsLayer`] reads
//! each request message's protobuf encoding as it arrives, without decoding
//! it into types or copying it, and refuses:
//!
//! - a message longer than the server's largest message with
//!   RESOURCE_EXHAUSTED, before buffering it;
//! - a field over its limit, or a string that is not UTF-8, with
//!   INVALID_ARGUMENT naming the field (`agent.custom_prompt`,
//!   `files[3].content`) and the limit;
//! - bytes that are not a protobuf encoding with INVALID_ARGUMENT.
//!
//! The refusal reaches a unary handler's caller as the call's status, and a
//! streaming handler as an error on its request stream.
//!
//! The check of a message against its limits, which clients run too before
//! sending, is [`muster_client::limits`] ([`check`], [`check_request`],
//! re-exported here).

use std::{
    pin::Pin,
    task::{Context, Poll},
};

use bytes::{Buf, Bytes, BytesMut};
use http_body::Frame;
use muster_client::limits::METHOD_INPUTS;
pub use muster_client::limits::{check, check_request};
use tonic::{Status, body::Body};

/// The tower layer that checks every muster request's messages.
#[derive(Debug, Clone, Copy)]
pub struct LimitsLayer {
    max_message_bytes: usize,
}

impl LimitsLayer {
    /// Refuses messages longer than `max_message_bytes`, and fields over their limits.
    pub fn new(max_message_bytes: usize) -> Self {
        Self { max_message_bytes }
    }
}

impl<S> tower::Layer<S> for LimitsLayer {
    type Service = Limits<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Limits { inner, max_message_bytes: self.max_message_bytes }
    }
}

/// The service of [`LimitsLayer`].
#[derive(Debug, Clone)]
pub struct Limits<S> {
    inner: S,
    max_message_bytes: usize,
}

impl<S> tower::Service<http::Request<Body>> for Limits<S>
where
    S: tower::Service<http::Request<Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, context: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(context)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        match METHOD_INPUTS.get(request.uri().path()) {
            Some(&input) => {
                let max_message_bytes = self.max_message_bytes;
                self.inner.call(request.map(|body| {
                    Body::new(CheckedBody { inner: body, input, max_message_bytes, buffer: BytesMut::new() })
                }))
            }
            // Health, reflection and `/metrics` are not muster's to limit.
            None => self.inner.call(request),
        }
    }
}

/// A request body that hands on each gRPC message once it is whole and
/// within its limits.
struct CheckedBody {
    inner: Body,
    input: usize,
    max_message_bytes: usize,
    /// Bytes of the message being received.
    buffer: BytesMut,
}

/// The gRPC message header: a compression flag and a 4-byte length.
const HEADER_BYTES: usize = 5;

impl CheckedBody {
    /// The next whole message of the buffer, checked, if one is there.
    fn next_message(&mut self) -> Option<Result<Bytes, Status>> {
        if self.buffer.len() < HEADER_BYTES {
            return None;
        }
        let compressed = self.buffer[0] != 0;
        let length = u32::from_be_bytes([self.buffer[1], self.buffer[2], self.buffer[3], self.buffer[4]]) as usize;
        if length > self.max_message_bytes {
            return Some(Err(crate::status::quota_exhausted(
                &format!("the request message is {length} bytes; the limit is {} bytes", self.max_message_bytes),
                "request",
                &format!("at most {} bytes per message", self.max_message_bytes),
                None,
            )));
        }
        if self.buffer.len() < HEADER_BYTES + length {
            self.buffer.reserve(HEADER_BYTES + length - self.buffer.len());
            return None;
        }
        let message = self.buffer.split_to(HEADER_BYTES + length).freeze();
        // Compressed messages are refused by the server (muster accepts none).
        if !compressed && let Err(status) = check(self.input, &message[HEADER_BYTES..]) {
            return Some(Err(status));
        }
        Some(Ok(message))
    }
}

impl http_body::Body for CheckedBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        loop {
            if let Some(message) = self.next_message() {
                return Poll::Ready(Some(message.map(Frame::data)));
            }
            match std::task::ready!(Pin::new(&mut self.inner).poll_frame(context)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(mut data) => {
                        let chunk = data.copy_to_bytes(data.remaining());
                        self.buffer.extend_from_slice(&chunk);
                    }
                    Err(trailers) => return Poll::Ready(Some(Ok(trailers))),
                },
                Some(Err(error)) => return Poll::Ready(Some(Err(Status::from_error(error.into())))),
                // A partial message at the end is the decoder's to report.
                None if !self.buffer.is_empty() => {
                    let rest = self.buffer.split().freeze();
                    return Poll::Ready(Some(Ok(Frame::data(rest))));
                }
                None => return Poll::Ready(None),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.buffer.is_empty() && self.inner.is_end_stream()
    }
}

#[cfg(test)]
mod tests {
    use muster_proto::limits::{Kind, MESSAGES, METHODS};

    #[test]
    fn every_method_of_every_service_has_its_request_limits() {
        assert!(METHODS.len() >= 60, "{} methods", METHODS.len());
        for method in METHODS {
            assert!(MESSAGES[method.input].name.ends_with("Request"), "{}", method.path);
        }
        // Every string field has a limit, and identifiers the short one.
        let agent = MESSAGES.iter().find(|message| message.name == "muster.roster.v1.Agent").unwrap();
        let limit = |name: &str| agent.fields.iter().find(|field| field.name == name).unwrap().max_bytes;
        assert_eq!((limit("id"), limit("name"), limit("custom_prompt")), (128, 1024, 64 * 1024));
    }

    /// `docs/deploy.md` lists every field whose limit is not its kind's default.
    #[test]
    fn the_deployment_guide_lists_every_field_limit_above_the_default() {
        let guide = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/deploy.md")).unwrap();
        let size = |bytes: u32| match bytes {
            bytes if bytes % (1 << 20) == 0 => format!("{} MiB", bytes >> 20),
            bytes => format!("{} KiB", bytes >> 10),
        };
        let mut listed = 0;
        // The insides of JSON values have no limits of their own.
        for message in MESSAGES.iter().filter(|message| !message.name.starts_with("google.protobuf.")) {
            for field in message.fields {
                let mut limits = Vec::new();
                if matches!(field.kind, Kind::Text | Kind::Bytes | Kind::Json(_))
                    && ![128, 1024].contains(&field.max_bytes)
                {
                    limits.push(size(field.max_bytes));
                }
                if ![1, 1000].contains(&field.max_items) {
                    let items = field.max_items.to_string();
                    let grouped = match items.len() {
                        4..=6 => format!("{},{}", &items[..items.len() - 3], &items[items.len() - 3..]),
                        _ => items,
                    };
                    limits.push(format!("{grouped} elements"));
                }
                if limits.is_empty() {
                    continue;
                }
                let row = format!("| `{}.{}` | {} |", message.name, field.name, limits.join(", "));
                assert!(guide.contains(&row), "docs/deploy.md lacks the row {row}");
                listed += 1;
            }
        }
        assert!(listed > 40, "{listed} fields");
    }
}
