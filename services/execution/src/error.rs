//! The execution service's errors, and the one table that turns them into
//! gRPC statuses.

use muster_runtime::auth::Caller;

use crate::domain::model::Finding;

/// Everything that can go wrong in the execution service.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A field of the request is malformed.
    #[error("{message}")]
    InvalidArgument {
        /// The request field, as a path (`budget.name`).
        field: String,
        /// What is wrong with it, for people.
        message: String,
    },
    /// The process definition has errors.
    #[error("the process has {}", summary(.0))]
    InvalidProcess(Vec<Finding>),
    /// A permission matrix has errors.
    #[error("the permission matrix has {}", summary(.0))]
    InvalidMatrix(Vec<Finding>),
    /// A named thing does not exist.
    #[error("{message}")]
    NotFound {
        /// The kind of thing, as its protobuf type (`muster.execution.v1.Execution`).
        kind: &'static str,
        /// The name or id asked for.
        name: String,
        /// For people.
        message: String,
    },
    /// The request cannot be carried out in the current state.
    #[error("{message}")]
    FailedPrecondition {
        /// Which condition does not hold (`EXECUTION_ENDED`).
        kind: &'static str,
        /// What it is about (`execution/<id>`).
        subject: String,
        /// Why, for people.
        message: String,
    },
    /// A run (or a step) would start past a limit of its process's (or its
    /// agent's) budget.
    #[error("budget of {} exhausted: {description}", crate::domain::budget::owner(key))]
    BudgetExhausted {
        /// The budget's key: the process, or `agent:<id>`.
        key: String,
        /// The limit reached, such as `3 of 3 runs in the last 3600 s`.
        description: String,
    },
    /// A run would start sooner, or with more runs underway, than its
    /// process's throttle allows.
    #[error("process '{process}' is throttled: {description}")]
    Throttled {
        /// The process.
        process: String,
        /// The limit, such as `2 of 2 runs underway`.
        description: String,
        /// When a run may start, if that is known.
        retry_after: Option<std::time::Duration>,
    },
    /// Another replica did it first (a schedule's due time fired).
    #[error("{0}")]
    Superseded(String),
    /// A position past the end of what is read.
    #[error("{message}")]
    OutOfRange {
        /// The request field (`offset`).
        field: &'static str,
        /// For people.
        message: String,
    },
    /// The caller may not do this.
    #[error("{} may not {}: {}", .0.caller, .0.action, .0.message)]
    PermissionDenied(Box<Refusal>),
    /// A credential presented in a request (not the call's own) is not good.
    #[error("{message}")]
    Unauthenticated {
        /// The stable reason, such as `CREDENTIAL_UNKNOWN`.
        reason: &'static str,
        /// What is wrong with it.
        message: String,
        /// Whose credential it is, for the `ErrorInfo` detail (`agent_id`).
        metadata: Vec<(&'static str, String)>,
    },
    /// A service muster depends on cannot be reached.
    #[error("{service} is unavailable: {detail}")]
    Unavailable {
        /// Which service.
        service: &'static str,
        /// What happened.
        detail: String,
    },
    /// The execution is not driven by this replica now (another replica
    /// drives it, or this one is stopping).
    #[error("execution '{0}' is not driven by this replica now; try again (another replica may drive it)")]
    NotRunningHere(String),
    /// The database failed.
    #[error("storage: {0}")]
    Storage(String),
}

/// Why a caller may not do something.
#[derive(Debug)]
pub struct Refusal {
    /// Who asked.
    pub caller: Caller,
    /// What it asked to do.
    pub action: String,
    /// The stable reason, such as `NOT_THE_LEAD`.
    pub reason: &'static str,
    /// Why not, for people.
    pub message: String,
    /// More about the refusal, for the `ErrorInfo` detail.
    pub metadata: Vec<(&'static str, String)>,
}

/// `2 error(s); first: 3:5: ...`, the first error cut to a sentence's length.
fn summary(findings: &[Finding]) -> String {
    let errors = findings.iter().filter(|finding| finding.error).count();
    let first = findings
        .iter()
        .find(|finding| finding.error)
        .map(|finding| {
            let message = muster_runtime::status::truncate(&finding.message, 512);
            format!("{}:{}: {message}", finding.line, finding.column)
        })
        .unwrap_or_default();
    format!("{errors} error(s); first: {first}")
}

impl Error {
    /// INVALID_ARGUMENT about the request field `field`.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::InvalidArgument { field: field.into(), message: message.into() }
    }

