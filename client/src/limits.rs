//! Request limits, checked the way the servers check them.
//!
//! Every field of every request message has a maximum: the one its contract
//! declares with the `(muster.common.v1.limits)` option, or the default of
//! its kind (the table is [`muster_proto::limits`]). [`check`] reads a
//! request message's protobuf encoding without decoding it into types or
//! copying it, and refuses a field over its limit, or a string that is not
//! UTF-8, with INVALID_ARGUMENT naming the field (`agent.custom_prompt`,
//! `files[3].content`) and the limit, and bytes that are not a protobuf
//! encoding with INVALID_ARGUMENT. A client runs it before sending
//! ([`check_request`]); every server runs it on the wire, in the tower layer
//! of `muster-runtime`'s `limits`.

use std::{collections::HashMap, sync::LazyLock};

use muster_proto::limits::{Field, Kind, MESSAGES, METHODS};
use tonic::{Code, Status};

/// Deepest nesting of messages accepted (prost's own limit is 100).
const MAX_DEPTH: usize = 64;

/// The most fields a message may have for [`walk`] to count its elements on
/// the stack.
const STACK_COUNTS: usize = 32;

/// The request message of every muster method (an index of
/// [`muster_proto::limits::MESSAGES`]), by HTTP/2 path.
pub static METHOD_INPUTS: LazyLock<HashMap<&'static str, usize>> =
    LazyLock::new(|| METHODS.iter().map(|method| (method.path, method.input)).collect());

/// Checks the encoded request message `input` (an index of
/// [`muster_proto::limits::MESSAGES`]) against the limits of its fields.
pub fn check(input: usize, encoded: &[u8]) -> Result<(), Status> {
    walk(input, encoded, 0).map_err(Violation::into_status)
}

/// Checks an encoded request message of the method at `path`
/// (`/muster.execution.v1.ExecutionService/ConnectWorker`) as the server
/// will: a client that checks before sending can report a value that is too
/// large instead of having its call (or stream) refused. A path muster does
/// not serve passes.
pub fn check_request(path: &str, encoded: &[u8]) -> Result<(), Status> {
    METHOD_INPUTS.get(path).map_or(Ok(()), |input| check(*input, encoded))
}

/// Why a message was refused, with the path of the field from the innermost
/// out (reversed when reported).
struct Violation {
    code: Code,
    path: Vec<String>,
    problem: String,
}

impl Violation {
    fn new(code: Code, problem: String) -> Self {
        Self { code, path: Vec::new(), problem }
    }

    fn at(mut self, segment: String) -> Self {
        self.path.push(segment);
        self
    }

    fn into_status(self) -> Status {
        let path: Vec<&str> = self.path.iter().rev().map(String::as_str).collect();
        if path.is_empty() {
            return Status::new(self.code, format!("the request {}", self.problem));
        }
        let field = path.join(".");
        let message = format!("field {field} {}", self.problem);
        match self.code {
            Code::InvalidArgument => crate::status::invalid_field(&field, &message),
            code => Status::new(code, message),
        }
    }
}

fn malformed(problem: &str) -> Violation {
    Violation::new(Code::InvalidArgument, format!("is not a valid protobuf encoding: {problem}"))
}

