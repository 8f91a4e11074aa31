//! muster's validator: checks process definitions, role definitions and
//! permission matrices, and answers with diagnostics that each carry a
//! severity, a stable code (`docs/diagnostics.md`), a message, a path such as
//! `steps[2].roles.monitors[0]` and the line and column of the offending node.
//!
//! It owns the rules and nothing else: it is stateless and keeps no
//! database; the only service it calls is the roster, for the agent
//! credentials that authenticate its callers. What it knows of agents, roles
//! and tools comes from the caller's [`Context`]. The rules are a library
//! ([`validate_process`], [`validate_role_definition`],
//! [`validate_permission_matrix`]) that the execution service and the
//! `muster validate` CLI link directly; [`run`] serves the same rules over
//! gRPC (`muster.validator.v1.ValidatorService`) to any authenticated caller
//! ([`ACCESS`]).
#![forbid(unsafe_code)]

use std::future::Future;

mod domain;
mod error;
mod grpc;

pub use domain::matrix::{MatrixReport, MatrixRole};
pub use domain::model::{
    Context, DelegationRequest, KnownAgent, KnownRole, ProcessBudget, ProcessDefinition, ProcessReport, StepDefinition,
    StepRoles, Triggers,
};
pub use domain::process::{MAX_RETRIES, STEP_TYPES};
pub use domain::role::{RoleDefinition, RoleFormat, RoleReport};
pub use domain::yaml::Limits;
pub use domain::{Diagnostic, Severity};
pub use error::{Error, Result};
pub use grpc::ValidatorService;

/// The validator's default port.
pub const DEFAULT_PORT: u16 = 50053;

/// The validator's configuration: the shared server settings only; it keeps
/// no state.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "muster-validator", version, about = "muster's validator service")]
pub struct Config {
    /// Shared server settings.
    #[command(flatten)]
    pub server: muster_runtime::ServerArgs,
}

/// Validates a process YAML document against the default [`Limits`].
///
/// Every finding is reported, in source order; `process` is `Some` exactly
/// when no finding is an error.
pub fn validate_process(source: &str, context: &Context) -> ProcessReport {
    validate_process_with_limits(source, context, &Limits::default())
}

/// Validates a process YAML document against the given limits.
pub fn validate_process_with_limits(source: &str, context: &Context, limits: &Limits) -> ProcessReport {
    domain::process::check_process(source, context, limits)
}

/// Validates a role definition (YAML: one definition or a list; Markdown: one
/// role file). Tools are checked against `context.tools` when given.
pub fn validate_role_definition(source: &str, format: RoleFormat, context: &Context) -> RoleReport {
    domain::role::check_role_definition(source, format, context, &Limits::default())
}

/// Validates a permission matrix YAML document.
pub fn validate_permission_matrix(source: &str) -> MatrixReport {
    domain::matrix::check_matrix(source, &Limits::default())
}

/// Who may call each method: any authenticated caller (operators, agents,
/// the cluster's services).
pub const ACCESS: &[muster_runtime::auth::Rule] = {
    use muster_runtime::auth::{Access, rule};
    &[
        rule("ValidateProcess", Access::ANYONE),
        rule("ValidateRoleDefinition", Access::ANYONE),
        rule("ValidatePermissionMatrix", Access::ANYONE),
    ]
};

/// Serves the validator on `listener` until `shutdown` resolves.
///
/// It calls no other service for its work; it follows the roster's agent
/// credentials only to authenticate agents that call it.
pub async fn run(
    config: Config,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let security = muster_runtime::security::Security::following_roster("validator", &config.server)?;
    let max_message_bytes = config.server.max_message_bytes;
    let service = muster_proto::validator::v1::validator_service_server::ValidatorServiceServer::new(
        ValidatorService::new(Limits::default()),
    )
    .max_decoding_message_size(max_message_bytes)
    .max_encoding_message_size(max_message_bytes);
    muster_runtime::Server::new(&config.server)
        .add_service(service, ACCESS)
        .serve(listener, &security, async { Ok(()) }, shutdown)
        .await?;
    Ok(())
}

/// What a YAML document is, as far as its shape tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DocumentKind {
    /// A process: a mapping with a top-level `steps`.
    Process,
    /// A permission matrix: a top-level `roles` mapping whose entries are
    /// mappings of `can`, `cannot`, `includes` and `description`.
    PermissionMatrix,
    /// Anything else: a role definition (or a list of them).
    RoleDefinition,
}

/// Guesses what a YAML document is from its top-level shape (for
/// `muster validate --kind auto`). A document that cannot be read counts as a
/// role definition, whose validation then reports why.
pub fn detect_yaml_kind(source: &str) -> DocumentKind {
    let parsed = domain::yaml::parse(source, &Limits::default());
    let Some(document) = parsed.document else { return DocumentKind::RoleDefinition };
    let root = document.root();
    if root.get("steps").is_some() {
        return DocumentKind::Process;
    }
    let matrix_shaped = root.get("roles").and_then(|roles| roles.mapping()).is_some_and(|mut entries| {
        entries.all(|(_, role)| {
            role.mapping().is_some_and(|mut fields| {
                fields.all(|(key, _)| matches!(key.scalar_text(), Some("can" | "cannot" | "includes" | "description")))
            })
        })
    });
    if matrix_shaped { DocumentKind::PermissionMatrix } else { DocumentKind::RoleDefinition }
}

#[cfg(test)]
mod access_tests {
    #[test]
    fn every_method_has_an_access_rule() {
        let gaps = muster_runtime::auth::layer::rule_gaps("muster.validator.v1.ValidatorService", super::ACCESS);
        assert_eq!(gaps, (Vec::new(), Vec::new()), "(methods without a rule, rules without a method)");
    }
}
