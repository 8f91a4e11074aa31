//! The convention by which service errors become gRPC statuses.
//!
//! Each service has one `Error` type and one explicit `From<Error> for
//! tonic::Status` table. Client mistakes carry a precise message; internal
//! faults are logged here with their details and reach the client only as an
//! opaque message with a reference to find the log line.
//!
//! Every status a client can act on also carries the standard
//! `google.rpc.Status` details (`grpc-status-details-bin`), which grpcurl,
//! buf curl and the gRPC libraries of every language decode:
//!
//! | code | details |
//! |---|---|
//! | INVALID_ARGUMENT | `BadRequest`: the field, and for a document each finding with its line and column; a refused document also `ErrorInfo` and one `muster.common.v1.Diagnostic` per finding |
//! | FAILED_PRECONDITION | `PreconditionFailure`: what kind of condition, about what, and why |
//! | NOT_FOUND, ALREADY_EXISTS | `ResourceInfo`: the kind and name of what is missing, or there already |
//! | OUT_OF_RANGE | `BadRequest`: the field past the end |
//! | RESOURCE_EXHAUSTED | `QuotaFailure` and, when known, `RetryInfo` (a load-shedding refusal: `RetryInfo`) |
//! | UNAVAILABLE | `RetryInfo` and `ErrorInfo` naming the dependency |
//! | ABORTED | `RetryInfo` and `ErrorInfo` (`TRANSACTION_CONFLICT`): the database undid the call's transaction for a concurrent one |
//! | UNAUTHENTICATED, PERMISSION_DENIED | `ErrorInfo` with the reason (see [`crate::auth`]) |

use std::{collections::HashMap, fmt::Display, time::Duration};

use muster_proto::common::v1::{Diagnostic, Severity};
use tonic_types::{ErrorDetails, StatusExt as _};

// What clients build too, from `muster_client::status`: the
// INVALID_ARGUMENT naming a field, and the bounds on a status's size.
pub use muster_client::status::{MAX_DETAILS_BYTES, MAX_MESSAGE_BYTES, invalid_field, truncate};

/// The `domain` of muster's `ErrorInfo` details.
pub const DOMAIN: &str = "muster.dev";

/// How long a client waits before trying again a call refused as UNAVAILABLE.
pub const RETRY_UNAVAILABLE_AFTER: Duration = Duration::from_secs(1);

/// FAILED_PRECONDITION with a `google.rpc.PreconditionFailure` violation:
/// `kind` says which condition (`EXECUTION_ENDED`), `subject` what it is
/// about (`execution/01J...`), and the description is `message`.
pub fn failed_precondition(kind: &str, subject: &str, message: &str) -> tonic::Status {
    let message = truncate(message, MAX_MESSAGE_BYTES);
    let details = ErrorDetails::with_precondition_failure_violation(kind, truncate(subject, 256), message.as_ref());
    tonic::Status::with_error_details(tonic::Code::FailedPrecondition, message, details)
}

/// NOT_FOUND with a `google.rpc.ResourceInfo` naming what is missing:
/// `kind` is the resource's type (`muster.execution.v1.Execution`), `name`
/// the name or id asked for.
pub fn not_found(kind: &str, name: &str, message: &str) -> tonic::Status {
    let message = truncate(message, MAX_MESSAGE_BYTES);
    let details = ErrorDetails::with_resource_info(kind, truncate(name, 256), "", message.as_ref());
    tonic::Status::with_error_details(tonic::Code::NotFound, message, details)
}

/// ALREADY_EXISTS with a `google.rpc.ResourceInfo` naming what exists:
/// `kind` is its type (`muster.roster.v1.Agent`), `name` its id (empty when
/// the refusal is about several).
pub fn already_exists(kind: &str, name: &str, message: &str) -> tonic::Status {
    let message = truncate(message, MAX_MESSAGE_BYTES);
    let details = ErrorDetails::with_resource_info(kind, truncate(name, 256), "", message.as_ref());
    tonic::Status::with_error_details(tonic::Code::AlreadyExists, message, details)
}

/// OUT_OF_RANGE for a request field past the end of what there is (a cursor
/// past the newest notification), with a `google.rpc.BadRequest` naming it.
pub fn out_of_range(field: &str, message: &str) -> tonic::Status {
    let message = truncate(message, MAX_MESSAGE_BYTES);
    let details = ErrorDetails::with_bad_request_violation(truncate(field, 256), message.as_ref());
    tonic::Status::with_error_details(tonic::Code::OutOfRange, message, details)
}

