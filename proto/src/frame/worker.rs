//! `muster.execution.v1.ConnectWorkerResponse` and `RelayStepsResponse` as
//! the execution service sends them: an assignment's shared memory travels
//! as its encoded `google.protobuf.Struct`, built once and shared by every
//! assignment that carries it, instead of a `Struct` parsed, cloned and
//! encoded once per assignment; a message another replica relayed goes on
//! as the bytes it came as. Clients decode them with the generated types:
//! the same fields, the shared memory after the assignment's other fields.
//! Decoded as a [`WorkerFrame`] (what the worker library does), an
//! assignment keeps its shared memory as the bytes it came as, so a worker
//! builds the values of up to a hundred outputs only when it reads them.
//!
//! `ConnectWorkerRequest` as a worker sends it ([`WorkerRequestFrame`]): a
//! report whose size the worker checked on its encoded bytes goes as those
//! bytes, not encoded a second time.

use prost::{
    DecodeError, Message,
    bytes::{Buf, BufMut, Bytes},
    encoding::{self, DecodeContext, WireType},
};

use super::{encode_length_delimited, length_delimited_len, merge_encoded};
use crate::execution::v1::{Assignment, ConnectWorkerRequest, ConnectWorkerResponse, connect_worker_response};

/// `ConnectWorkerResponse.assignment`.
const ASSIGNMENT: u32 = 2;
/// `Assignment.shared_memory`.
const SHARED_MEMORY: u32 = 32;
/// `RelayStepsResponse.worker`.
const WORKER: u32 = 1;

/// One message of a ConnectWorker stream.
#[derive(Debug, Clone, PartialEq)]
pub enum WorkerFrame {
    /// A message, encoded as generated.
    Message(ConnectWorkerResponse),
    /// An assignment (its own `shared_memory` unset) and its shared memory:
    /// the encoded fields of a `google.protobuf.Struct`, always sent. What
    /// an assignment decodes as.
    Assignment { assignment: Assignment, shared_memory: Bytes },
    /// A whole `ConnectWorkerResponse`, already encoded.
    Encoded(Bytes),
}

impl Default for WorkerFrame {
    fn default() -> Self {
        Self::Message(ConnectWorkerResponse::default())
    }
}

impl WorkerFrame {
    /// The generated message this frame encodes.
    pub fn to_message(&self) -> Result<ConnectWorkerResponse, DecodeError> {
        match self {
            Self::Message(message) => Ok(message.clone()),
            other => ConnectWorkerResponse::decode(other.encode_to_vec().as_slice()),
        }
    }
}

fn assignment_len(assignment: &Assignment, shared_memory: &Bytes) -> usize {
    assignment.encoded_len() + length_delimited_len(SHARED_MEMORY, shared_memory.len())
}

impl Message for WorkerFrame {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        match self {
            Self::Message(message) => message.encode_raw(buf),
            Self::Assignment { assignment, shared_memory } => {
                debug_assert!(assignment.shared_memory.is_none(), "the shared memory travels encoded");
                encoding::encode_key(ASSIGNMENT, WireType::LengthDelimited, buf);
                encoding::encode_varint(assignment_len(assignment, shared_memory) as u64, buf);
                assignment.encode_raw(buf);
                encode_length_delimited(SHARED_MEMORY, shared_memory, buf);
            }
            Self::Encoded(bytes) => buf.put_slice(bytes),
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        let mut message = match std::mem::take(self) {
            Self::Assignment { assignment, shared_memory } if tag == ASSIGNMENT => {
                return self.merge_assignment(Split { assignment, shared_memory }, wire_type, buf, ctx);
            }
            Self::Message(message) => message,
            other => other.to_message()?,
        };
        if tag == ASSIGNMENT {
            // A oneof: an assignment replaces any other message, and merges
            // into an assignment.
            let split = match message.message.take() {
                Some(connect_worker_response::Message::Assignment(mut assignment)) => {
                    let shared_memory = assignment.shared_memory.take().map(|memory| memory.encode_to_vec().into());
                    Split { assignment, shared_memory: shared_memory.unwrap_or_default() }
                }
                _ => Split::default(),
            };
            return self.merge_assignment(split, wire_type, buf, ctx);
        }
        let merged = message.merge_field(tag, wire_type, buf, ctx);
        *self = Self::Message(message);
        merged
    }

