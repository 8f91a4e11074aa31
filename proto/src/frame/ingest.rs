//! `muster.notifier.v1.IngestEventsRequest` as the execution service sends
//! it: the event as it was stored (encoded once, when it was committed),
//! instead of decoded from the log and encoded again. The bytes on the
//! wire are exactly those of the generated
//! [`IngestEventsRequest`](crate::notifier::v1::IngestEventsRequest).

use prost::{
    DecodeError, Message,
    bytes::{Buf, BufMut, Bytes},
    encoding::{self, DecodeContext, WireType},
};

use super::{encode_length_delimited, length_delimited_len, merge_encoded};

/// One message of an IngestEvents stream.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IngestFrame {
    /// Field 1: the encoded `muster.common.v1.StepEvent` (always sent, as
    /// the generated type sends a present event).
    pub event: Bytes,
}

impl Message for IngestFrame {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        encode_length_delimited(1, &self.event, buf);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        match tag {
            1 => merge_encoded(wire_type, &mut self.event, buf, ctx),
            _ => encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        length_delimited_len(1, self.event.len())
    }

    fn clear(&mut self) {
        self.event = Bytes::new();
    }
}

/// A `StepEvent` read for its `event_id` alone: the other fields are
/// skipped, not decoded.
#[derive(Clone, PartialEq, Message)]
struct EventId {
    #[prost(string, tag = "1")]
    event_id: String,
}

/// The `event_id` of an encoded `muster.common.v1.StepEvent`.
pub fn event_id(event: &[u8]) -> Result<String, DecodeError> {
    EventId::decode(event).map(|read| read.event_id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        common::v1::{EventType, StepEvent},
        notifier::v1::IngestEventsRequest,
    };

    #[test]
    fn an_ingest_frame_encodes_exactly_as_the_generated_request() {
        let event = StepEvent {
            event_id: "event-1".to_owned(),
            sequence: 3,
            event_type: EventType::StepStarted as i32,
            detail: "é".repeat(100),
            ..StepEvent::default()
        };
        for event in [event, StepEvent::default()] {
            let frame = IngestFrame { event: event.encode_to_vec().into() };
            let wire = IngestEventsRequest { event: Some(event.clone()) }.encode_to_vec();
            assert_eq!(frame.encode_to_vec(), wire);
            assert_eq!(frame.encoded_len(), wire.len());
            assert_eq!(IngestFrame::decode(wire.as_slice()).unwrap(), frame);
            assert_eq!(event_id(&frame.event).unwrap(), event.event_id);
        }
        assert!(event_id(&[0x0a, 0x05, b'a']).is_err(), "a truncated event is an error");
    }
}
