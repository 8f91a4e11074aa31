//! Stream messages as the servers send them, with parts already encoded.
//!
//! `muster.notifier.v1.SubscribeResponse` ([`SubscribeFrame`]): the
//! notification's event travels as its encoded bytes, shared by every
//! subscriber it goes to, instead of a `StepEvent` cloned and encoded once per
//! subscriber. The bytes on the wire are exactly those of the generated
//! [`SubscribeResponse`](crate::notifier::v1::SubscribeResponse); clients
//! decode them with the generated types. The execution service's worker
//! streams: [`WorkerFrame`], [`WorkerRequestFrame`] and [`RelayFrame`]; its events to the notifier:
//! [`IngestFrame`].

use std::sync::Arc;

mod ingest;
mod worker;

pub use ingest::{IngestFrame, event_id};
pub use worker::{RelayFrame, WorkerFrame, WorkerRequestFrame};

use prost::{
    DecodeError, Message,
    bytes::{Buf, BufMut, Bytes},
    encoding::{self, DecodeContext, WireType, encoded_len_varint, key_len},
};

/// One message of a Subscribe stream.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SubscribeFrame {
    /// What the message carries (`None` only for an empty message).
    pub message: Option<Frame>,
}

/// The `message` oneof of `SubscribeResponse`.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// Field 1, a `Notification`.
    Notification(NotificationFrame),
    /// Field 2: the subscriber fell behind after this cursor.
    LaggedAfterCursor(u64),
}

/// A `Notification` whose event is already encoded.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NotificationFrame {
    /// Field 1.
    pub cursor: u64,
    /// Field 2.
    pub agent_id: Arc<str>,
    /// Field 3, a `RecipientReason`.
    pub reason: i32,
    /// Field 4: the encoded `muster.common.v1.StepEvent` (always sent, as the
    /// generated type sends a present event).
    pub event: Bytes,
    /// Field 5.
    pub output_summary: Arc<str>,
    /// Field 6.
    pub created_at: Option<prost_types::Timestamp>,
}

fn string_len(tag: u32, value: &str) -> usize {
    if value.is_empty() { 0 } else { length_delimited_len(tag, value.len()) }
}

fn length_delimited_len(tag: u32, len: usize) -> usize {
    key_len(tag) + encoded_len_varint(len as u64) + len
}

fn encode_string(tag: u32, value: &str, buf: &mut impl BufMut) {
    if !value.is_empty() {
        encode_length_delimited(tag, value.as_bytes(), buf);
    }
}

fn encode_length_delimited(tag: u32, value: &[u8], buf: &mut impl BufMut) {
    encoding::encode_key(tag, WireType::LengthDelimited, buf);
    encoding::encode_varint(value.len() as u64, buf);
    buf.put_slice(value);
}

/// Merges an encoded message field: seen twice, a message field merges, so
/// its encodings concatenate.
fn merge_encoded(
    wire_type: WireType,
    value: &mut Bytes,
    buf: &mut impl Buf,
    ctx: DecodeContext,
) -> Result<(), DecodeError> {
    let mut more = Bytes::new();
    encoding::bytes::merge(wire_type, &mut more, buf, ctx)?;
    *value = if value.is_empty() { more } else { [&value[..], &more[..]].concat().into() };
    Ok(())
}

fn merge_string(
    wire_type: WireType,
    value: &mut Arc<str>,
    buf: &mut impl Buf,
    ctx: DecodeContext,
) -> Result<(), DecodeError> {
    let mut text = String::new();
    encoding::string::merge(wire_type, &mut text, buf, ctx)?;
    *value = Arc::from(text);
    Ok(())
}

