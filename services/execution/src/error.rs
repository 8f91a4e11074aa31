//! The execution service's errors, and the one table that turns them into
//! gRPC statuses.

use muster_runtime::auth::Caller;

use crate::domain::model::Finding;

/// Everything that can go wrong in the execution service.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// The request is malformed.
    #[error("{0}")]
    InvalidArgument(String),
    /// The process definition has errors.
    #[error("the process has {}", summary(.0))]
    InvalidProcess(Vec<Finding>),
    /// A permission matrix has errors.
    #[error("the permission matrix has {}", summary(.0))]
    InvalidMatrix(Vec<Finding>),
    /// A named thing does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The request cannot be carried out in the current state.
    #[error("{0}")]
    FailedPrecondition(String),
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
    #[error("{0}")]
    OutOfRange(String),
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
    /// The execution is not driven here now (the service is stopping).
    #[error("execution '{0}' is not running here now; try again")]
    NotRunningHere(String),
    /// The database failed.
    #[error("storage: {0}")]
    Storage(String),
}

/// Why a caller may not do something.
#[derive(Debug)]
pub(crate) struct Refusal {
    /// Who asked.
    pub(crate) caller: Caller,
    /// What it asked to do.
    pub(crate) action: String,
    /// The stable reason, such as `NOT_THE_LEAD`.
    pub(crate) reason: &'static str,
    /// Why not, for people.
    pub(crate) message: String,
    /// More about the refusal, for the `ErrorInfo` detail.
    pub(crate) metadata: Vec<(&'static str, String)>,
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

/// The execution service's result type.
pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

impl From<Error> for tonic::Status {
    fn from(error: Error) -> Self {
        use muster_proto::execution::v1 as wire;
        use muster_runtime::status::{MAX_MESSAGE_BYTES, truncate};
        let message = truncate(&error.to_string(), MAX_MESSAGE_BYTES).into_owned();
        match error {
            Error::InvalidArgument(_) => tonic::Status::invalid_argument(message),
            Error::InvalidProcess(ref found) => {
                let details = prost::Message::encode_to_vec(&wire::PublishProcessResponse {
                    process: None,
                    diagnostics: bounded_diagnostics(found),
                    unchanged: false,
                });
                tonic::Status::with_details(tonic::Code::InvalidArgument, message, details.into())
            }
            Error::InvalidMatrix(ref found) => {
                let details = prost::Message::encode_to_vec(&wire::PutPermissionMatrixResponse {
                    matrix: None,
                    diagnostics: bounded_diagnostics(found),
                });
                tonic::Status::with_details(tonic::Code::InvalidArgument, message, details.into())
            }
            Error::NotFound(_) => tonic::Status::not_found(message),
            Error::FailedPrecondition(_) => tonic::Status::failed_precondition(message),
            Error::Superseded(_) => tonic::Status::aborted(message),
            Error::OutOfRange(_) => tonic::Status::out_of_range(message),
            Error::BudgetExhausted { ref key, ref description } => {
                let subject = if key.starts_with("agent:") { key.clone() } else { format!("process:{key}") };
                muster_runtime::status::quota_exhausted(&message, &subject, description, None)
            }
            Error::Throttled { ref process, ref description, retry_after } => muster_runtime::status::quota_exhausted(
                &message,
                &format!("process:{process}"),
                description,
                retry_after,
            ),
            Error::PermissionDenied(refusal) => {
                let Refusal { caller, action, reason, message, metadata } = *refusal;
                let metadata: Vec<(&str, String)> = metadata.into_iter().collect();
                let message = truncate(&message, MAX_MESSAGE_BYTES).into_owned();
                muster_runtime::auth::permission_denied(&caller, &action, reason, message, &metadata)
            }
            Error::Unauthenticated { reason, metadata, .. } => {
                muster_runtime::auth::unauthenticated_with(reason, message, &metadata)
            }
            Error::Unavailable { service, detail } => muster_runtime::status::unavailable(service, &detail),
            Error::NotRunningHere(_) => tonic::Status::unavailable(message),
            Error::Storage(detail) => muster_runtime::status::internal(&detail),
        }
    }
}

/// The diagnostics of a refused document that fit in a status's details:
/// the first ones (errors before warnings), each message cut to a sentence's
/// length. The status message says how many there are in all.
fn bounded_diagnostics(findings: &[Finding]) -> Vec<muster_proto::common::v1::Diagnostic> {
    use muster_runtime::status::{MAX_DETAILS_BYTES, truncate};
    let mut ordered: Vec<&Finding> = findings.iter().filter(|finding| finding.error).collect();
    ordered.extend(findings.iter().filter(|finding| !finding.error));
    let mut room = MAX_DETAILS_BYTES;
    let mut kept = Vec::new();
    for finding in ordered {
        let mut diagnostic = crate::wire::finding_to_wire(finding);
        diagnostic.message = truncate(&diagnostic.message, 512).into_owned();
        diagnostic.path = truncate(&diagnostic.path, 256).into_owned();
        diagnostic.code = truncate(&diagnostic.code, 64).into_owned();
        let size = prost::Message::encoded_len(&diagnostic) + 4;
        if size > room {
            break;
        }
        room -= size;
        kept.push(diagnostic);
    }
    kept
}
