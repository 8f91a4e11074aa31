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
    #[error("the process has {} error(s); first: {}", .0.iter().filter(|finding| finding.error).count(), first_error(.0))]
    InvalidProcess(Vec<Finding>),
    /// A permission matrix has errors.
    #[error("the permission matrix has {} error(s); first: {}", .0.iter().filter(|finding| finding.error).count(), first_error(.0))]
    InvalidMatrix(Vec<Finding>),
    /// A named thing does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The request cannot be carried out in the current state.
    #[error("{0}")]
    FailedPrecondition(String),
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

fn first_error(findings: &[Finding]) -> String {
    findings
        .iter()
        .find(|finding| finding.error)
        .map(|finding| format!("{}:{}: {}", finding.line, finding.column, finding.message))
        .unwrap_or_default()
}

/// The execution service's result type.
pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

impl From<Error> for tonic::Status {
    fn from(error: Error) -> Self {
        use muster_proto::{common::v1 as common, execution::v1 as wire};
        let findings = |findings: &[Finding]| -> Vec<common::Diagnostic> {
            findings.iter().map(crate::wire::finding_to_wire).collect()
        };
        match error {
            Error::InvalidArgument(message) => tonic::Status::invalid_argument(message),
            Error::InvalidProcess(ref found) => {
                let details = prost::Message::encode_to_vec(&wire::PublishProcessResponse {
                    process: None,
                    diagnostics: findings(found),
                    unchanged: false,
                });
                tonic::Status::with_details(tonic::Code::InvalidArgument, error.to_string(), details.into())
            }
            Error::InvalidMatrix(ref found) => {
                let details = prost::Message::encode_to_vec(&wire::PutPermissionMatrixResponse {
                    matrix: None,
                    diagnostics: findings(found),
                });
                tonic::Status::with_details(tonic::Code::InvalidArgument, error.to_string(), details.into())
            }
            Error::NotFound(message) => tonic::Status::not_found(message),
            Error::FailedPrecondition(message) => tonic::Status::failed_precondition(message),
            Error::PermissionDenied(refusal) => {
                let Refusal { caller, action, reason, message, metadata } = *refusal;
                let metadata: Vec<(&str, String)> = metadata.into_iter().collect();
                muster_runtime::auth::permission_denied(&caller, &action, reason, message, &metadata)
            }
            Error::Unauthenticated { reason, message, metadata } => {
                muster_runtime::auth::unauthenticated_with(reason, message, &metadata)
            }
            Error::Unavailable { service, detail } => muster_runtime::status::unavailable(service, &detail),
            Error::NotRunningHere(_) => tonic::Status::unavailable(error.to_string()),
            Error::Storage(detail) => muster_runtime::status::internal(&detail),
        }
    }
}