fn walk(message: usize, mut bytes: &[u8], depth: usize) -> Result<(), Violation> {
    if depth > MAX_DEPTH {
        return Err(Violation::new(Code::InvalidArgument, format!("nests messages deeper than {MAX_DEPTH} levels")));
    }
    let fields = MESSAGES[message].fields;
    // Elements seen so far of each field, by the field's position: on the
    // stack unless the message has more fields than any of muster's.
    let mut on_stack = [0u32; STACK_COUNTS];
    let mut on_heap = Vec::new();
    let counts: &mut [u32] = match on_stack.get_mut(..fields.len()) {
        Some(counts) => counts,
        None => {
            on_heap.resize(fields.len(), 0);
            &mut on_heap
        }
    };
    // Where the field after the last one found is: encoders write fields in
    // number order, so it is usually the next one (or the same, repeated).
    let mut next = 0usize;
    while !bytes.is_empty() {
        let key = varint(&mut bytes).ok_or_else(|| malformed("a truncated field key"))?;
        let number = u32::try_from(key >> 3).unwrap_or(u32::MAX);
        let position = [next, next.wrapping_sub(1)]
            .into_iter()
            .find(|&position| fields.get(position).is_some_and(|field| field.number == number))
            .or_else(|| fields.binary_search_by_key(&number, |field| field.number).ok());
        if let Some(position) = position {
            next = position + 1;
        }
        let field = position.map(|position| &fields[position]);
        // Field numbers run from 1 to 2^29 - 1.
        if number == 0 || number >= 1 << 29 {
            return Err(malformed("a field number out of range"));
        }
        if let Some(field) = field
            && !wire_type_fits(field, key & 7)
        {
            return Err(Violation::new(
                Code::InvalidArgument,
                format!("is not a valid protobuf encoding: wire type {} for a {:?} field", key & 7, field.kind),
            )
            .at(field.name.to_owned()));
        }
        let mut items = 1;
        match key & 7 {
            0 => {
                varint(&mut bytes).ok_or_else(|| malformed("a truncated varint"))?;
            }
            1 => skip(&mut bytes, 8)?,
            5 => skip(&mut bytes, 4)?,
            2 => {
                let length = varint(&mut bytes).ok_or_else(|| malformed("a truncated length"))?;
                let length = usize::try_from(length).map_err(|_| malformed("a length out of range"))?;
                if length > bytes.len() {
                    return Err(malformed("a length beyond the end of the message"));
                }
                let (value, rest) = bytes.split_at(length);
                bytes = rest;
                if let Some(field) = field {
                    let index = position.map_or(0, |position| counts[position]);
                    items = check_value(field, value, depth).map_err(|violation| {
                        let segment = if field.max_items > 1 {
                            format!("{}[{index}]", field.name)
                        } else {
                            field.name.to_owned()
                        };
                        violation.at(segment)
                    })?;
                }
            }
            _ => return Err(malformed("an unsupported wire type (groups are not used by muster)")),
        }
        if let (Some(position), Some(field)) = (position, field) {
            counts[position] = counts[position].saturating_add(items);
            if counts[position] > field.max_items && field.max_items > 1 {
                return Err(Violation::new(
                    Code::InvalidArgument,
                    format!("has more than {} elements (the limit)", field.max_items),
                )
                .at(field.name.to_owned()));
            }
        }
    }
    Ok(())
}

/// Whether a value of wire type `wire` can be a value of `field`
/// (length-delimited for packed repeated numbers too).
fn wire_type_fits(field: &Field, wire: u64) -> bool {
    let packed = field.max_items > 1 && wire == 2;
    match field.kind {
        Kind::Text | Kind::Bytes | Kind::Message(_) | Kind::Json(_) => wire == 2,
        Kind::Varint => wire == 0 || packed,
        Kind::Fixed64 => wire == 1 || packed,
        Kind::Fixed32 => wire == 5 || packed,
    }
}

/// Checks one length-delimited value of `field`; returns how many elements
/// it holds (a packed repeated scalar holds several).
fn check_value(field: &Field, value: &[u8], depth: usize) -> Result<u32, Violation> {
    let too_long = || {
        Violation::new(
            Code::InvalidArgument,
            format!("is {} bytes; the limit is {} bytes", value.len(), field.max_bytes),
        )
    };
    match field.kind {
        Kind::Text => {
            if value.len() > field.max_bytes as usize {
                return Err(too_long());
            }
            if std::str::from_utf8(value).is_err() {
                return Err(Violation::new(Code::InvalidArgument, "is not valid UTF-8".to_owned()));
            }
            Ok(1)
        }
        Kind::Bytes if value.len() > field.max_bytes as usize => Err(too_long()),
        Kind::Bytes => Ok(1),
        Kind::Message(inner) => walk(inner, value, depth + 1).map(|()| 1),
        Kind::Json(_) if value.len() > field.max_bytes as usize => Err(too_long()),
        Kind::Json(inner) => walk(inner, value, depth + 1).map(|()| 1),
        // Packed repeated numbers: every byte without its top bit ends a varint.
        Kind::Varint => Ok(count(value.iter().filter(|byte| **byte < 0x80).count())),
        Kind::Fixed32 => Ok(count(value.len() / 4)),
        Kind::Fixed64 => Ok(count(value.len() / 8)),
    }
}