    fn encoded_len(&self) -> usize {
        match self {
            Self::Message(message) => message.encoded_len(),
            Self::Assignment { assignment, shared_memory } => {
                length_delimited_len(ASSIGNMENT, assignment_len(assignment, shared_memory))
            }
            Self::Encoded(bytes) => bytes.len(),
        }
    }

    fn clear(&mut self) {
        *self = Self::default();
    }
}

impl WorkerFrame {
    fn merge_assignment(
        &mut self,
        mut split: Split,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        let merged = encoding::message::merge(wire_type, &mut split, buf, ctx);
        *self = Self::Assignment { assignment: split.assignment, shared_memory: split.shared_memory };
        merged
    }
}

/// An assignment decoded with its shared memory left encoded.
#[derive(Debug, Default)]
struct Split {
    assignment: Assignment,
    shared_memory: Bytes,
}

impl Message for Split {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        self.assignment.encode_raw(buf);
        encode_length_delimited(SHARED_MEMORY, &self.shared_memory, buf);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        match tag {
            SHARED_MEMORY => merge_encoded(wire_type, &mut self.shared_memory, buf, ctx),
            _ => self.assignment.merge_field(tag, wire_type, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        assignment_len(&self.assignment, &self.shared_memory)
    }

    fn clear(&mut self) {
        *self = Self::default();
    }
}

/// One message of a RelaySteps stream: what a worker connected to
/// ConnectWorker would receive.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RelayFrame {
    /// Field 1.
    pub worker: Option<WorkerFrame>,
}

impl Message for RelayFrame {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        if let Some(worker) = &self.worker {
            encoding::message::encode(WORKER, worker, buf);
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
            WORKER => encoding::message::merge(wire_type, self.worker.get_or_insert_with(Default::default), buf, ctx),
            _ => encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        self.worker.as_ref().map_or(0, |worker| encoding::message::encoded_len(WORKER, worker))
    }

    fn clear(&mut self) {
        self.worker = None;
    }
}

/// One message of a ConnectWorker stream as a worker sends it.
#[derive(Debug, Clone, PartialEq)]
pub enum WorkerRequestFrame {
    /// A message, encoded as generated.
    Message(ConnectWorkerRequest),
    /// A whole `ConnectWorkerRequest`, already encoded.
    Encoded(Bytes),
}

impl Default for WorkerRequestFrame {
    fn default() -> Self {
        Self::Message(ConnectWorkerRequest::default())
    }
}

impl From<ConnectWorkerRequest> for WorkerRequestFrame {
    fn from(message: ConnectWorkerRequest) -> Self {
        Self::Message(message)
    }
}

impl WorkerRequestFrame {
    /// The generated message this frame encodes.
    pub fn to_message(&self) -> Result<ConnectWorkerRequest, DecodeError> {
        match self {
            Self::Message(message) => Ok(message.clone()),
            Self::Encoded(bytes) => ConnectWorkerRequest::decode(bytes.clone()),
        }
    }
}

impl Message for WorkerRequestFrame {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        match self {
            Self::Message(message) => message.encode_raw(buf),
            Self::Encoded(bytes) => buf.put_slice(bytes),
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        let mut message = match std::mem::take(self) {
            Self::Message(message) => message,
            encoded => encoded.to_message()?,
        };
        let merged = message.merge_field(tag, wire_type, buf, ctx);
        *self = Self::Message(message);
        merged
    }

    fn encoded_len(&self) -> usize {
        match self {
            Self::Message(message) => message.encoded_len(),
            Self::Encoded(bytes) => bytes.len(),
        }
    }