/// INVALID_ARGUMENT for a refused document (a process, a permission matrix,
/// a roster): `ErrorInfo` with `reason` (`INVALID_PROCESS`) and the counts of
/// errors and warnings, a `google.rpc.BadRequest` with one violation per
/// finding on the request's `field` (its reason the finding's code, its
/// description `line L, column C (path): message`), and each finding as a
/// `muster.common.v1.Diagnostic`, errors first. What does not fit in
/// [`MAX_DETAILS_BYTES`] is left out; `message` says how many there are.
pub fn refused_document(message: &str, reason: &str, field: &str, diagnostics: &[Diagnostic]) -> tonic::Status {
    use prost::Message as _;
    use tonic_types::pb;
    let is_error = |found: &&Diagnostic| found.severity == Severity::Error as i32;
    let errors = diagnostics.iter().filter(is_error).count();
    let mut ordered: Vec<&Diagnostic> = diagnostics.iter().filter(is_error).collect();
    ordered.extend(diagnostics.iter().filter(|found| !is_error(found)));
    let mut violations = Vec::new();
    let mut typed = Vec::new();
    let mut room = MAX_DETAILS_BYTES - 256;
    for found in ordered {
        let diagnostic = Diagnostic {
            message: truncate(&found.message, 512).into_owned(),
            path: truncate(&found.path, 256).into_owned(),
            code: truncate(&found.code, 64).into_owned(),
            ..*found
        };
        let violation = pb::bad_request::FieldViolation {
            field: field.to_owned(),
            description: format!("{}: {}", position(&diagnostic), diagnostic.message),
            reason: diagnostic.code.clone(),
            localized_message: None,
        };
        // Each finding is sent twice, as a violation and as a diagnostic.
        let size = violation.encoded_len() + diagnostic.encoded_len() + 64;
        if size > room {
            break;
        }
        room -= size;
        violations.push(violation);
        typed.push(any(DIAGNOSTIC_TYPE, &diagnostic));
    }
    let info = pb::ErrorInfo {
        reason: reason.to_owned(),
        domain: DOMAIN.to_owned(),
        metadata: HashMap::from([
            ("errors".to_owned(), errors.to_string()),
            ("warnings".to_owned(), (diagnostics.len() - errors).to_string()),
        ]),
    };
    let message = truncate(message, MAX_MESSAGE_BYTES).into_owned();
    let mut details = vec![
        any("google.rpc.ErrorInfo", &info),
        any("google.rpc.BadRequest", &pb::BadRequest { field_violations: violations }),
    ];
    details.extend(typed);
    let status = pb::Status { code: tonic::Code::InvalidArgument as i32, message: message.clone(), details };
    tonic::Status::with_details(tonic::Code::InvalidArgument, message, status.encode_to_vec().into())
}

fn any(full_name: &str, message: &impl prost::Message) -> prost_types::Any {
    prost_types::Any { type_url: format!("type.googleapis.com/{full_name}"), value: message.encode_to_vec() }
}

/// The full name of the typed finding in a refused document's details.
pub const DIAGNOSTIC_TYPE: &str = "muster.common.v1.Diagnostic";

/// The findings of a refused document, as [`refused_document`] put them in
/// the status's details; empty when it has none.
pub fn diagnostics(status: &tonic::Status) -> Vec<Diagnostic> {
    use prost::Message as _;
    let Ok(decoded) = tonic_types::pb::Status::decode(status.details()) else { return Vec::new() };
    decoded
        .details
        .iter()
        .filter(|any| any.type_url.strip_prefix("type.googleapis.com/") == Some(DIAGNOSTIC_TYPE))
        .filter_map(|any| Diagnostic::decode(any.value.as_slice()).ok())
        .collect()
}

/// `line 7, column 5` (`steps[0].roles`), as a finding is placed in a violation.
fn position(diagnostic: &Diagnostic) -> String {
    let mut place = format!("line {}, column {}", diagnostic.line, diagnostic.column);
    if !diagnostic.path.is_empty() {
        place.push_str(&format!(" ({})", diagnostic.path));
    }
    place
}

