//! The convention by which service errors become gRPC statuses.
//!
//! Each service has one `Error` type and one explicit `From<Error> for
//! tonic::Status` table. Client mistakes carry a precise message; internal
//! faults are logged here with their details and reach the client only as an
//! opaque message with a reference to find the log line.

use std::fmt::Display;

/// An INTERNAL status for a fault whose details must not reach the client.
pub fn internal(error: &dyn Display) -> tonic::Status {
    let reference = uuid_like_reference();
    tracing::error!(%error, reference, "internal error");
    tonic::Status::internal(format!("internal error (reference {reference}); see the service log"))
}

/// An UNAVAILABLE status for a dependency that cannot be reached now.
pub fn unavailable(what: &str, error: &dyn Display) -> tonic::Status {
    tracing::warn!(%error, dependency = what, "dependency unavailable");
    tonic::Status::unavailable(format!("{what} is unavailable; try again"))
}

/// The standard answer of an RPC that a later version implements.
pub fn unimplemented(rpc: &str) -> tonic::Status {
    tonic::Status::unimplemented(format!("{rpc} is not implemented by this server yet"))
}

fn uuid_like_reference() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_nanos() as u64)
        .unwrap_or_default();
    format!("{:x}-{:x}", nanos, COUNTER.fetch_add(1, Ordering::Relaxed))
}
