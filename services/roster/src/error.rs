//! The roster's one error type and its mapping to gRPC statuses.
//!
//! Every status a client can act on carries the standard `google.rpc.Status`
//! details (see [`muster_runtime::status`]): INVALID_ARGUMENT a `BadRequest`
//! naming the request field, NOT_FOUND a `ResourceInfo`, FAILED_PRECONDITION
//! a `PreconditionFailure`, ALREADY_EXISTS a `ResourceInfo`, UNAUTHENTICATED an
//! `ErrorInfo`.

/// The resource type of an agent, in NOT_FOUND and ALREADY_EXISTS details.
pub const AGENT: &str = "muster.roster.v1.Agent";
/// The resource type of a team.
pub const TEAM: &str = "muster.roster.v1.Team";
/// The resource type of a role definition.
pub const ROLE_DEFINITION: &str = "muster.roster.v1.RoleDefinition";
/// The resource type of a task queued by a delegation (`WatchQueuedTask`).
pub const QUEUED_TASK: &str = "muster.roster.v1.QueuedTask";

/// Everything that can go wrong in the roster.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A field of the request is malformed; the message names the field.
    #[error("{message}")]
    InvalidArgument {
        /// The request field, as a path (`agent.id`, `requests[3].task_id`).
        field: String,
        /// What is wrong with it, for people.
        message: String,
    },
    /// Something the request names does not exist.
    #[error("{message}")]
    NotFound {
        /// The resource type, as its protobuf type ([`AGENT`], [`TEAM`]).
        kind: &'static str,
        /// The id or name asked for.
        name: String,
        /// For people.
        message: String,
    },
    /// Something the request creates exists already.
    #[error("{message}")]
    AlreadyExists {
        /// The resource type, as its protobuf type ([`AGENT`]).
        kind: &'static str,
        /// Its id or name; empty when the refusal is about several.
        name: String,
        /// For people.
        message: String,
    },
    /// The request is well formed but the roster's state refuses it.
    #[error("{message}")]
    FailedPrecondition {
        /// Which condition does not hold (`AGENT_HAS_JUNIORS`).
        kind: &'static str,
        /// What it is about (`agent/<id>`, `team/<name>`).
        subject: String,
        /// Why, for people.
        message: String,
    },
    /// A token is unknown, rotated or revoked.
    #[error("{message}")]
    Unauthenticated {
        /// Why (`CREDENTIAL_UNKNOWN`), in the status's `ErrorInfo`.
        reason: &'static str,
        /// For people.
        message: String,
    },
    /// The roster cannot answer now; the same call may succeed when tried
    /// again (UNAVAILABLE with a `RetryInfo`).
    #[error("{message}")]
    RetryLater {
        /// Why (`SHUTTING_DOWN`, `ROSTER_BUSY`), in the status's `ErrorInfo`.
        reason: &'static str,
        /// For people.
        message: String,
    },
    /// The database failed.
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    /// The database failed, in a transaction run on the calling thread.
    #[error("database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The server or its database setup failed.
    #[error("{0}")]
    Runtime(#[from] muster_runtime::Error),
    /// A fault inside the roster (a corrupt row, a broken invariant).
    #[error("internal: {0}")]
    Internal(String),
}

impl Error {
    /// INVALID_ARGUMENT about the request field `field` (`agent.id`).
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::InvalidArgument { field: field.into(), message: message.into() }
    }

    /// NOT_FOUND: no `kind` ([`AGENT`]) named `name`.
    pub fn not_found(kind: &'static str, name: impl Into<String>, message: impl Into<String>) -> Self {
        Self::NotFound { kind, name: name.into(), message: message.into() }
    }

    /// ALREADY_EXISTS: a `kind` ([`AGENT`]) named `name` exists already.
    pub fn already_exists(kind: &'static str, name: impl Into<String>, message: impl Into<String>) -> Self {
        Self::AlreadyExists { kind, name: name.into(), message: message.into() }
    }

    /// FAILED_PRECONDITION: the condition `kind` (`TEAM_NOT_EMPTY`) does not
    /// hold for `subject` (`team/<name>`).
    pub fn precondition(kind: &'static str, subject: impl Into<String>, message: impl Into<String>) -> Self {
        Self::FailedPrecondition { kind, subject: subject.into(), message: message.into() }
    }

    /// This error, when it is about a request field, as one about `field`
    /// instead (its message unchanged): for a check written for one request
    /// that another request reaches with its fields elsewhere.
    pub fn on_field(self, field: impl Into<String>) -> Self {
        match self {
            Self::InvalidArgument { message, .. } => Self::InvalidArgument { field: field.into(), message },
            other => other,
        }
    }
}

impl From<muster_format::roster::model::Invalid> for Error {
    fn from(invalid: muster_format::roster::model::Invalid) -> Self {
        Self::InvalidArgument { field: invalid.field, message: invalid.message }
    }
}

