//! `--output text|json` of the read commands. JSON is the canonical protobuf
//! JSON mapping of the service's answer (as grpcurl prints it): fields in
//! lowerCamelCase (`nextPageToken`), enums by name, every field present,
//! defaults included, so scripts can rely on the keys.

/// How a read command prints its answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Output {
    /// Lines for people.
    #[default]
    Text,
    /// The answer as one JSON object.
    Json,
}

/// `message`, of the protobuf type `full_name`, as pretty JSON.
pub(crate) fn to_json(message: &impl prost::Message, full_name: &str) -> anyhow::Result<String> {
    let mut serializer = serde_json::Serializer::pretty(Vec::new());
    write_json(message, full_name, &mut serializer)?;
    Ok(String::from_utf8(serializer.into_inner())?)
}

/// [`to_json`] on one line (for a stream of answers, one per line).
pub(crate) fn to_json_line(message: &impl prost::Message, full_name: &str) -> anyhow::Result<String> {
    let mut serializer = serde_json::Serializer::new(Vec::new());
    write_json(message, full_name, &mut serializer)?;
    Ok(String::from_utf8(serializer.into_inner())?)
}

fn write_json<S: serde::Serializer>(
    message: &impl prost::Message,
    full_name: &str,
    serializer: S,
) -> anyhow::Result<()> {
    let names = muster_runtime::json::FieldNames::LowerCamel;
    muster_runtime::json::serialize_message(message, full_name, true, names, serializer).map_err(anyhow::Error::msg)?;
    Ok(())
}

/// An event's type as people read it: `step_completed`.
pub(crate) fn event_name(event_type: i32) -> String {
    let kind = muster_proto::common::v1::EventType::try_from(event_type).unwrap_or_default();
    kind.as_str_name().trim_start_matches("EVENT_TYPE_").to_lowercase()
}

/// A timestamp for people: RFC 3339, or `-` when absent.
pub(crate) fn when(timestamp: Option<&prost_types::Timestamp>) -> String {
    timestamp.map_or_else(|| "-".to_owned(), ToString::to_string)
}
