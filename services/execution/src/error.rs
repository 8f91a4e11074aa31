//! The execution service's errors and their gRPC statuses.

use muster_proto::common::v1::Diagnostic;

/// Everything that can go wrong in the execution service.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is malformed.
    #[error("{0}")]
    InvalidArgument(String),
    /// The process definition has errors.
    #[error("the process has {} error(s); first: {}", .0.iter().filter(|d| d.severity == 1).count(), .0.iter().find(|d| d.severity == 1).map(|d| format!("{}:{}: {}", d.line, d.column, d.message)).unwrap_or_default())]
    InvalidProcess(Vec<Diagnostic>),
    /// A permission matrix has errors.
    #[error("the permission matrix has {} error(s); first: {}", .0.iter().filter(|d| d.severity == 1).count(), .0.iter().find(|d| d.severity == 1).map(|d| format!("{}:{}: {}", d.line, d.column, d.message)).unwrap_or_default())]
    InvalidMatrix(Vec<Diagnostic>),
    /// A named thing does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The request cannot be carried out in the current state.
    #[error("{0}")]
    FailedPrecondition(String),
    /// A service muster depends on cannot be reached.
    #[error("{service} is unavailable: {detail}")]
    Unavailable {
        /// Which service.
        service: &'static str,
        /// What happened.
        detail: String,
    },
    /// The database failed.
    #[error("storage: {0}")]
    Storage(String),
}

/// The execution service's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<Error> for tonic::Status {
    fn from(error: Error) -> Self {
        match error {
            Error::InvalidArgument(message) => tonic::Status::invalid_argument(message),
            Error::InvalidProcess(ref diagnostics) => {
                let details = prost::Message::encode_to_vec(&muster_proto::execution::v1::PublishProcessResponse {
                    process: None,
                    diagnostics: diagnostics.clone(),
                });
                tonic::Status::with_details(tonic::Code::InvalidArgument, error.to_string(), details.into())
            }
            Error::InvalidMatrix(ref diagnostics) => {
                let details =
                    prost::Message::encode_to_vec(&muster_proto::execution::v1::PutPermissionMatrixResponse {
                        matrix: None,
                        diagnostics: diagnostics.clone(),
                    });
                tonic::Status::with_details(tonic::Code::InvalidArgument, error.to_string(), details.into())
            }
            Error::NotFound(message) => tonic::Status::not_found(message),
            Error::FailedPrecondition(message) => tonic::Status::failed_precondition(message),
            Error::Unavailable { service, detail } => muster_runtime::status::unavailable(service, &detail),
            Error::Storage(detail) => muster_runtime::status::internal(&detail),
        }
    }
}
