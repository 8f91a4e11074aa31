//! The size limits of every field of every request message, generated from
//! the `(muster.common.v1.limits)` options of the contracts and the defaults
//! of `muster/common/v1/limits.proto`. Servers check requests against this
//! table before decoding them.

/// How a field is encoded, and what to check in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A string: its length in bytes, and that it is UTF-8.
    Text,
    /// Bytes: their length.
    Bytes,
    /// An embedded message, by index in [`MESSAGES`] (map entries too).
    Message(usize),
    /// A JSON value (`google.protobuf.Struct`, `Value` or `ListValue`), by
    /// index in [`MESSAGES`]: its whole encoding is held to the field's
    /// `max_bytes`, and nothing inside it has a limit of its own.
    Json(usize),
    /// A varint: integers, booleans, enums.
    Varint,
    /// A fixed 4-byte number.
    Fixed32,
    /// A fixed 8-byte number.
    Fixed64,
}

/// One field of a request message.
#[derive(Debug, Clone, Copy)]
pub struct Field {
    /// Its number on the wire.
    pub number: u32,
    /// Its name in the contract.
    pub name: &'static str,
    /// How it is encoded.
    pub kind: Kind,
    /// Most bytes of a string or bytes value (of each element when
    /// repeated), or of the whole encoding of a JSON value.
    pub max_bytes: u32,
    /// Most elements: 1 for a singular field.
    pub max_items: u32,
}

/// A request message: its fields, sorted by number.
#[derive(Debug, Clone, Copy)]
pub struct Message {
    /// Its full protobuf name.
    pub name: &'static str,
    /// Its fields, sorted by number.
    pub fields: &'static [Field],
}

/// A method, by the path of its HTTP/2 request.
#[derive(Debug, Clone, Copy)]
pub struct Method {
    /// `/package.Service/Method`.
    pub path: &'static str,
    /// The index of its request message in [`MESSAGES`].
    pub input: usize,
    /// Whether the client or the server streams.
    pub streaming: bool,
    /// `unary`, `client_stream`, `server_stream` or `bidi_stream`, as the
    /// standard gRPC metrics' `grpc_type` label names it.
    pub kind: &'static str,
}

include!(concat!(env!("OUT_DIR"), "/limits.rs"));
