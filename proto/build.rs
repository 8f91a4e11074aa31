//! Compiles the contracts with protox (pure Rust, no system `protoc`) and
//! generates the tonic clients and servers into `OUT_DIR`.

use std::path::PathBuf;

const PROTOS: &[&str] = &[
    "muster/common/v1/common.proto",
    "muster/validator/v1/validator.proto",
    "muster/roster/v1/roster.proto",
    "muster/roster/v1/credentials.proto",
    "muster/execution/v1/execution.proto",
    "muster/notifier/v1/notifier.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    let file_descriptors = protox::compile(PROTOS, ["."])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out_dir.join("muster_descriptor.bin"), prost::Message::encode_to_vec(&file_descriptors))?;
    tonic_prost_build::configure().build_server(true).build_client(true).compile_fds(file_descriptors)?;
    Ok(())
}