fn count(elements: usize) -> u32 {
    u32::try_from(elements).unwrap_or(u32::MAX)
}

fn varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for (index, byte) in bytes.iter().enumerate().take(10) {
        // The tenth byte holds the 64th bit alone: more overflows, and the decoder refuses it.
        if index == 9 && *byte > 1 {
            return None;
        }
        value |= u64::from(byte & 0x7f) << (7 * index);
        if byte & 0x80 == 0 {
            *bytes = &bytes[index + 1..];
            return Some(value);
        }
    }
    None
}

fn skip(bytes: &mut &[u8], length: usize) -> Result<(), Violation> {
    if bytes.len() < length {
        return Err(malformed("a truncated fixed-size number"));
    }
    *bytes = &bytes[length..];
    Ok(())
}

#[cfg(test)]
mod tests {
    use muster_proto::roster::v1::{Agent, ImportFile, ImportRosterRequest, RegisterAgentRequest};
    use prost::Message as _;

    use super::*;

    fn input_of(path: &str) -> usize {
        METHOD_INPUTS[path]
    }

    fn register(agent: Agent) -> Vec<u8> {
        RegisterAgentRequest { agent: Some(agent) }.encode_to_vec()
    }

    #[test]
    fn a_field_over_its_limit_is_named_with_the_limit() {
        let register_agent = input_of("/muster.roster.v1.RosterService/RegisterAgent");
        let ok = register(Agent { id: "a".repeat(128), custom_prompt: "p".repeat(64 * 1024), ..Default::default() });
        check(register_agent, &ok).unwrap();

        let big = register(Agent { id: "a".into(), custom_prompt: "p".repeat(3 << 20), ..Default::default() });
        let status = check(register_agent, &big).unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(status.message(), "field agent.custom_prompt is 3145728 bytes; the limit is 65536 bytes");

        let long_id = register(Agent { id: "a".repeat(129), ..Default::default() });
        assert_eq!(
            check(register_agent, &long_id).unwrap_err().message(),
            "field agent.id is 129 bytes; the limit is 128 bytes"
        );
    }

    #[test]
    fn repeated_fields_are_counted_and_their_elements_named_by_index() {
        let import = input_of("/muster.roster.v1.RosterService/ImportRoster");
        let file = |content: &str| ImportFile { name: "team.yaml".into(), content: content.into() };
        let too_many = ImportRosterRequest { files: vec![file("x"); 201], dry_run: false }.encode_to_vec();
        assert_eq!(
            check(import, &too_many).unwrap_err().message(),
            "field files has more than 200 elements (the limit)"
        );
        let big = ImportRosterRequest { files: vec![file("x"), file(&"y".repeat((1 << 20) + 1))], dry_run: false }
            .encode_to_vec();
        assert_eq!(
            check(import, &big).unwrap_err().message(),
            "field files[1].content is 1048577 bytes; the limit is 1048576 bytes"
        );
    }