    /// NOT_FOUND: no `kind` named `name`.
    pub fn not_found(kind: &'static str, name: impl Into<String>, message: impl Into<String>) -> Self {
        Self::NotFound { kind, name: name.into(), message: message.into() }
    }

    /// FAILED_PRECONDITION: the condition `kind` does not hold for `subject`.
    pub fn precondition(kind: &'static str, subject: impl Into<String>, message: impl Into<String>) -> Self {
        Self::FailedPrecondition { kind, subject: subject.into(), message: message.into() }
    }

    /// FAILED_PRECONDITION `NOT_A_SESSION`: what `needs` is done in sessions only.
    pub fn not_a_session(execution_id: &str, needs: &str) -> Self {
        Self::precondition(
            "NOT_A_SESSION",
            format!("execution/{execution_id}"),
            format!("execution '{execution_id}' is not a session: {needs} (StartSession)"),
        )
    }

    /// NOT_FOUND: no subtask request `request_id` in the execution.
    pub fn no_subtask_request(execution_id: &str, request_id: &str) -> Self {
        Self::not_found(
            "muster.execution.v1.SubtaskRequest",
            request_id,
            format!("execution '{execution_id}' has no subtask request '{request_id}'"),
        )
    }
}

/// The execution service's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<Error> for tonic::Status {
    fn from(error: Error) -> Self {
        use muster_runtime::status::{self, MAX_MESSAGE_BYTES, truncate};
        let message = truncate(&error.to_string(), MAX_MESSAGE_BYTES).into_owned();
        let document = |reason: &str, found: &[Finding]| {
            let diagnostics: Vec<_> = found.iter().map(crate::grpc::convert::finding_to_wire).collect();
            status::refused_document(&message, reason, "source", &diagnostics)
        };
        match error {
            Error::InvalidArgument { field, message } => status::invalid_field(&field, &message),
            Error::InvalidProcess(ref found) => document("INVALID_PROCESS", found),
            Error::InvalidMatrix(ref found) => document("INVALID_MATRIX", found),
            Error::NotFound { kind, name, message } => status::not_found(kind, &name, &message),
            Error::FailedPrecondition { kind, subject, message } => {
                status::failed_precondition(kind, &subject, &message)
            }
            Error::Superseded(_) => tonic::Status::aborted(message),
            Error::OutOfRange { field, message } => status::out_of_range(field, &message),
            Error::BudgetExhausted { ref key, ref description } => {
                let subject = if key.starts_with("agent:") { key.clone() } else { format!("process:{key}") };
                status::quota_exhausted(&message, &subject, description, None)
            }
            Error::Throttled { ref process, ref description, retry_after } => {
                status::quota_exhausted(&message, &format!("process:{process}"), description, retry_after)
            }
            Error::PermissionDenied(refusal) => {
                let Refusal { caller, action, reason, message, metadata } = *refusal;
                let metadata: Vec<(&str, String)> = metadata.into_iter().collect();
                let message = truncate(&message, MAX_MESSAGE_BYTES).into_owned();
                muster_runtime::auth::permission_denied(&caller, &action, reason, message, &metadata)
            }
            Error::Unauthenticated { reason, metadata, .. } => {
                muster_runtime::auth::unauthenticated_with(reason, message, &metadata)
            }
            Error::Unavailable { service, detail } => status::unavailable(service, &detail),
            Error::NotRunningHere(ref id) => {
                status::retry_later(message.clone(), "NOT_RUNNING_HERE", &[("execution_id", id)])
            }
            Error::Storage(detail) => status::internal(&detail),
        }
    }
}
