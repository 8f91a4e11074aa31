//! JSON values as the contracts carry them (`google.protobuf.Struct` for
//! objects, `google.protobuf.Value` for any value) and as the services store
//! them (JSON text), converted at the wire; and any message of the
//! contracts in the canonical JSON mapping ([`message_to_json`]).
//!
//! Protobuf numbers are doubles: an integer beyond 2^53 loses precision on
//! the way in, as it would in JavaScript. A number that is not finite has no
//! JSON form: it is refused on the way in and written as `null` on the way
//! out.

use std::sync::LazyLock;

use prost_reflect::{DescriptorPool, DynamicMessage, SerializeOptions};
use prost_types::{ListValue, Struct, Value, value::Kind};
use serde_json::{Map, Number, Value as Json};

static POOL: LazyLock<Result<DescriptorPool, String>> = LazyLock::new(|| {
    DescriptorPool::decode(muster_proto::FILE_DESCRIPTOR_SET)
        .map_err(|error| format!("muster's own descriptors: {error}"))
});

/// The contracts' message type `full_name`.
pub(crate) fn message_descriptor(full_name: &str) -> Result<prost_reflect::MessageDescriptor, String> {
    POOL.as_ref()?.get_message_by_name(full_name).ok_or_else(|| format!("no message type {full_name}"))
}

/// A message of the contracts' type `full_name` read from `json` in the
/// canonical protobuf JSON mapping (fields by their `.proto` or their
/// lowerCamelCase names); a field the type does not have is refused, by name.
pub fn message_from_json<M: prost::Message + Default>(json: &Json, full_name: &str) -> Result<M, String> {
    let dynamic =
        DynamicMessage::deserialize(message_descriptor(full_name)?, json).map_err(|error| error.to_string())?;
    dynamic.transcode_to().map_err(|error| format!("a {full_name} that does not encode: {error}"))
}

/// `message`, of the contracts' type `full_name`, in the canonical protobuf
/// JSON mapping with the `.proto` field names (as grpcurl prints it); with
/// `defaults`, every field present, default values included, else those
/// left out.
pub fn message_to_json(message: &impl prost::Message, full_name: &str, defaults: bool) -> Result<Json, String> {
    serialize_message(message, full_name, defaults, FieldNames::Proto, serde_json::value::Serializer)
}

/// How fields are named in JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldNames {
    /// As in the `.proto` files (`next_page_token`).
    Proto,
    /// The canonical protobuf JSON mapping's lowerCamelCase (`nextPageToken`),
    /// as grpcurl and the protobuf libraries print it.
    LowerCamel,
}

/// [`message_to_json`] into any serializer, such as a pretty printer (its
/// fields in the order of the `.proto` file), with fields named `names`.
pub fn serialize_message<S: serde::Serializer>(
    message: &impl prost::Message,
    full_name: &str,
    defaults: bool,
    names: FieldNames,
    serializer: S,
) -> Result<S::Ok, String> {
    let dynamic = DynamicMessage::decode(message_descriptor(full_name)?, message.encode_to_vec().as_slice())
        .map_err(|error| format!("a {full_name} that does not decode: {error}"))?;
    let options =
        SerializeOptions::new().use_proto_field_name(names == FieldNames::Proto).skip_default_fields(!defaults);
    dynamic.serialize_with_options(serializer, &options).map_err(|error| error.to_string())
}

/// A wire value from JSON text.
pub fn value_from_text(text: &str) -> Result<Value, String> {
    let Wire(value) = serde_json::from_str(text).map_err(|error| format!("is not JSON: {error}"))?;
    Ok(value)
}

/// A wire object from JSON text; empty text is no object.
pub fn struct_from_text(text: &str) -> Result<Option<Struct>, String> {
    if text.trim().is_empty() {
        return Ok(None);
    }
    match value_from_text(text)?.kind {
        Some(Kind::StructValue(object)) => Ok(Some(object)),
        other => Err(format!("is not a JSON object (it is {})", wire_kind(other.as_ref()))),
    }
}

/// A wire value read straight from JSON text, without a `serde_json::Value`
/// in between (stored text becomes wire values on every assignment and
/// event). Same values as [`from_json`] of the parsed text: numbers as
/// doubles, the last of repeated keys.
struct Wire(Value);

impl<'de> serde::Deserialize<'de> for Wire {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(WireVisitor).map(|kind| Self(Value { kind: Some(kind) }))
    }
}

struct WireVisitor;

impl<'de> serde::de::Visitor<'de> for WireVisitor {
    type Value = Kind;

    fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<Kind, E> {
        Ok(Kind::NullValue(0))
    }

    fn visit_bool<E>(self, value: bool) -> Result<Kind, E> {
        Ok(Kind::BoolValue(value))
    }

    fn visit_i64<E>(self, value: i64) -> Result<Kind, E> {
        Ok(Kind::NumberValue(value as f64))
    }

    fn visit_u64<E>(self, value: u64) -> Result<Kind, E> {
        Ok(Kind::NumberValue(value as f64))
    }

