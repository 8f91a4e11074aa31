//! Compiles the contracts with protox (pure Rust, no system `protoc`),
//! generates the tonic clients and servers into `OUT_DIR`, and writes the
//! table of request field limits (`limits.rs`) from the descriptors.

use std::{fmt::Write as _, path::PathBuf};

use prost_reflect::{DescriptorPool, FieldDescriptor, Kind, MessageDescriptor, Value};

const PROTOS: &[&str] = &[
    "muster/common/v1/limits.proto",
    "muster/common/v1/common.proto",
    "muster/validator/v1/validator.proto",
    "muster/roster/v1/roster.proto",
    "muster/roster/v1/credentials.proto",
    "muster/execution/v1/execution.proto",
    "muster/notifier/v1/notifier.proto",
];

/// The defaults of `muster/common/v1/limits.proto`.
const DEFAULT_ID_BYTES: u32 = 128;
const DEFAULT_BYTES: u32 = 1024;
const DEFAULT_ITEMS: u32 = 1000;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    let mut compiler = protox::Compiler::new(["."])?;
    compiler.include_source_info(true).include_imports(true).open_files(PROTOS)?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    // Encoded by the compiler itself, so that the custom `limits` options
    // reach reflection clients.
    std::fs::write(out_dir.join("muster_descriptor.bin"), compiler.encode_file_descriptor_set())?;
    std::fs::write(out_dir.join("limits.rs"), limits_table(&compiler.descriptor_pool())?)?;
    tonic_prost_build::configure().build_server(true).build_client(true).compile_fds(compiler.file_descriptor_set())?;
    // Streams of messages that carry parts already encoded. The notifier's
    // Subscribe stream: an event encoded once for all its subscribers. The
    // execution service's ConnectWorker and RelaySteps streams: an
    // assignment's shared memory encoded once for the assignments that carry
    // it, and relayed messages passed on as they came.
    framed(
        compiler.file_descriptor_set(),
        &out_dir,
        "framed",
        true,
        &["muster/notifier/v1/notifier.proto", "muster/execution/v1/execution.proto"],
        &[
            (".muster.notifier.v1.SubscribeResponse", "crate::frame::SubscribeFrame"),
            (".muster.execution.v1.ConnectWorkerResponse", "crate::frame::WorkerFrame"),
            (".muster.execution.v1.RelayStepsResponse", "crate::frame::RelayFrame"),
        ],
    )?;
    // The notifier's IngestEvents stream, on the execution service's side:
    // an event sent as it is stored, not decoded and encoded again. The
    // execution service's ConnectWorker stream, on a worker's side: an
    // assignment's shared memory left encoded until the worker reads it, and
    // a report sent as the bytes its size was checked on.
    framed(
        compiler.file_descriptor_set(),
        &out_dir,
        "framed_client",
        false,
        &["muster/notifier/v1/notifier.proto", "muster/execution/v1/execution.proto"],
        &[
            (".muster.notifier.v1.IngestEventsRequest", "crate::frame::IngestFrame"),
            (".muster.execution.v1.ConnectWorkerRequest", "crate::frame::WorkerRequestFrame"),
            (".muster.execution.v1.ConnectWorkerResponse", "crate::frame::WorkerFrame"),
            (".muster.execution.v1.RelayStepsResponse", "crate::frame::RelayFrame"),
        ],
    )?;
    Ok(())
}

/// The services generated once more, into `OUT_DIR/<folder>`, as servers
/// or as clients, with `frames` (a message and the hand-encoded type of
/// `crate::frame` that replaces it) in the streams that carry them. Every
/// other message is the one generated above.
fn framed(
    mut set: prost_types::FileDescriptorSet,
    out_dir: &std::path::Path,
    folder: &str,
    servers: bool,
    services: &[&str],
    frames: &[(&str, &str)],
) -> Result<(), Box<dyn std::error::Error>> {
    set.file.retain(|file| file.service.is_empty() || services.contains(&file.name()));
    let framed = out_dir.join(folder);
    std::fs::create_dir_all(&framed)?;
    let mut builder = tonic_prost_build::configure()
        .build_server(servers)
        .build_client(!servers)
        .out_dir(&framed)
        .extern_path(".muster", "crate");
    for (message, frame) in frames {
        builder = builder.extern_path(*message, *frame);
    }
    builder.compile_fds(set)?;
    Ok(())
}

/// The messages that carry JSON values.
const JSON_MESSAGES: &[&str] = &["google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue"];