    fn clear(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use prost_types::{Struct, Value, value::Kind};

    use super::*;
    use crate::{
        common::v1::StepRoles,
        execution::v1::{CancelAssignment, RelayStepsResponse, connect_worker_response},
    };

    fn text(value: &str) -> Value {
        Value { kind: Some(Kind::StringValue(value.to_owned())) }
    }

    fn assignment() -> Assignment {
        Assignment {
            assignment_id: "a-1".to_owned(),
            step_id: "write".to_owned(),
            message: "é".repeat(200),
            roles: Some(StepRoles { executor: "writer".to_owned(), ..StepRoles::default() }),
            shared_memory_left_out: 3,
            ..Assignment::default()
        }
    }

    fn generated(assignment: Assignment) -> ConnectWorkerResponse {
        ConnectWorkerResponse { message: Some(connect_worker_response::Message::Assignment(assignment)) }
    }

    /// The shared memory of one step's output: a one-field `Struct`.
    fn entry(step_id: &str, output: Value) -> Bytes {
        Struct { fields: [(step_id.to_owned(), output)].into() }.encode_to_vec().into()
    }

    #[test]
    fn an_assignment_frame_decodes_as_the_generated_response() {
        // Fields encoded one at a time and put side by side are the Struct.
        let shared_memory: Bytes = [entry("b", text("second")), entry("a", text("first"))].concat().into();
        let memory = Struct { fields: [("a".to_owned(), text("first")), ("b".to_owned(), text("second"))].into() };
        for (shared_memory, memory) in [(shared_memory, memory), (Bytes::new(), Struct::default())] {
            let frame = WorkerFrame::Assignment { assignment: assignment(), shared_memory };
            let wire = generated(Assignment { shared_memory: Some(memory), ..assignment() });
            let encoded = frame.encode_to_vec();
            assert_eq!(ConnectWorkerResponse::decode(encoded.as_slice()).unwrap(), wire);
            assert_eq!((frame.encoded_len(), encoded.len()), (wire.encoded_len(), wire.encoded_len()));
            assert_eq!(frame.to_message().unwrap(), wire);
            // Decoded as a frame, the shared memory stays as it came.
            assert_eq!(WorkerFrame::decode(encoded.as_slice()).unwrap(), frame);
            assert_eq!(WorkerFrame::decode(wire.encode_to_vec().as_slice()).unwrap().to_message().unwrap(), wire);
        }
    }

    #[test]
    fn an_assignment_decodes_with_its_shared_memory_encoded() {
        let memory = Struct { fields: [("a".to_owned(), text("first")), ("b".to_owned(), text("second"))].into() };
        let wire = generated(Assignment { shared_memory: Some(memory.clone()), ..assignment() });
        let WorkerFrame::Assignment { assignment: decoded, shared_memory } =
            WorkerFrame::decode(wire.encode_to_vec().as_slice()).unwrap()
        else {
            panic!("an assignment decodes as an assignment frame");
        };
        assert_eq!(decoded, assignment());
        assert_eq!(Struct::decode(shared_memory).unwrap(), memory);
        // Sent in two parts (a message field seen twice merges), it merges:
        // the memory's fields from both, the assignment's later fields win.
        let first = generated(Assignment { shared_memory: Some(memory.clone()), ..assignment() });
        let more = Struct { fields: [("c".to_owned(), text("third"))].into() };
        let second = generated(Assignment {
            assignment_id: "a-2".to_owned(),
            shared_memory: Some(more),
            ..Assignment::default()
        });
        let both = [first.encode_to_vec(), second.encode_to_vec()].concat();
        let frame = WorkerFrame::decode(both.as_slice()).unwrap();
        assert!(matches!(frame, WorkerFrame::Assignment { .. }));
        assert_eq!(frame.to_message().unwrap(), ConnectWorkerResponse::decode(both.as_slice()).unwrap());
        // Another message after an assignment replaces it, as the oneof does.
        let cancel = ConnectWorkerResponse {
            message: Some(connect_worker_response::Message::Cancel(CancelAssignment {
                assignment_id: "a-1".to_owned(),
                reason: "cancelled".to_owned(),
            })),
        };
        let then_cancel = [first.encode_to_vec(), cancel.encode_to_vec()].concat();
        assert_eq!(WorkerFrame::decode(then_cancel.as_slice()).unwrap(), WorkerFrame::Message(cancel));
        // A shared memory that is not length-delimited is refused.
        let mut malformed = Vec::new();
        encoding::encode_key(ASSIGNMENT, WireType::LengthDelimited, &mut malformed);
        encoding::encode_varint(2, &mut malformed);
        encoding::encode_key(SHARED_MEMORY, WireType::Varint, &mut malformed);
        encoding::encode_varint(1, &mut malformed);
        assert!(WorkerFrame::decode(malformed.as_slice()).is_err());
    }

    #[test]
    fn messages_and_encoded_messages_go_as_they_are() {
        let cancel = ConnectWorkerResponse {
            message: Some(connect_worker_response::Message::Cancel(CancelAssignment {
                assignment_id: "a-1".to_owned(),
                reason: "cancelled".to_owned(),
            })),
        };
        let bytes = cancel.encode_to_vec();
        for frame in [WorkerFrame::Message(cancel.clone()), WorkerFrame::Encoded(bytes.clone().into())] {
            assert_eq!(frame.encode_to_vec(), bytes);
            assert_eq!(frame.encoded_len(), bytes.len());
            assert_eq!(frame.to_message().unwrap(), cancel);
        }
    }

    #[test]
    fn a_request_frame_encodes_as_its_message_and_decodes_as_one() {
        use crate::execution::v1::{StepResult, connect_worker_request};
        let report = ConnectWorkerRequest {
            message: Some(connect_worker_request::Message::Result(StepResult {
                assignment_id: "a-1".to_owned(),
                output: Some(text("done")),
                ..StepResult::default()
            })),
        };
        let bytes = report.encode_to_vec();
        for frame in [WorkerRequestFrame::from(report.clone()), WorkerRequestFrame::Encoded(bytes.clone().into())] {
            assert_eq!(frame.encode_to_vec(), bytes);
            assert_eq!(frame.encoded_len(), bytes.len());
            assert_eq!(frame.to_message().unwrap(), report);
            assert_eq!(
                WorkerRequestFrame::decode(frame.encode_to_vec().as_slice()).unwrap(),
                frame.clone().to_message().unwrap().into()
            );
        }
        // Merged into, an encoded frame merges as its message does.
        let heartbeat =
            ConnectWorkerRequest { message: Some(connect_worker_request::Message::Heartbeat(Default::default())) };
        let mut frame = WorkerRequestFrame::Encoded(bytes.into());
        frame.merge(heartbeat.encode_to_vec().as_slice()).unwrap();
        assert_eq!(frame, WorkerRequestFrame::Message(heartbeat));
        assert!(WorkerRequestFrame::Encoded(Bytes::from_static(&[0xff])).to_message().is_err());
    }

    #[test]
    fn a_relay_frame_decodes_as_the_generated_response() {
        let frame = RelayFrame {
            worker: Some(WorkerFrame::Assignment { assignment: assignment(), shared_memory: entry("a", text("x")) }),
        };
        let memory = Struct { fields: [("a".to_owned(), text("x"))].into() };
        let wire =
            RelayStepsResponse { worker: Some(generated(Assignment { shared_memory: Some(memory), ..assignment() })) };
        let encoded = frame.encode_to_vec();
        assert_eq!(RelayStepsResponse::decode(encoded.as_slice()).unwrap(), wire);
        assert_eq!(frame.encoded_len(), encoded.len());
        assert_eq!(RelayFrame::default().encode_to_vec(), RelayStepsResponse::default().encode_to_vec());
    }
}
