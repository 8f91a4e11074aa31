//! JSON Schemas of the contracts' messages, made from their descriptors (and
//! the comments of the `.proto` files), describing the JSON that
//! [`crate::json::message_from_json`] reads: for front ends that take a
//! message's fields as JSON arguments, such as tools offered over MCP.

use prost_reflect::{Cardinality, FieldDescriptor, Kind, MessageDescriptor};
use serde_json::{Map, Value as Json, json};

/// How deep messages inside messages are described; deeper ones are any object.
const MAX_DEPTH: usize = 6;

/// The schema of the contracts' message `full_name` with the `.proto` field
/// names, without the fields named in `leave_out` (those the caller fills
/// itself). Unknown fields are not allowed, as the reader refuses them.
pub fn message_schema(full_name: &str, leave_out: &[&str]) -> Result<Json, String> {
    let message = crate::json::message_descriptor(full_name)?;
    let mut schema = object_schema(&message, leave_out, 0);
    if let Some(description) = comment(message.parent_file_descriptor_proto(), message.path()) {
        schema["description"] = Json::String(description);
    }
    Ok(schema)
}

fn object_schema(message: &MessageDescriptor, leave_out: &[&str], depth: usize) -> Json {
    let mut properties = Map::new();
    let mut required = Vec::new();
    for field in message.fields().filter(|field| !leave_out.contains(&field.name())) {
        let mut schema = field_schema(&field, depth);
        if let Some(description) = comment(field.parent_message().parent_file_descriptor_proto(), field.path()) {
            // The contracts' comments begin with "Required." where proto3 cannot say it.
            if description.starts_with("Required.") || field.cardinality() == Cardinality::Required {
                required.push(Json::String(field.name().to_owned()));
            }
            schema["description"] = Json::String(description);
        }
        properties.insert(field.name().to_owned(), schema);
    }
    let mut schema = json!({"type": "object", "properties": properties, "additionalProperties": false});
    if !required.is_empty() {
        schema["required"] = Json::Array(required);
    }
    schema
}

fn field_schema(field: &FieldDescriptor, depth: usize) -> Json {
    if field.is_map()
        && let Kind::Message(entry) = field.kind()
    {
        let value = kind_schema(&entry.map_entry_value_field().kind(), depth);
        return json!({"type": "object", "additionalProperties": value});
    }
    let item = kind_schema(&field.kind(), depth);
    if field.is_list() { json!({"type": "array", "items": item}) } else { item }
}

fn kind_schema(kind: &Kind, depth: usize) -> Json {
    match kind {
        Kind::Double | Kind::Float => json!({"type": "number"}),
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => {
            json!({"type": "integer", "minimum": i32::MIN, "maximum": i32::MAX})
        }
        Kind::Uint32 | Kind::Fixed32 => json!({"type": "integer", "minimum": 0, "maximum": u32::MAX}),
        // The JSON mapping writes 64-bit integers as strings and reads either.
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => json!({"type": ["integer", "string"]}),
        Kind::Uint64 | Kind::Fixed64 => json!({"type": ["integer", "string"], "minimum": 0}),
        Kind::Bool => json!({"type": "boolean"}),
        Kind::String => json!({"type": "string"}),
        Kind::Bytes => json!({"type": "string", "contentEncoding": "base64"}),
        Kind::Enum(descriptor) => {
            let names: Vec<Json> = descriptor.values().map(|value| Json::String(value.name().to_owned())).collect();
            json!({"type": "string", "enum": names})
        }
        Kind::Message(message) => match message.full_name() {
            "google.protobuf.Struct" => json!({"type": "object"}),
            "google.protobuf.Value" => json!({}),
            "google.protobuf.ListValue" => json!({"type": "array"}),
            "google.protobuf.Timestamp" => json!({"type": "string", "format": "date-time"}),
            "google.protobuf.Duration" => json!({"type": "string", "pattern": "^-?[0-9]+(\\.[0-9]+)?s$"}),
            _ if depth >= MAX_DEPTH => json!({"type": "object"}),
            _ => object_schema(message, &[], depth + 1),
        },
    }
}

/// The comment written before the element at `path` of `file`, on one line.
fn comment(file: &prost_types::FileDescriptorProto, path: &[i32]) -> Option<String> {
    let location = file.source_code_info.as_ref()?.location.iter().find(|location| location.path == path)?;
    let text = location.leading_comments.as_deref()?;
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    (!text.is_empty()).then_some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_is_described_field_by_field_from_its_descriptor() {
        let schema = message_schema("muster.execution.v1.StepFailure", &["assignment_id"]).unwrap();
        assert_eq!(schema["type"], "object");
        assert_eq!(schema["additionalProperties"], false);
        let properties = schema["properties"].as_object().unwrap();
        assert!(!properties.contains_key("assignment_id"), "left out: {schema}");
        assert!(schema.get("required").is_none(), "{schema}");
        let whole = message_schema("muster.execution.v1.StepFailure", &[]).unwrap();
        assert_eq!(whole["required"], json!(["assignment_id"]), "{whole}");
        assert_eq!(properties["error_code"]["type"], "string");
        assert_eq!(properties["retryable"]["type"], "boolean");
        assert!(properties["error_code"]["description"].as_str().is_some_and(|text| !text.is_empty()), "{schema}");
    }

    #[test]
    fn enums_lists_and_wire_json_have_their_json_forms() {
        let schema = message_schema("muster.execution.v1.StepResult", &[]).unwrap();
        let properties = &schema["properties"];
        assert_eq!(properties["output"], json!({"description": properties["output"]["description"].clone()}));
        assert_eq!(properties["remember"]["type"], "array");
        assert_eq!(properties["remember"]["items"]["properties"]["scope"]["type"], "string");
        let scopes = properties["remember"]["items"]["properties"]["scope"]["enum"].as_array().unwrap();
        assert!(scopes.contains(&json!("MEMORY_SCOPE_GLOBAL")), "{scopes:?}");
        assert_eq!(properties["tokens_used"]["type"], json!(["integer", "string"]));
    }

    #[test]
    fn an_unknown_type_is_an_error() {
        assert!(message_schema("muster.nothing.v1.Nothing", &[]).unwrap_err().contains("muster.nothing.v1.Nothing"));
    }
}
