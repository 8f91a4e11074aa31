//! Refusals with a standard `google.rpc.ErrorInfo` detail, so clients in any
//! language can branch on the reason rather than parse the message.

use std::collections::HashMap;

use tonic_types::{ErrorDetails, StatusExt as _};

use super::Caller;

pub use crate::status::DOMAIN;

/// UNAUTHENTICATED with `reason` (`CREDENTIAL_MISSING`, `CREDENTIAL_MALFORMED`,
/// `CREDENTIAL_UNKNOWN`, `CREDENTIAL_REVOKED`) in its `ErrorInfo`.
pub fn unauthenticated(reason: &str, message: impl Into<String>) -> tonic::Status {
    unauthenticated_with(reason, message, &[])
}

/// UNAUTHENTICATED for a credential presented inside a request rather than
/// as the call's own, with `metadata` saying whose it is (such as `agent_id`).
pub fn unauthenticated_with(reason: &str, message: impl Into<String>, metadata: &[(&str, String)]) -> tonic::Status {
    let metadata: HashMap<String, String> =
        metadata.iter().map(|(key, value)| ((*key).to_owned(), value.clone())).collect();
    tonic::Status::with_error_details(
        tonic::Code::Unauthenticated,
        message,
        ErrorDetails::with_error_info(reason, DOMAIN, metadata),
    )
}

/// PERMISSION_DENIED naming the caller, its role and the action:
/// `"<caller> may not <action>: <why>"`, with an `ErrorInfo` whose metadata
/// holds `caller`, `caller_kind`, `role`, `action` and `extra`.
pub fn permission_denied(
    caller: &Caller,
    action: &str,
    reason: &str,
    why: impl std::fmt::Display,
    extra: &[(&str, String)],
) -> tonic::Status {
    let mut metadata: HashMap<String, String> = HashMap::from([
        ("caller".to_owned(), caller.audit_name()),
        ("caller_kind".to_owned(), caller.kind().as_str().to_owned()),
        ("role".to_owned(), caller.role().to_owned()),
        ("action".to_owned(), action.to_owned()),
    ]);
    metadata.extend(extra.iter().map(|(key, value)| ((*key).to_owned(), value.clone())));
    tonic::Status::with_error_details(
        tonic::Code::PermissionDenied,
        format!("{caller} may not {action}: {why}"),
        ErrorDetails::with_error_info(reason, DOMAIN, metadata),
    )
}

/// Agents act only for themselves: PERMISSION_DENIED (`NOT_THE_AGENT`) when
/// the caller is an agent other than `agent_id`. Operators and services, whom
/// a method's access rule let through, act for anyone.
pub fn only_for_itself(caller: &Caller, agent_id: &str, action: &str) -> Result<(), tonic::Status> {
    match caller.agent_id() {
        Some(own) if own != agent_id => Err(permission_denied(
            caller,
            action,
            "NOT_THE_AGENT",
            format!("an agent may do this only for itself, not for '{agent_id}'"),
            &[("agent_id", agent_id.to_owned())],
        )),
        _ => Ok(()),
    }
}