/// The canonical name of a status code, as gRPC's documentation and every
/// other language write it (`INVALID_ARGUMENT`).
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// An INTERNAL status for a fault whose details must not reach the client.
pub fn internal(error: &dyn Display) -> tonic::Status {
    let reference = uuid_like_reference();
    tracing::error!(%error, reference, "internal error");
    tonic::Status::internal(format!("internal error (reference {reference}); see the service log"))
}

/// A database error as a status. A transaction the database aborted to
/// break a deadlock or a conflict with a concurrent one (SQLSTATE `40P01`,
/// `40001`) is ABORTED, with a `RetryInfo` and an `ErrorInfo`
/// (`TRANSACTION_CONFLICT`): the same call made again goes through. Any
/// other is [`internal`].
pub fn database(error: &sqlx::Error) -> tonic::Status {
    let conflict = matches!(error, sqlx::Error::Database(database)
        if matches!(database.code().as_deref(), Some("40P01" | "40001")));
    if !conflict {
        return internal(error);
    }
    tracing::warn!(%error, "the database aborted a transaction that conflicted with another; the caller retries");
    let mut details = ErrorDetails::with_error_info("TRANSACTION_CONFLICT", DOMAIN, HashMap::new());
    details.set_retry_info(Some(Duration::from_millis(100)));
    tonic::Status::with_error_details(
        tonic::Code::Aborted,
        "the call conflicted with a concurrent one and was undone; try again",
        details,
    )
}

/// An UNAVAILABLE status for a dependency that cannot be reached now, with a
/// `RetryInfo` and an `ErrorInfo` (`DEPENDENCY_UNAVAILABLE`) naming it.
pub fn unavailable(what: &str, error: &dyn Display) -> tonic::Status {
    tracing::warn!(%error, dependency = what, "dependency unavailable");
    retry_later(format!("{what} is unavailable; try again"), "DEPENDENCY_UNAVAILABLE", &[("dependency", what)])
}

/// UNAVAILABLE for a call to try again (on this replica or another) after
/// [`RETRY_UNAVAILABLE_AFTER`]: a `RetryInfo`, and an `ErrorInfo` with
/// `reason` (`SHUTTING_DOWN`) and `metadata`.
pub fn retry_later(message: impl Into<String>, reason: &str, metadata: &[(&str, &str)]) -> tonic::Status {
    let metadata: HashMap<String, String> =
        metadata.iter().map(|(key, value)| ((*key).to_owned(), (*value).to_owned())).collect();
    let mut details = ErrorDetails::with_error_info(reason, DOMAIN, metadata);
    details.set_retry_info(Some(RETRY_UNAVAILABLE_AFTER));
    tonic::Status::with_error_details(tonic::Code::Unavailable, message, details)
}

/// RESOURCE_EXHAUSTED for a quota used up, with a `google.rpc.QuotaFailure`
/// detail naming what it is about (`subject`, such as `process:review`) and
/// the limit (`description`), and a `google.rpc.RetryInfo` when it is known
/// when to try again.
pub fn quota_exhausted(
    message: &str,
    subject: &str,
    description: &str,
    retry_after: Option<std::time::Duration>,
) -> tonic::Status {
    use tonic_types::{ErrorDetails, StatusExt as _};
    let mut details = ErrorDetails::with_quota_failure_violation(subject, description);
    if let Some(delay) = retry_after {
        details.set_retry_info(Some(delay));
    }
    tonic::Status::with_error_details(tonic::Code::ResourceExhausted, truncate(message, MAX_MESSAGE_BYTES), details)
}