/// The roster's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<Error> for tonic::Status {
    fn from(error: Error) -> Self {
        use muster_runtime::status;
        match error {
            Error::InvalidArgument { field, message } => status::invalid_field(&field, &message),
            Error::NotFound { kind, name, message } => status::not_found(kind, &name, &message),
            Error::AlreadyExists { kind, name, message } => status::already_exists(kind, &name, &message),
            Error::FailedPrecondition { kind, subject, message } => {
                status::failed_precondition(kind, &subject, &message)
            }
            Error::Unauthenticated { reason, message } => {
                muster_runtime::auth::unauthenticated(reason, status::truncate(&message, status::MAX_MESSAGE_BYTES))
            }
            Error::RetryLater { reason, message } => status::retry_later(message, reason, &[]),
            Error::Database(error) => status::database(&error),
            Error::Sqlite(error) => status::internal(&error),
            Error::Runtime(error) => status::internal(&error),
            Error::Internal(message) => status::internal(&message),
        }
    }
}

#[cfg(test)]
mod tests {
    use tonic_types::StatusExt as _;

    use super::*;

    #[test]
    fn invalid_argument_names_the_request_field() {
        let status = tonic::Status::from(Error::invalid("agent.id", "agent.id: required"));
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert_eq!(status.message(), "agent.id: required");
        let violations = status.get_details_bad_request().expect("a BadRequest").field_violations;
        assert_eq!(violations.len(), 1);
        assert_eq!(violations[0].field, "agent.id");
        assert_eq!(violations[0].description, "agent.id: required");
    }

    #[test]
    fn on_field_moves_an_invalid_argument_and_keeps_its_message() {
        let moved = Error::invalid("agent.team", "agent.team: no such team").on_field("files");
        assert!(matches!(&moved, Error::InvalidArgument { field, .. } if field == "files"));
        assert_eq!(moved.to_string(), "agent.team: no such team");
        assert!(matches!(
            Error::not_found(AGENT, "ghost", "gone").on_field("files"),
            Error::NotFound { kind: AGENT, .. }
        ));
    }

    #[test]
    fn not_found_names_the_resource() {
        let status = tonic::Status::from(Error::not_found(AGENT, "ghost", "agent \"ghost\" is not in the roster"));
        assert_eq!(status.code(), tonic::Code::NotFound);
        assert_eq!(status.message(), "agent \"ghost\" is not in the roster");
        let info = status.get_details_resource_info().expect("a ResourceInfo");
        assert_eq!((info.resource_type.as_str(), info.resource_name.as_str()), (AGENT, "ghost"));
    }

    #[test]
    fn failed_precondition_names_the_condition_and_its_subject() {
        let status =
            tonic::Status::from(Error::precondition("TEAM_NOT_EMPTY", "team/core", "team \"core\" still has agents"));
        assert_eq!(status.code(), tonic::Code::FailedPrecondition);
        let violations = status.get_details_precondition_failure().expect("a PreconditionFailure").violations;
        assert_eq!(violations.len(), 1);
        assert_eq!(violations[0].r#type, "TEAM_NOT_EMPTY");
        assert_eq!(violations[0].subject, "team/core");
        assert_eq!(violations[0].description, "team \"core\" still has agents");
    }

    #[test]
    fn already_exists_names_the_resource() {
        let status = tonic::Status::from(Error::already_exists(AGENT, "dev", "agent \"dev\" already exists"));
        assert_eq!(status.code(), tonic::Code::AlreadyExists);
        assert_eq!(status.message(), "agent \"dev\" already exists");
        let resource = status.get_details_resource_info().expect("a ResourceInfo");
        assert_eq!((resource.resource_type.as_str(), resource.resource_name.as_str()), (AGENT, "dev"));
    }

    #[test]
    fn unauthenticated_carries_its_reason() {
        let status = tonic::Status::from(Error::Unauthenticated {
            reason: "CREDENTIAL_UNKNOWN",
            message: "the token is not valid".to_owned(),
        });
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
        assert_eq!(status.message(), "the token is not valid");
        let info = status.get_details_error_info().expect("an ErrorInfo");
        assert_eq!(info.reason, "CREDENTIAL_UNKNOWN");
    }

    #[test]
    fn internal_faults_carry_no_details_and_long_messages_are_cut() {
        let status = tonic::Status::from(Error::Internal("a broken invariant".to_owned()));
        assert_eq!(status.code(), tonic::Code::Internal);
        assert!(!status.message().contains("broken"), "{}", status.message());
        let long = "x".repeat(5000);
        let status = tonic::Status::from(Error::invalid("team.description", long));
        assert!(status.message().len() <= muster_runtime::status::MAX_MESSAGE_BYTES);
        let status = tonic::Status::from(Error::already_exists(TEAM, "core", "y".repeat(5000)));
        assert!(status.message().len() <= muster_runtime::status::MAX_MESSAGE_BYTES);
    }
}
