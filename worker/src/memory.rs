//! An assignment's shared memory as it came: the encoded fields of a
//! `google.protobuf.Struct`, one field per completed step, the latest
//! first. Up to a hundred outputs travel with every assignment; a behaviour
//! that lists them, or reads one, decodes no other.
//!
//! An assignment made whole from its execution's kept window holds its new
//! outputs and the kept ones as parts side by side, each counted, so that
//! the next one reuses them without copying the window or reading it again.

use std::{collections::HashSet, sync::Arc};

use prost::{
    DecodeError, Message as _,
    bytes::Bytes,
    encoding::{self, DecodeContext, WireType},
};
use prost_types::{Struct, Value};

/// `Struct.fields`: each entry a length-delimited (key, value) pair.
const FIELDS: u32 = 1;
/// A map entry's key (field 1 too).
const KEY: u32 = 1;
/// The steps a shared memory holds at most as the execution service sends
/// it: what the ids listed are sized for.
const SHARED_MEMORY_STEPS: usize = 100;

/// The outputs of the completed steps an assignment builds on, by step id,
/// the latest first (see [`Step::shared_memory`](crate::Step::shared_memory)).
#[derive(Clone, Default)]
pub struct SharedMemory(Arc<[Part]>);

/// Encoded fields of the memory, in order, and how many outputs they hold
/// when known.
#[derive(Clone, Debug)]
pub(crate) struct Part {
    bytes: Bytes,
    entries: Option<usize>,
}

impl std::fmt::Debug for SharedMemory {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bytes: usize = self.0.iter().map(|part| part.bytes.len()).sum();
        formatter.debug_struct("SharedMemory").field("bytes", &bytes).finish()
    }
}

/// Two memories are equal when their encoded fields are, however parted.
impl PartialEq for SharedMemory {
    fn eq(&self, other: &Self) -> bool {
        let bytes = |memory: &Self| memory.0.iter().flat_map(|part| part.bytes.iter().copied()).collect::<Vec<u8>>();
        bytes(self) == bytes(other)
    }
}

impl Eq for SharedMemory {}

/// A map entry read for its key alone: the value is skipped, not decoded.
#[derive(Clone, PartialEq, prost::Message)]
struct Key {
    #[prost(string, tag = "1")]
    key: String,
}

/// A map entry whole.
#[derive(Clone, PartialEq, prost::Message)]
struct Entry {
    #[prost(string, tag = "1")]
    key: String,
    #[prost(message, optional, tag = "2")]
    value: Option<Value>,
}

impl SharedMemory {
    /// The memory from the encoded fields of a `google.protobuf.Struct`.
    pub fn new(encoded: Bytes) -> Self {
        Self(Arc::new([Part { bytes: encoded, entries: None }]))
    }