    fn visit_f64<E>(self, value: f64) -> Result<Kind, E> {
        Ok(Kind::NumberValue(value))
    }

    fn visit_str<E>(self, value: &str) -> Result<Kind, E> {
        Ok(Kind::StringValue(value.to_owned()))
    }

    fn visit_string<E>(self, value: String) -> Result<Kind, E> {
        Ok(Kind::StringValue(value))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut items: A) -> Result<Kind, A::Error> {
        let mut values = Vec::with_capacity(items.size_hint().unwrap_or(0));
        while let Some(Wire(value)) = items.next_element()? {
            values.push(value);
        }
        Ok(Kind::ListValue(ListValue { values }))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut entries: A) -> Result<Kind, A::Error> {
        let mut fields = std::collections::BTreeMap::new();
        while let Some((key, Wire(value))) = entries.next_entry::<String, Wire>()? {
            fields.insert(key, value);
        }
        Ok(Kind::StructValue(Struct { fields }))
    }
}

/// The wire form of a JSON value.
pub fn from_json(json: Json) -> Value {
    let kind = match json {
        Json::Null => Kind::NullValue(0),
        Json::Bool(value) => Kind::BoolValue(value),
        Json::Number(number) => Kind::NumberValue(number.as_f64().unwrap_or(f64::NAN)),
        Json::String(text) => Kind::StringValue(text),
        Json::Array(items) => Kind::ListValue(ListValue { values: items.into_iter().map(from_json).collect() }),
        Json::Object(object) => Kind::StructValue(object_from_json(object)),
    };
    Value { kind: Some(kind) }
}

/// The wire form of a JSON object.
pub fn object_from_json(object: Map<String, Json>) -> Struct {
    Struct { fields: object.into_iter().map(|(key, value)| (key, from_json(value))).collect() }
}

/// A wire value as JSON, refusing numbers that are not finite with the
/// path of the first one (`$.scores[2]`). A value with no kind is `null`.
pub fn to_json(value: &Value) -> Result<Json, String> {
    convert(value, &mut String::from("$"))
}

/// A wire object as a JSON object, refusing numbers that are not finite.
pub fn object_to_json(object: &Struct) -> Result<Json, String> {
    convert_object(object, &mut String::from("$"))
}

/// A wire object as JSON text (`{}` when not set), refusing numbers that are
/// not finite.
pub fn struct_to_text(object: Option<&Struct>) -> Result<String, String> {
    let mut text = Vec::new();
    match object {
        None => text.extend_from_slice(b"{}"),
        Some(object) => write_object(object, &mut text, &mut String::from("$"))?,
    }
    Ok(String::from_utf8(text).unwrap_or_default())
}

/// A wire value as JSON text (`null` when not set), refusing numbers that
/// are not finite.
pub fn value_to_text(value: Option<&Value>) -> Result<String, String> {
    let mut text = Vec::new();
    match value {
        None => text.extend_from_slice(b"null"),
        Some(value) => write_value(value, &mut text, &mut String::from("$"))?,
    }
    Ok(String::from_utf8(text).unwrap_or_default())
}

/// Writes JSON text straight from the wire form, without building a
/// `serde_json::Value` first: events and results are converted on the hot
/// path.
fn write_value(value: &Value, out: &mut Vec<u8>, path: &mut String) -> Result<(), String> {
    match &value.kind {
        None | Some(Kind::NullValue(_)) => out.extend_from_slice(b"null"),
        Some(Kind::BoolValue(true)) => out.extend_from_slice(b"true"),
        Some(Kind::BoolValue(false)) => out.extend_from_slice(b"false"),
        Some(Kind::NumberValue(number)) => out.extend_from_slice(number_from(*number, path)?.to_string().as_bytes()),
        Some(Kind::StringValue(text)) => write_string(text, out),
        Some(Kind::ListValue(list)) => {
            out.push(b'[');
            for (index, item) in list.values.iter().enumerate() {
                if index > 0 {
                    out.push(b',');
                }
                let length = path.len();
                path.push_str(&format!("[{index}]"));
                write_value(item, out, path)?;
                path.truncate(length);
            }
            out.push(b']');
        }
        Some(Kind::StructValue(object)) => write_object(object, out, path)?,
    }
    Ok(())
}

fn write_object(object: &Struct, out: &mut Vec<u8>, path: &mut String) -> Result<(), String> {
    out.push(b'{');
    for (index, (key, value)) in object.fields.iter().enumerate() {
        if index > 0 {
            out.push(b',');
        }
        write_string(key, out);
        out.push(b':');
        let length = path.len();
        path.push('.');
        path.push_str(key);
        write_value(value, out, path)?;
        path.truncate(length);
    }
    out.push(b'}');
    Ok(())
}

fn write_string(text: &str, out: &mut Vec<u8>) {
    // Writing a string into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, text);
}

/// A wire value from stored JSON text, which the services wrote
/// themselves: text that is not JSON (never written) travels as a string.
pub fn stored_value(text: &str) -> Value {
    value_from_text(text).unwrap_or_else(|_| Value { kind: Some(Kind::StringValue(text.to_owned())) })
}

