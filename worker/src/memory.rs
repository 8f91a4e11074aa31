//! An assignment's shared memory as it came: the encoded fields of a
//! `google.protobuf.Struct`, one field per completed step, the latest
//! first. Up to a hundred outputs travel with every assignment; a behaviour
//! that lists them, or reads one, decodes no other.

use std::collections::HashSet;

use prost::{
    DecodeError, Message as _,
    bytes::{Buf as _, Bytes},
    encoding::{self, DecodeContext},
};
use prost_types::{Struct, Value};

/// `Struct.fields`: each entry a length-delimited (key, value) pair.
const FIELDS: u32 = 1;

/// The outputs of the completed steps an assignment builds on, by step id,
/// the latest first (see [`Step::shared_memory`](crate::Step::shared_memory)).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SharedMemory(Bytes);

impl std::fmt::Debug for SharedMemory {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("SharedMemory").field("bytes", &self.0.len()).finish()
    }
}

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
        Self(encoded)
    }

    /// Whether it holds no output.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The encoded fields.
    pub(crate) fn bytes(&self) -> &Bytes {
        &self.0
    }

    /// Its first `entries` outputs, as encoded; `None` when it holds fewer.
    pub(crate) fn first(&self, entries: usize) -> Result<Option<Bytes>, DecodeError> {
        let mut rest = self.0.clone();
        let mut seen = 0;
        while seen < entries {
            if !rest.has_remaining() {
                return Ok(None);
            }
            let (tag, wire_type) = encoding::decode_key(&mut rest)?;
            seen += usize::from(tag == FIELDS);
            encoding::skip_field(wire_type, tag, &mut rest, DecodeContext::default())?;
        }
        Ok(Some(self.0.slice(..self.0.len() - rest.remaining())))
    }

    /// The ids of the steps whose outputs it holds, the latest first.
    pub fn step_ids(&self) -> Result<Vec<String>, DecodeError> {
        let mut seen = HashSet::new();
        let mut ids = Vec::new();
        for entry in self.entries() {
            let key = Key::decode(entry?)?.key;
            if seen.insert(key.clone()) {
                ids.push(key);
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
            if Key::decode(entry.clone())?.key == step_id {
                found = Some(Entry::decode(entry)?.value.unwrap_or_default());
            }
        }
        Ok(found)
    }

    /// Every output, decoded.
    pub fn decode(&self) -> Result<Struct, DecodeError> {
        Struct::decode(self.0.clone())
    }

    /// The encoded entries, one at a time.
    fn entries(&self) -> impl Iterator<Item = Result<Bytes, DecodeError>> {
        let mut rest = self.0.clone();
        std::iter::from_fn(move || {
            while rest.has_remaining() {
                let read = (|| {
                    let (tag, wire_type) = encoding::decode_key(&mut rest)?;
                    if tag != FIELDS {
                        encoding::skip_field(wire_type, tag, &mut rest, DecodeContext::default())?;
                        return Ok(None);
                    }
                    let mut entry = Bytes::new();
                    encoding::bytes::merge(wire_type, &mut entry, &mut rest, DecodeContext::default())?;
                    Ok(Some(entry))
                })();
                match read {
                    Ok(None) => continue,
                    Ok(Some(entry)) => return Some(Ok(entry)),
                    Err(error) => {
                        rest.clear();
                        return Some(Err(error));
                    }
                }
            }
            None
        })
    }
}

impl From<&Struct> for SharedMemory {
    fn from(memory: &Struct) -> Self {
        Self(memory.encode_to_vec().into())
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
    fn malformed_bytes_are_an_error_not_a_panic() {
        let whole = sent(&[("a", "first")]).0;
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
    }
}