impl Message for NotificationFrame {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        if self.cursor != 0 {
            encoding::uint64::encode(1, &self.cursor, buf);
        }
        encode_string(2, &self.agent_id, buf);
        if self.reason != 0 {
            encoding::int32::encode(3, &self.reason, buf);
        }
        encode_length_delimited(4, &self.event, buf);
        encode_string(5, &self.output_summary, buf);
        if let Some(created_at) = &self.created_at {
            encoding::message::encode(6, created_at, buf);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        match tag {
            1 => encoding::uint64::merge(wire_type, &mut self.cursor, buf, ctx),
            2 => merge_string(wire_type, &mut self.agent_id, buf, ctx),
            3 => encoding::int32::merge(wire_type, &mut self.reason, buf, ctx),
            4 => merge_encoded(wire_type, &mut self.event, buf, ctx),
            5 => merge_string(wire_type, &mut self.output_summary, buf, ctx),
            6 => encoding::message::merge(wire_type, self.created_at.get_or_insert_with(Default::default), buf, ctx),
            _ => encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        (if self.cursor != 0 { encoding::uint64::encoded_len(1, &self.cursor) } else { 0 })
            + string_len(2, &self.agent_id)
            + (if self.reason != 0 { encoding::int32::encoded_len(3, &self.reason) } else { 0 })
            + length_delimited_len(4, self.event.len())
            + string_len(5, &self.output_summary)
            + self.created_at.as_ref().map_or(0, |created_at| encoding::message::encoded_len(6, created_at))
    }

    fn clear(&mut self) {
        *self = Self::default();
    }
}

impl Message for SubscribeFrame {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        match &self.message {
            Some(Frame::Notification(notification)) => encoding::message::encode(1, notification, buf),
            Some(Frame::LaggedAfterCursor(cursor)) => encoding::uint64::encode(2, cursor, buf),
            None => {}
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        match tag {
            1 => {
                let mut notification = match self.message.take() {
                    Some(Frame::Notification(notification)) => notification,
                    _ => NotificationFrame::default(),
                };
                let merged = encoding::message::merge(wire_type, &mut notification, buf, ctx);
                self.message = Some(Frame::Notification(notification));
                merged
            }
            2 => {
                let mut cursor = 0;
                encoding::uint64::merge(wire_type, &mut cursor, buf, ctx)?;
                self.message = Some(Frame::LaggedAfterCursor(cursor));
                Ok(())
            }
            _ => encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        match &self.message {
            Some(Frame::Notification(notification)) => encoding::message::encoded_len(1, notification),
            Some(Frame::LaggedAfterCursor(cursor)) => encoding::uint64::encoded_len(2, cursor),
            None => 0,
        }
    }

    fn clear(&mut self) {
        self.message = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        common::v1::{EventType, StepEvent, StepRoles},
        notifier::v1::{Notification, RecipientReason, SubscribeResponse, subscribe_response},
    };

    fn event() -> StepEvent {
        StepEvent {
            event_id: "event-1".to_owned(),
            sequence: 7,
            event_type: EventType::StepCompleted as i32,
            execution_id: "execution-1".to_owned(),
            roles: Some(StepRoles {
                executor: "writer".to_owned(),
                monitors: vec!["a".to_owned(), "b".to_owned()],
                informed: vec![],
            }),
            output: Some(prost_types::Value { kind: Some(prost_types::value::Kind::StringValue("é".to_owned())) }),
            cost: 0.25,
            ..StepEvent::default()
        }
    }

    fn generated(notification: Notification) -> SubscribeResponse {
        SubscribeResponse { message: Some(subscribe_response::Message::Notification(notification)) }
    }

    #[test]
    fn a_frame_encodes_exactly_as_the_generated_response() {
        let created_at = Some(prost_types::Timestamp { seconds: 1_768_559_400, nanos: 5 });
        let cases = [
            (
                NotificationFrame {
                    cursor: 300,
                    agent_id: Arc::from("reviewer"),
                    reason: RecipientReason::Monitor as i32,
                    event: event().encode_to_vec().into(),
                    output_summary: Arc::from("a summary"),
                    created_at,
                },
                Notification {
                    cursor: 300,
                    agent_id: "reviewer".to_owned(),
                    reason: RecipientReason::Monitor as i32,
                    event: Some(event()),
                    output_summary: "a summary".to_owned(),
                    created_at,
                },
            ),
            // Every default field left out, an empty event still sent.
            (
                NotificationFrame::default(),
                Notification { event: Some(StepEvent::default()), ..Notification::default() },
            ),
        ];
        for (frame, notification) in cases {
            let frame = SubscribeFrame { message: Some(Frame::Notification(frame)) };
            let wire = generated(notification).encode_to_vec();
            assert_eq!(frame.encode_to_vec(), wire);
            assert_eq!(frame.encoded_len(), wire.len());
            assert_eq!(SubscribeFrame::decode(wire.as_slice()).unwrap(), frame);
        }
        let lagged = SubscribeFrame { message: Some(Frame::LaggedAfterCursor(0)) };
        let wire =
            SubscribeResponse { message: Some(subscribe_response::Message::LaggedAfterCursor(0)) }.encode_to_vec();
        assert_eq!(lagged.encode_to_vec(), wire);
        assert_eq!(SubscribeFrame::decode(wire.as_slice()).unwrap(), lagged);
    }

    #[test]
    fn an_event_sent_in_two_parts_is_merged() {
        let mut first = StepEvent { event_id: "event-1".to_owned(), ..StepEvent::default() };
        let second = StepEvent { sequence: 9, ..StepEvent::default() };
        let mut wire = generated(Notification { cursor: 1, event: Some(first.clone()), ..Notification::default() })
            .encode_to_vec();
        wire.extend(generated(Notification { event: Some(second), ..Notification::default() }).encode_to_vec());
        let Some(Frame::Notification(frame)) = SubscribeFrame::decode(wire.as_slice()).unwrap().message else {
            panic!("a notification was expected");
        };
        first.sequence = 9;
        assert_eq!(frame.cursor, 1);
        assert_eq!(StepEvent::decode(frame.event).unwrap(), first);
    }
}