    /// Whether it holds no output.
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|part| part.bytes.is_empty())
    }

    /// This memory's outputs followed by `after` (an earlier memory's first
    /// outputs, [`SharedMemory::first`]). This memory's own bytes are copied
    /// (a few new outputs, which would otherwise hold the whole message
    /// they came in for as long as a window keeps them); the others are
    /// shared.
    pub(crate) fn followed_by(&self, after: Vec<Part>) -> Result<Self, DecodeError> {
        let mut parts = Vec::with_capacity(self.0.len() + after.len());
        for part in self.0.iter().filter(|part| !part.bytes.is_empty()) {
            let entries = match part.entries {
                Some(entries) => entries,
                None => count(&part.bytes)?,
            };
            parts.push(Part { bytes: Bytes::copy_from_slice(&part.bytes), entries: Some(entries) });
        }
        parts.extend(after.into_iter().filter(|part| !part.bytes.is_empty()));
        Ok(Self(parts.into()))
    }

    /// Its first `entries` outputs, as encoded; `None` when it holds fewer.
    pub(crate) fn first(&self, entries: usize) -> Result<Option<Vec<Part>>, DecodeError> {
        let mut parts = Vec::new();
        let mut left = entries;
        for part in self.0.iter() {
            if left == 0 {
                break;
            }
            let held = match part.entries {
                Some(held) => held,
                None => count(&part.bytes)?,
            };
            if held <= left {
                parts.push(Part { bytes: part.bytes.clone(), entries: Some(held) });
                left -= held;
            } else {
                let cut = prefix(&part.bytes, left)?;
                parts.push(Part { bytes: part.bytes.slice(..cut), entries: Some(left) });
                left = 0;
            }
        }
        Ok((left == 0).then_some(parts))
    }

    /// The ids of the steps whose outputs it holds, the latest first.
    pub fn step_ids(&self) -> Result<Vec<String>, DecodeError> {
        let mut seen = HashSet::with_capacity_and_hasher(SHARED_MEMORY_STEPS, foldhash::fast::RandomState::default());
        let mut ids = Vec::with_capacity(SHARED_MEMORY_STEPS);
        for entry in self.entries() {
            let entry = entry?;
            let key = key_of(entry)?;
            if seen.insert(key) {
                match std::str::from_utf8(key) {
                    Ok(key) => ids.push(key.to_owned()),
                    // Not text: prost's decoding says why.
                    Err(_) => ids.push(Key::decode(entry)?.key),
                }
            }
        }
        Ok(ids)
    }

    /// The output of one step, if it holds it.
    pub fn get(&self, step_id: &str) -> Result<Option<Value>, DecodeError> {
        let mut found = None;
        for entry in self.entries() {
            let entry = entry?;
            // A key sent twice: the last one holds, as in a decoded map.
            if key_of(entry)? == step_id.as_bytes() {
                found = Some(Entry::decode(entry)?.value.unwrap_or_default());
            }
        }
        Ok(found)
    }

    /// Every output, decoded.
    pub fn decode(&self) -> Result<Struct, DecodeError> {
        // Parts merged in order decode as their fields side by side would.
        let mut memory = Struct::default();
        for part in self.0.iter() {
            memory.merge(part.bytes.clone())?;
        }
        Ok(memory)
    }

    /// The encoded entries, one at a time, as slices of the memory's bytes.
    fn entries(&self) -> impl Iterator<Item = Result<&[u8], DecodeError>> {
        let mut parts = self.0.iter();
        let mut rest: &[u8] = &[];
        std::iter::from_fn(move || {
            loop {
                while rest.is_empty() {
                    rest = &parts.next()?.bytes;
                }
                match next_field(&mut rest) {
                    Ok((FIELDS, entry)) => return Some(Ok(entry)),
                    Ok(_) => {}
                    Err(error) => {
                        (rest, parts) = (&[], [].iter());
                        return Some(Err(error));
                    }
                }
            }
        })
    }
}

/// How many outputs encoded fields hold.
fn count(mut rest: &[u8]) -> Result<usize, DecodeError> {
    let mut entries = 0;
    while !rest.is_empty() {
        entries += usize::from(next_field(&mut rest)?.0 == FIELDS);
    }
    Ok(entries)
}

/// How many bytes of encoded fields hold their first `entries` outputs
/// (fewer held: all of them).
fn prefix(bytes: &[u8], entries: usize) -> Result<usize, DecodeError> {
    let mut rest = bytes;
    let mut seen = 0;
    while seen < entries && !rest.is_empty() {
        seen += usize::from(next_field(&mut rest)?.0 == FIELDS);
    }
    Ok(bytes.len() - rest.len())
}

/// Reads the next field of `rest`: its tag and, when length-delimited,
/// its bytes (empty otherwise). Field 1, a memory's entry or an entry's
/// key, must be length-delimited.
fn next_field<'a>(rest: &mut &'a [u8]) -> Result<(u32, &'a [u8]), DecodeError> {
    let (tag, wire_type) = encoding::decode_key(rest)?;
    if tag == FIELDS {
        encoding::check_wire_type(WireType::LengthDelimited, wire_type)?;
    }
    if wire_type == WireType::LengthDelimited {
        let mut after: &'a [u8] = rest;
        let len = usize::try_from(encoding::decode_varint(&mut after)?).unwrap_or(usize::MAX);
        if let (Some(field), Some(next)) = (after.get(..len), after.get(len..)) {
            *rest = next;
            return Ok((tag, field));
        }
    }
    // Any other field, or a length past the end (which prost refuses).
    encoding::skip_field(wire_type, tag, rest, DecodeContext::default())?;
    Ok((tag, &[]))
}

/// A map entry's key, as encoded: read without copying it or decoding the
/// value; a key sent twice, the last one holds.
fn key_of(entry: &[u8]) -> Result<&[u8], DecodeError> {
    let mut rest = entry;
    let mut key: &[u8] = &[];
    while !rest.is_empty() {
        if let (KEY, field) = next_field(&mut rest)? {
            key = field;
        }
    }
    Ok(key)
}