fn uuid_like_reference() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_nanos() as u64)
        .unwrap_or_default();
    format!("{:x}-{:x}", nanos, COUNTER.fetch_add(1, Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A database error with a SQLSTATE, as PostgreSQL's driver reports one.
    #[derive(Debug)]
    struct Sqlstate(&'static str);

    impl std::fmt::Display for Sqlstate {
        fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(formatter, "error with SQLSTATE {}", self.0)
        }
    }

    impl std::error::Error for Sqlstate {}

    impl sqlx::error::DatabaseError for Sqlstate {
        fn message(&self) -> &str {
            self.0
        }

        fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
            Some(self.0.into())
        }

        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }

        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }

        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }

        fn kind(&self) -> sqlx::error::ErrorKind {
            sqlx::error::ErrorKind::Other
        }
    }

    #[test]
    fn a_transaction_aborted_for_a_conflict_is_retried_and_other_database_errors_are_internal() {
        for code in ["40P01", "40001"] {
            let status = database(&sqlx::Error::Database(Box::new(Sqlstate(code))));
            assert_eq!(status.code(), tonic::Code::Aborted, "{code}");
            let details = status.get_error_details();
            assert_eq!(details.error_info().unwrap().reason, "TRANSACTION_CONFLICT");
            assert!(details.retry_info().unwrap().retry_delay.is_some());
        }
        let unique = database(&sqlx::Error::Database(Box::new(Sqlstate("23505"))));
        assert_eq!(unique.code(), tonic::Code::Internal);
        assert_eq!(database(&sqlx::Error::PoolTimedOut).code(), tonic::Code::Internal);
    }

    fn finding(code: &str, line: u32, severity: Severity) -> Diagnostic {
        Diagnostic {
            severity: severity as i32,
            code: code.to_owned(),
            message: format!("{code} is wrong"),
            path: "steps[0]".to_owned(),
            line,
            column: 3,
        }
    }

    #[test]
    fn a_refused_document_carries_standard_details_and_its_findings_errors_first() {
        let found = [finding("W1", 1, Severity::Warning), finding("E1", 2, Severity::Error)];
        let status = refused_document("the process has 1 error(s)", "INVALID_PROCESS", "source", &found);
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        let info = status.get_details_error_info().unwrap();
        assert_eq!((info.reason.as_str(), info.domain.as_str()), ("INVALID_PROCESS", DOMAIN));
        assert_eq!((info.metadata["errors"].as_str(), info.metadata["warnings"].as_str()), ("1", "1"));
        let violations = status.get_details_bad_request().unwrap().field_violations;
        let described: Vec<_> =
            violations.iter().map(|v| (v.field.as_str(), v.reason.as_str(), v.description.as_str())).collect();
        assert_eq!(
            described,
            [
                ("source", "E1", "line 2, column 3 (steps[0]): E1 is wrong"),
                ("source", "W1", "line 1, column 3 (steps[0]): W1 is wrong")
            ]
        );
        let typed: Vec<_> = diagnostics(&status).into_iter().map(|found| found.code).collect();
        assert_eq!(typed, ["E1", "W1"]);
    }

    #[test]
    fn a_refused_document_keeps_its_details_within_the_bound() {
        let found: Vec<_> = (0..1000).map(|line| finding(&"C".repeat(100), line, Severity::Error)).collect();
        let status = refused_document("many", "INVALID_PROCESS", "source", &found);
        assert!(status.details().len() <= MAX_DETAILS_BYTES, "{}", status.details().len());
        let kept = diagnostics(&status).len();
        assert!(kept > 10 && kept < 1000, "{kept}");
        assert_eq!(status.get_details_bad_request().unwrap().field_violations.len(), kept);
        assert_eq!(status.get_details_error_info().unwrap().metadata["errors"], "1000");
    }

    #[test]
    fn each_code_carries_its_standard_detail() {
        let status = invalid_field("agent.id", "agent.id is too long");
        let violation = &status.get_details_bad_request().unwrap().field_violations[0];
        assert_eq!((violation.field.as_str(), violation.description.as_str()), ("agent.id", "agent.id is too long"));

        let status = failed_precondition("TEAM_NOT_EMPTY", "team/core", "team core still has agents");
        let violation = &status.get_details_precondition_failure().unwrap().violations[0];
        assert_eq!((violation.r#type.as_str(), violation.subject.as_str()), ("TEAM_NOT_EMPTY", "team/core"));

        let status = not_found("muster.roster.v1.Agent", "ada", "agent 'ada' not found");
        let resource = status.get_details_resource_info().unwrap();
        assert_eq!(
            (resource.resource_type.as_str(), resource.resource_name.as_str()),
            ("muster.roster.v1.Agent", "ada")
        );

        let status = unavailable("the roster", &"connection refused");
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert_eq!(status.get_details_retry_info().unwrap().retry_delay, Some(RETRY_UNAVAILABLE_AFTER));
        let info = status.get_details_error_info().unwrap();
        assert_eq!(
            (info.reason.as_str(), info.metadata["dependency"].as_str()),
            ("DEPENDENCY_UNAVAILABLE", "the roster")
        );
    }
}
