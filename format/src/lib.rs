//! muster's document formats: processes, role definitions (YAML and
//! Markdown), permission matrices and the files a roster is imported from
//! ([`roster`], with the roster's entities and their rules) — their model, a
//! YAML reader that keeps the line and column of every node, and the rules
//! they must follow.
//!
//! Every rule answers with diagnostics that each carry a severity, a stable
//! code (`docs/diagnostics.md`), a message, a path such as
//! `steps[2].roles.monitors[0]` and the line and column of the offending
//! node; a document without errors also comes back as its model
//! ([`ProcessDefinition`], [`RoleDefinition`], [`MatrixRole`]s).
//!
//! It owns the formats and nothing else: no server, no database, no network.
//! What it knows of agents, roles and tools comes from the caller's
//! [`Context`]. The validator service serves these rules over gRPC; the
//! execution service, the roster and the `muster` command line link them.
#![forbid(unsafe_code)]

mod budget;
mod diagnostic;
mod edit;
mod emi;
mod fields;
mod formats;
mod graph;
mod matrix;
mod model;
mod plain_schedule;
mod process;
mod references;
mod role;
pub mod roster;
mod schedule;
mod yaml;

pub use diagnostic::{Diagnostic, Severity};
pub use edit::{StepRolesRow, set_step_roles, step_roles};
pub use formats::{is_identifier, rfc3339_millis};
pub use matrix::{MatrixReport, MatrixRole};
pub use model::{
    BudgetAction, Context, DelegationRequest, KnownAgent, KnownRole, ProcessBudget, ProcessDefinition, ProcessReport,
    ProcessThrottle, StepDefinition, StepRoles, Triggers,
};
pub use plain_schedule::{RoleSchedule, Unreadable, role_schedule};
pub use process::{MAX_RETRIES, STEP_TYPES};
pub use role::{
    BUILTIN_TOOLS, MAX_WORKSPACE_PATH_CHARS, MAX_WORKSPACE_PATHS, RoleFormat, RoleReport, is_builtin_tool,
    role_inbox_name, workspace_path_problem,
};
/// A role definition: what a role is for and what it may do, as documents
/// write it and the roster holds it.
pub use roster::model::RoleDefinition;
pub use schedule::{MissedRuns, Schedule, rfc3339};
pub use yaml::Limits;

/// Validates a process YAML document against the default [`Limits`].
///
/// Every finding is reported, in source order; `process` is `Some` exactly
/// when no finding is an error.
pub fn validate_process(source: &str, context: &Context) -> ProcessReport {
    validate_process_with_limits(source, context, &Limits::default())
}

/// Validates a process YAML document against the given limits.
pub fn validate_process_with_limits(source: &str, context: &Context, limits: &Limits) -> ProcessReport {
    process::check_process(source, context, limits)
}

/// Validates a role definition (YAML: one definition or a list; Markdown: one
/// role file). Tools are checked against `context.tools` when given; the
/// [`BUILTIN_TOOLS`] are always known.
pub fn validate_role_definition(source: &str, format: RoleFormat, context: &Context) -> RoleReport {
    validate_role_definition_with_limits(source, format, context, &Limits::default())
}

/// Validates a role definition against the given limits.
pub fn validate_role_definition_with_limits(
    source: &str,
    format: RoleFormat,
    context: &Context,
    limits: &Limits,
) -> RoleReport {
    role::check_role_definition(source, format, context, limits)
}

/// Validates a permission matrix YAML document.
pub fn validate_permission_matrix(source: &str) -> MatrixReport {
    validate_permission_matrix_with_limits(source, &Limits::default())
}

/// Validates a permission matrix against the given limits.
pub fn validate_permission_matrix_with_limits(source: &str, limits: &Limits) -> MatrixReport {
    matrix::check_matrix(source, limits)
}

/// What a YAML document is, as far as its shape tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DocumentKind {
    /// A process: a mapping with a top-level `steps`.
    Process,
    /// A permission matrix: a top-level `roles` mapping whose entries are
    /// mappings of `can`, `cannot`, `includes` and `description`.
    PermissionMatrix,
    /// A roster: a top-level `agents` or `teams` (and no `steps`).
    Roster,
    /// Anything else: a role definition (or a list of them).
    RoleDefinition,
}

/// Guesses what a YAML document is from its top-level shape (for
/// `muster validate --kind auto`). A document that cannot be read counts as a
/// role definition, whose validation then reports why.
pub fn detect_yaml_kind(source: &str) -> DocumentKind {
    let parsed = yaml::parse(source, &Limits::default());
    let Some(document) = parsed.document else { return DocumentKind::RoleDefinition };
    let root = document.root();
    if root.get("steps").is_some() {
        return DocumentKind::Process;
    }
    if root.get("agents").is_some() || root.get("teams").is_some() {
        return DocumentKind::Roster;
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
mod tests;
