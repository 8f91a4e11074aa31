//! The notifier's one error type and its mapping to gRPC statuses.

/// Everything that can go wrong in the notifier.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A field of the request is invalid; the message says what.
    #[error("{message}")]
    InvalidArgument {
        /// The request field, as a path (`event.event_id`, `agent_id`).
        field: String,
        /// What is wrong with it, for people.
        message: String,
    },
    /// A cursor past what exists (it may become valid later).
    #[error("{message}")]
    OutOfRange {
        /// The request field (`cursor`).
        field: &'static str,
        /// For people.
        message: String,
    },
    /// The database failed.
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    /// The database failed, in a transaction run on the calling thread.
    #[error("database: {0}")]
    Sqlite(#[from] rusqlite::Error),
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

impl Error {
    /// INVALID_ARGUMENT about the request field `field` (`event.occurred_at`).
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::InvalidArgument { field: field.into(), message: message.into() }
    }
}

/// The notifier's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<Error> for tonic::Status {
    fn from(error: Error) -> Self {
        use muster_runtime::status;
        match error {
            Error::InvalidArgument { field, message } => status::invalid_field(&field, &message),
            Error::OutOfRange { field, message } => status::out_of_range(field, &message),
            Error::ShuttingDown => {
                status::retry_later("the notifier is shutting down; try again", "SHUTTING_DOWN", &[])
            }
            Error::Database(_) | Error::Sqlite(_) | Error::StoreUnavailable(_) => {
                status::unavailable("the notifier database", &error)
            }
            Error::Runtime(_) | Error::Io { .. } | Error::Corrupt(_) => status::internal(&error),
        }
    }
}

#[cfg(test)]
mod tests {
    use tonic_types::StatusExt as _;

    use super::*;

    #[test]
    fn invalid_argument_names_the_request_field() {
        let status =
            tonic::Status::from(Error::invalid("event.occurred_at", "event e1: event.occurred_at is required"));
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert_eq!(status.message(), "event e1: event.occurred_at is required");
        let violations = status.get_details_bad_request().expect("a BadRequest").field_violations;
        assert_eq!(violations.len(), 1);
        assert_eq!(violations[0].field, "event.occurred_at");
        assert_eq!(violations[0].description, "event e1: event.occurred_at is required");
    }

    #[test]
    fn a_cursor_past_the_newest_names_the_field() {
        let status = tonic::Status::from(Error::OutOfRange { field: "cursor", message: "cursor 9 is past".to_owned() });
        assert_eq!(status.code(), tonic::Code::OutOfRange);
        assert_eq!(status.get_details_bad_request().expect("a BadRequest").field_violations[0].field, "cursor");
    }

    #[test]
    fn shutting_down_asks_to_retry_later() {
        let status = tonic::Status::from(Error::ShuttingDown);
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert_eq!(status.message(), "the notifier is shutting down; try again");
        assert_eq!(status.get_details_error_info().expect("an ErrorInfo").reason, "SHUTTING_DOWN");
        assert!(
            status.get_details_retry_info().expect("a RetryInfo").retry_delay.is_some_and(|delay| !delay.is_zero())
        );
    }
}