impl From<&Struct> for SharedMemory {
    fn from(memory: &Struct) -> Self {
        Self::new(memory.encode_to_vec().into())
    }
}

#[cfg(test)]
mod tests {
    use prost_types::value::Kind;

    use super::*;

    fn text(value: &str) -> Value {
        Value { kind: Some(Kind::StringValue(value.to_owned())) }
    }

    /// Fields encoded one at a time, the latest first, as the execution
    /// service sends them.
    fn sent(entries: &[(&str, &str)]) -> SharedMemory {
        let mut encoded = Vec::new();
        for (step, output) in entries {
            let field = Struct { fields: [((*step).to_owned(), text(output))].into() };
            encoded.extend(field.encode_to_vec());
        }
        SharedMemory::new(encoded.into())
    }

    #[test]
    fn lists_reads_and_decodes_what_was_sent() {
        let memory = sent(&[("c", "third"), ("a", "first"), ("b", "second")]);
        assert_eq!(memory.step_ids().unwrap(), ["c", "a", "b"]);
        assert_eq!(memory.get("a").unwrap(), Some(text("first")));
        assert_eq!(memory.get("z").unwrap(), None);
        let decoded = memory.decode().unwrap();
        assert_eq!(decoded.fields.len(), 3);
        assert_eq!(decoded.fields["b"], text("second"));
        assert_eq!(SharedMemory::from(&decoded).decode().unwrap(), decoded);
        assert!(SharedMemory::default().is_empty());
        assert_eq!(SharedMemory::default().step_ids().unwrap(), Vec::<String>::new());
        // A step sent twice is listed once; its last output holds.
        let twice = sent(&[("a", "old"), ("b", "x"), ("a", "new")]);
        assert_eq!(twice.step_ids().unwrap(), ["a", "b"]);
        assert_eq!(twice.get("a").unwrap(), Some(text("new")));
        assert_eq!(twice.decode().unwrap().fields["a"], text("new"));
    }

    #[test]
    fn parts_side_by_side_read_as_their_fields_would() {
        let earlier = sent(&[("b", "second"), ("a", "old")]);
        let first = earlier.first(1).unwrap().unwrap();
        assert_eq!(first.len(), 1);
        assert!(earlier.first(3).unwrap().is_none());
        let whole = sent(&[("c", "third"), ("a", "new")]).followed_by(earlier.first(2).unwrap().unwrap()).unwrap();
        assert_eq!(whole, sent(&[("c", "third"), ("a", "new"), ("b", "second"), ("a", "old")]));
        assert_eq!(whole.step_ids().unwrap(), ["c", "a", "b"]);
        // The last of a key sent twice holds, across parts too.
        assert_eq!(whole.get("a").unwrap(), Some(text("old")));
        assert_eq!(whole.decode().unwrap().fields["a"], text("old"));
        // First outputs taken across parts, the last one cut.
        let three = whole.first(3).unwrap().unwrap();
        assert_eq!(
            SharedMemory::default().followed_by(three).unwrap(),
            sent(&[("c", "third"), ("a", "new"), ("b", "second")])
        );
        assert!(SharedMemory::default().followed_by(Vec::new()).unwrap().is_empty());
    }

    #[test]
    fn malformed_bytes_are_an_error_not_a_panic() {
        let whole: Bytes = sent(&[("a", "first")]).0[0].bytes.clone();
        let cut = SharedMemory::new(whole.slice(..whole.len() - 2));
        assert!(cut.step_ids().is_err());
        assert!(cut.get("a").is_err());
        assert!(cut.decode().is_err());
        // Field 1 with the wrong wire type.
        let wrong = SharedMemory::new(Bytes::from_static(&[0x08, 0x01]));
        assert!(wrong.step_ids().is_err());
        // Bytes past a length that overruns them.
        let overrun = SharedMemory::new(Bytes::from_static(&[0x0a, 0x7f, 0x0a]));
        assert!(overrun.step_ids().is_err());
        assert!(overrun.get("a").is_err());
        assert!(cut.first(1).is_err());
        assert!(cut.followed_by(Vec::new()).is_err());
        // A step id that is not UTF-8.
        let not_text = SharedMemory::new(Bytes::from_static(&[0x0a, 0x03, 0x0a, 0x01, 0xff]));
        assert!(not_text.step_ids().is_err());
    }
}
