//! The roster's one error type and its mapping to gRPC statuses.

/// Everything that can go wrong in the roster.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is malformed; the message names the field.
    #[error("{0}")]
    InvalidArgument(String),
    /// Something the request names does not exist.
    #[error("{0}")]
    NotFound(String),
    /// Something the request creates exists already.
    #[error("{0}")]
    AlreadyExists(String),
    /// The request is well formed but the roster's state refuses it.
    #[error("{0}")]
    FailedPrecondition(String),
    /// A token is unknown, rotated or revoked.
    #[error("{0}")]
    Unauthenticated(String),
    /// The database failed.
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    /// The server or its database setup failed.
    #[error("{0}")]
    Runtime(#[from] muster_runtime::Error),
    /// A fault inside the roster (a corrupt row, a broken invariant).
    #[error("internal: {0}")]
    Internal(String),
}

/// The roster's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<Error> for tonic::Status {
    fn from(error: Error) -> Self {
        match error {
            Error::InvalidArgument(message) => tonic::Status::invalid_argument(message),
            Error::NotFound(message) => tonic::Status::not_found(message),
            Error::AlreadyExists(message) => tonic::Status::already_exists(message),
            Error::FailedPrecondition(message) => tonic::Status::failed_precondition(message),
            Error::Unauthenticated(message) => tonic::Status::unauthenticated(message),
            Error::Database(error) => muster_runtime::status::internal(&error),
            Error::Runtime(error) => muster_runtime::status::internal(&error),
            Error::Internal(message) => muster_runtime::status::internal(&message),
        }
    }
}
