//! The validator's one error type and its mapping to gRPC statuses.

/// What can go wrong in the validator service (not in a document: findings
/// about documents are diagnostics, never errors).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server could not start or stopped with a fault.
    #[error(transparent)]
    Runtime(#[from] muster_runtime::Error),
    /// A field of the request was malformed (not the document it carries).
    #[error("{message}")]
    InvalidRequest {
        /// The request field, as a path (`context.agents[2].id`, `format`).
        field: String,
        /// What is wrong with it, for people.
        message: String,
    },
}

impl Error {
    /// INVALID_ARGUMENT about the request field `field`.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::InvalidRequest { field: field.into(), message: message.into() }
    }
}

/// The validator's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<Error> for tonic::Status {
    fn from(error: Error) -> Self {
        match error {
            Error::InvalidRequest { field, message } => muster_runtime::status::invalid_field(&field, &message),
            Error::Runtime(error) => muster_runtime::status::internal(&error),
        }
    }
}