    #[test]
    fn invalid_utf8_and_broken_encodings_are_invalid_arguments() {
        let register_agent = input_of("/muster.roster.v1.RosterService/RegisterAgent");
        let mut bytes = register(Agent { id: "ab".into(), ..Default::default() });
        let at = bytes.iter().rposition(|byte| *byte == b'b').unwrap();
        bytes[at] = 0xff;
        let status = check(register_agent, &bytes).unwrap_err();
        assert_eq!((status.code(), status.message()), (Code::InvalidArgument, "field agent.id is not valid UTF-8"));

        let truncated = &register(Agent { id: "abc".into(), ..Default::default() })[..4];
        let status = check(register_agent, truncated).unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().starts_with("the request is not a valid protobuf encoding"), "{}", status.message());
    }

    /// Whatever bytes arrive, the check answers without panicking, and what
    /// it lets through decodes.
    mod properties {
        use muster_proto::{
            execution::v1::{ConnectWorkerRequest, PublishProcessRequest, StartExecutionRequest},
            roster::v1::{Agent, ImportFile, ImportRosterRequest, RegisterAgentRequest},
        };
        use proptest::prelude::*;

        use super::*;

        fn samples() -> Vec<(&'static str, Vec<u8>)> {
            vec![
                (
                    "/muster.roster.v1.RosterService/RegisterAgent",
                    register(Agent {
                        id: "a".into(),
                        expertise: vec!["rust".into(), "go".into()],
                        workload_capacity: 3,
                        ..Default::default()
                    }),
                ),
                (
                    "/muster.roster.v1.RosterService/ImportRoster",
                    ImportRosterRequest {
                        files: vec![ImportFile { name: "t.yaml".into(), content: "agents: []".into() }],
                        dry_run: true,
                    }
                    .encode_to_vec(),
                ),
                (
                    "/muster.execution.v1.ExecutionService/PublishProcess",
                    PublishProcessRequest { source: "name: p\nsteps: []".into(), file_name: "p.yaml".into() }
                        .encode_to_vec(),
                ),
                (
                    "/muster.execution.v1.ExecutionService/StartExecution",
                    StartExecutionRequest { process_name: "p".into(), ..Default::default() }.encode_to_vec(),
                ),
                (
                    "/muster.execution.v1.ExecutionService/ConnectWorker",
                    ConnectWorkerRequest::default().encode_to_vec(),
                ),
            ]
        }

        fn decodes(path: &str, bytes: &[u8]) -> bool {
            match path {
                "/muster.roster.v1.RosterService/RegisterAgent" => RegisterAgentRequest::decode(bytes).is_ok(),
                "/muster.roster.v1.RosterService/ImportRoster" => ImportRosterRequest::decode(bytes).is_ok(),
                "/muster.execution.v1.ExecutionService/PublishProcess" => PublishProcessRequest::decode(bytes).is_ok(),
                "/muster.execution.v1.ExecutionService/StartExecution" => StartExecutionRequest::decode(bytes).is_ok(),
                _ => ConnectWorkerRequest::decode(bytes).is_ok(),
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

            #[test]
            fn mutated_requests_are_answered_and_what_passes_decodes(
                sample in 0usize..5,
                edits in proptest::collection::vec((any::<usize>(), any::<u8>(), 0u8..3), 1..8),
            ) {
                let (path, mut bytes) = samples().swap_remove(sample);
                for (at, byte, kind) in edits {
                    let at = at % (bytes.len() + 1);
                    match kind {
                        0 => bytes.insert(at, byte),
                        1 if at < bytes.len() => bytes[at] = byte,
                        _ if at < bytes.len() => { bytes.remove(at); }
                        _ => bytes.push(byte),
                    }
                }
                if check(input_of(path), &bytes).is_ok() {
                    prop_assert!(decodes(path, &bytes), "passed the check but does not decode: {bytes:?}");
                }
            }

            #[test]
            fn arbitrary_bytes_are_answered(bytes in proptest::collection::vec(any::<u8>(), 0..256), sample in 0usize..5) {
                let (path, _) = samples().swap_remove(sample);
                if check(input_of(path), &bytes).is_ok() {
                    prop_assert!(decodes(path, &bytes), "passed the check but does not decode: {bytes:?}");
                }
            }
        }
    }

    #[test]
    fn a_varint_past_64_bits_is_malformed() {
        let mut widest: &[u8] = &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
        assert_eq!(varint(&mut widest), Some(u64::MAX));
        assert!(widest.is_empty());
        let overflowing: &[u8] = &[0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x02];
        assert_eq!(varint(&mut &overflowing[..]), None);
        // As a field of a request: refused by the check, as the decoder refuses it.
        let request = [&[16u8][..], overflowing].concat();
        assert!(check(input_of("/muster.execution.v1.ExecutionService/StartExecution"), &request).is_err());
        assert!(muster_proto::execution::v1::StartExecutionRequest::decode(&request[..]).is_err());
    }

    #[test]
    fn unknown_fields_are_skipped() {
        let register_agent = input_of("/muster.roster.v1.RosterService/RegisterAgent");
        // Field 99, length-delimited, 3 bytes: a newer client's field.
        let mut bytes = register(Agent { id: "a".into(), ..Default::default() });
        bytes.extend_from_slice(&[0x9a, 0x06, 3, b'x', b'y', b'z']);
        check(register_agent, &bytes).unwrap();
    }
}
