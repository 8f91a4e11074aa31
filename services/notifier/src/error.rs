//! The notifier's one error type and its mapping to gRPC statuses.

/// Everything that can go wrong in the notifier.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The caller sent something invalid; the message says what.
    #[error("{0}")]
    InvalidArgument(String),
    /// A cursor past what exists (it may become valid later).
    #[error("{0}")]
    OutOfRange(String),
    /// The database failed.
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    /// Setting up or migrating the database failed.
    #[error("runtime: {0}")]
    Runtime(#[from] muster_runtime::Error),
    /// A memory file could not be written.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The cause.
        source: std::io::Error,
    },
    /// Stored data could not be read back (a corrupt row).
    #[error("corrupt stored data: {0}")]
    Corrupt(String),
    /// Storing failed; the caller may resend (events are deduplicated).
    #[error("storing events failed: {0}")]
    StoreUnavailable(String),
    /// The service is stopping.
    #[error("the notifier is shutting down")]
    ShuttingDown,
}

/// The notifier's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<Error> for tonic::Status {
    fn from(error: Error) -> Self {
        match error {
            Error::InvalidArgument(message) => tonic::Status::invalid_argument(message),
            Error::OutOfRange(message) => tonic::Status::out_of_range(message),
            Error::ShuttingDown => tonic::Status::unavailable("the notifier is shutting down; try again"),
            Error::Database(_) | Error::StoreUnavailable(_) => {
                muster_runtime::status::unavailable("the notifier database", &error)
            }
            Error::Runtime(_) | Error::Io { .. } | Error::Corrupt(_) => muster_runtime::status::internal(&error),
        }
    }
}
