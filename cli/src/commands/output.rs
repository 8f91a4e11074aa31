//! `--output text|json` of the read commands. JSON is the canonical protobuf
//! JSON mapping of the service's answer (as grpcurl prints it), with the
//! field names of the `.proto` files and every field present, defaults
//! included, so scripts can rely on the keys.

use std::sync::LazyLock;

use anyhow::Context as _;
use prost_reflect::{DescriptorPool, DynamicMessage, SerializeOptions};

/// How a read command prints its answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Output {
    /// Lines for people.
    #[default]
    Text,
    /// The answer as one JSON object.
    Json,
}

static POOL: LazyLock<Result<DescriptorPool, prost_reflect::DescriptorError>> =
    LazyLock::new(|| DescriptorPool::decode(muster_proto::FILE_DESCRIPTOR_SET));

/// `message`, of the protobuf type `full_name`, as pretty JSON.
pub(crate) fn to_json(message: &impl prost::Message, full_name: &str) -> anyhow::Result<String> {
    let pool = POOL.as_ref().map_err(|error| anyhow::anyhow!("muster's own descriptors: {error}"))?;
    let descriptor = pool.get_message_by_name(full_name).with_context(|| format!("no message type {full_name}"))?;
    let dynamic = DynamicMessage::decode(descriptor, message.encode_to_vec().as_slice())?;
    let mut serializer = serde_json::Serializer::pretty(Vec::new());
    let options = SerializeOptions::new().use_proto_field_name(true).skip_default_fields(false);
    dynamic.serialize_with_options(&mut serializer, &options)?;
    Ok(String::from_utf8(serializer.into_inner())?)
}

/// A timestamp for people: RFC 3339, or `-` when absent.
pub(crate) fn when(timestamp: Option<&prost_types::Timestamp>) -> String {
    timestamp.map_or_else(|| "-".to_owned(), ToString::to_string)
}