/// Every message a muster RPC can receive, each field with its limits.
fn limits_table(pool: &DescriptorPool) -> Result<String, Box<dyn std::error::Error>> {
    let extension = pool.get_extension_by_name("muster.common.v1.limits").ok_or("the limits option is not defined")?;
    let mut table = Table::default();
    let mut methods = Vec::new();
    for service in pool.services().filter(|service| service.package_name().starts_with("muster.")) {
        for method in service.methods() {
            let input = table.message(&method.input(), None, &extension);
            let streaming = method.is_client_streaming() || method.is_server_streaming();
            let kind = match (method.is_client_streaming(), method.is_server_streaming()) {
                (false, false) => "unary",
                (true, false) => "client_stream",
                (false, true) => "server_stream",
                (true, true) => "bidi_stream",
            };
            methods.push(format!(
                "Method {{ path: \"/{}/{}\", input: {input}, streaming: {streaming}, kind: \"{kind}\" }}",
                service.full_name(),
                method.name()
            ));
        }
    }
    let mut out = String::from("/// Every request message, by index.\npub static MESSAGES: &[Message] = &[\n");
    for message in &table.rendered {
        writeln!(out, "    {message},")?;
    }
    out.push_str("];\n\n/// Every muster method, by path, with the index of its request message.\npub static METHODS: &[Method] = &[\n");
    methods.sort();
    for method in methods {
        writeln!(out, "    {method},")?;
    }
    out.push_str("];\n");
    Ok(out)
}

#[derive(Default)]
struct Table {
    /// Full names (with the map field's limits for map entries) to indexes.
    indexes: std::collections::HashMap<String, usize>,
    rendered: Vec<String>,
}

impl Table {
    /// The index of `message`, adding it (and what it contains) when new.
    /// A map entry inherits the byte limit of its map field; inside a JSON
    /// value, whose field limits its whole encoding, every string inherits
    /// that limit and lists and maps hold any number of elements.
    fn message(
        &mut self,
        message: &MessageDescriptor,
        entry_bytes: Option<u32>,
        extension: &prost_reflect::ExtensionDescriptor,
    ) -> usize {
        let key = format!("{}/{entry_bytes:?}", message.full_name());
        if let Some(index) = self.indexes.get(&key) {
            return *index;
        }
        let index = self.rendered.len();
        self.indexes.insert(key, index);
        self.rendered.push(String::new());
        let mut fields: Vec<FieldDescriptor> = message.fields().collect();
        fields.sort_by_key(FieldDescriptor::number);
        let mut rendered = Vec::new();
        for field in fields {
            let (max_bytes, max_items) = limits(&field, extension);
            let max_bytes = entry_bytes.or(max_bytes).unwrap_or_else(|| default_bytes(&field));
            let inside_json = JSON_MESSAGES.contains(&message.full_name());
            let kind = match field.kind() {
                Kind::String => "Kind::Text".to_owned(),
                Kind::Bytes => "Kind::Bytes".to_owned(),
                Kind::Message(inner) if JSON_MESSAGES.contains(&inner.full_name()) => {
                    let index = self.message(&inner, Some(max_bytes), extension);
                    if inside_json { format!("Kind::Message({index})") } else { format!("Kind::Json({index})") }
                }
                Kind::Message(inner) if inside_json => {
                    format!("Kind::Message({})", self.message(&inner, Some(max_bytes), extension))
                }
                Kind::Message(inner) => {
                    let inherited =
                        inner.is_map_entry().then_some(max_bytes).filter(|_| max_bytes_set(&field, extension));
                    format!("Kind::Message({})", self.message(&inner, inherited, extension))
                }
                Kind::Double | Kind::Fixed64 | Kind::Sfixed64 => "Kind::Fixed64".to_owned(),
                Kind::Float | Kind::Fixed32 | Kind::Sfixed32 => "Kind::Fixed32".to_owned(),
                _ => "Kind::Varint".to_owned(),
            };
            let max_items = match (field.is_list() || field.is_map(), inside_json) {
                (false, _) => 1,
                (true, true) => u32::MAX,
                (true, false) => max_items.unwrap_or(DEFAULT_ITEMS),
            };
            rendered.push(format!(
                "Field {{ number: {}, name: \"{}\", kind: {kind}, max_bytes: {max_bytes}, max_items: {max_items} }}",
                field.number(),
                field.name()
            ));
        }
        self.rendered[index] =
            format!("Message {{ name: \"{}\", fields: &[{}] }}", message.full_name(), rendered.join(", "));
        index
    }
}

/// The field's declared `(max_bytes, max_items)`, where set.
fn limits(field: &FieldDescriptor, extension: &prost_reflect::ExtensionDescriptor) -> (Option<u32>, Option<u32>) {
    let options = field.options();
    if !options.has_extension(extension) {
        return (None, None);
    }
    let declared = options.get_extension(extension);
    let read = |name: &str| match declared.as_message().and_then(|limits| limits.get_field_by_name(name)) {
        Some(value) => match value.as_ref() {
            Value::U32(0) => None,
            Value::U32(limit) => Some(*limit),
            _ => None,
        },
        None => None,
    };
    (read("max_bytes"), read("max_items"))
}

fn max_bytes_set(field: &FieldDescriptor, extension: &prost_reflect::ExtensionDescriptor) -> bool {
    limits(field, extension).0.is_some()
}

fn default_bytes(field: &FieldDescriptor) -> u32 {
    let name = field.name();
    if name == "id" || name.ends_with("_id") || name.ends_with("_ids") || name.ends_with("_key") {
        DEFAULT_ID_BYTES
    } else {
        DEFAULT_BYTES
    }
}
