//! The validator's one error type and its mapping to gRPC statuses.

/// What can go wrong in the validator service (not in a document: findings
/// about documents are diagnostics, never errors).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server could not start or stopped with a fault.
    #[error(transparent)]
    Runtime(#[from] muster_runtime::Error),
    /// A request was malformed (not the document it carries).
    #[error("{0}")]
    InvalidRequest(String),
}

/// The validator's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<Error> for tonic::Status {
    fn from(error: Error) -> Self {
        match error {
            Error::InvalidRequest(message) => tonic::Status::invalid_argument(message),
            Error::Runtime(error) => muster_runtime::status::internal(&error),
        }
    }
}