/// A wire object from stored JSON text: `None` for empty text, and for text
/// that is not a JSON object (never written).
pub fn stored_struct(text: &str) -> Option<Struct> {
    struct_from_text(text).ok().flatten()
}

fn convert(value: &Value, path: &mut String) -> Result<Json, String> {
    Ok(match &value.kind {
        None | Some(Kind::NullValue(_)) => Json::Null,
        Some(Kind::BoolValue(value)) => Json::Bool(*value),
        Some(Kind::NumberValue(number)) => Json::Number(number_from(*number, path)?),
        Some(Kind::StringValue(text)) => Json::String(text.clone()),
        Some(Kind::ListValue(list)) => {
            let mut items = Vec::with_capacity(list.values.len());
            for (index, item) in list.values.iter().enumerate() {
                let length = path.len();
                path.push_str(&format!("[{index}]"));
                items.push(convert(item, path)?);
                path.truncate(length);
            }
            Json::Array(items)
        }
        Some(Kind::StructValue(object)) => convert_object(object, path)?,
    })
}

fn convert_object(object: &Struct, path: &mut String) -> Result<Json, String> {
    let mut map = Map::new();
    for (key, value) in &object.fields {
        let length = path.len();
        path.push('.');
        path.push_str(key);
        map.insert(key.clone(), convert(value, path)?);
        path.truncate(length);
    }
    Ok(Json::Object(map))
}

/// An integral double within ±2^53 becomes a JSON integer (`3`, not `3.0`),
/// so integers read back as they were written.
fn number_from(number: f64, path: &str) -> Result<Number, String> {
    const EXACT: f64 = 9_007_199_254_740_992.0;
    if number.fract() == 0.0 && number.abs() <= EXACT {
        return Ok(Number::from(number as i64));
    }
    Number::from_f64(number).ok_or_else(|| format!("{path} is {number}, which JSON cannot hold"))
}

fn wire_kind(kind: Option<&Kind>) -> &'static str {
    match kind {
        None | Some(Kind::NullValue(_)) => "null",
        Some(Kind::BoolValue(_)) => "a boolean",
        Some(Kind::NumberValue(_)) => "a number",
        Some(Kind::StringValue(_)) => "a string",
        Some(Kind::ListValue(_)) => "an array",
        Some(Kind::StructValue(_)) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_text_round_trips_through_the_wire_forms() {
        let text = r#"{"count":3,"ratio":0.5,"tags":["a",null,true],"nested":{"deep":[{"x":-7}]}}"#;
        let object = struct_from_text(text).unwrap().unwrap();
        let back: Json = serde_json::from_str(&struct_to_text(Some(&object)).unwrap()).unwrap();
        assert_eq!(back, serde_json::from_str::<Json>(text).unwrap());
        // Integers stay integers.
        assert!(struct_to_text(Some(&object)).unwrap().contains("\"count\":3"));
        assert_eq!(value_to_text(Some(&value_from_text("\"plain\"").unwrap())).unwrap(), "\"plain\"");
        assert_eq!(value_to_text(None).unwrap(), "null");
        assert_eq!(struct_to_text(None).unwrap(), "{}");
        assert_eq!(struct_from_text("  ").unwrap(), None);
    }

    #[test]
    fn what_json_cannot_hold_is_refused_with_its_path() {
        assert!(struct_from_text("[1]").unwrap_err().contains("not a JSON object (it is an array)"));
        assert!(value_from_text("{").unwrap_err().contains("not JSON"));
        let infinite = Value { kind: Some(Kind::NumberValue(f64::INFINITY)) };
        let list = Value { kind: Some(Kind::ListValue(ListValue { values: vec![from_json(Json::Null), infinite] })) };
        let object = Struct { fields: [("scores".to_owned(), list)].into() };
        assert_eq!(struct_to_text(Some(&object)).unwrap_err(), "$.scores[1] is inf, which JSON cannot hold");
    }

    #[test]
    fn text_reads_as_the_parsed_json_would_convert() {
        for text in [
            r#"{"b":1,"a":[1.5,-2,18446744073709551615,"x\u00e9",null,false,{"c":{}}],"a":"last wins"}"#,
            "[]",
            "-0.0",
            r#""\ud83d\ude00""#,
            "1e308",
        ] {
            assert_eq!(value_from_text(text).unwrap(), from_json(serde_json::from_str(text).unwrap()), "{text}");
        }
        for text in ["", "{", "[1,]", "{\"a\":1}x", "nul"] {
            assert!(value_from_text(text).unwrap_err().starts_with("is not JSON"), "{text}");
        }
        let deep = "[".repeat(200) + &"]".repeat(200);
        assert!(value_from_text(&deep).is_err(), "nesting is bounded as serde_json bounds it");
    }

    #[test]
    fn stored_text_that_is_not_json_still_travels() {
        assert_eq!(stored_value("not json").kind, Some(Kind::StringValue("not json".to_owned())));
        assert_eq!(stored_struct("[1]"), None);
        assert_eq!(stored_struct(""), None);
    }
}
