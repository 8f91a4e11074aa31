//! The gRPC face of the validator: wire types in, library calls, wire types
//! out. A document that is too large for the validator's limits is answered
//! with a `YAML002` diagnostic (like every other problem of the document); a
//! message larger than the server's message limit never reaches this code
//! (tonic answers RESOURCE_EXHAUSTED). Malformed requests (an unknown
//! `RoleFormat`, an empty name in the context) are INVALID_ARGUMENT.

use muster_proto::common::v1 as common;
use muster_proto::validator::v1 as wire;
use muster_proto::validator::v1::validator_service_server::ValidatorService;
use tonic::{Request, Response, Status};

use muster_format::{Context, Diagnostic, KnownAgent, KnownRole, Limits, RoleFormat, Severity};

use crate::Error;

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

/// The `muster.validator.v1.ValidatorService` implementation.
#[derive(Debug, Clone)]
pub struct ValidatorGrpc {
    limits: Limits,
}

impl ValidatorGrpc {
    /// A service that applies `limits` to every document.
    pub fn new(limits: Limits) -> Self {
        Self { limits }
    }
}

/// The caller's validation context, checked.
fn context_from_wire(context: Option<wire::ValidationContext>) -> Result<Context, Error> {
    let Some(context) = context else { return Ok(Context::default()) };
    let agents = if context.check_agents {
        let agents = context
            .agents
            .into_iter()
            .enumerate()
            .map(|(index, agent)| {
                if agent.id.is_empty() {
                    return Err(Error::invalid(
                        format!("context.agents[{index}].id"),
                        "context.agents: an agent has an empty id",
                    ));
                }
                let role = (!agent.role.is_empty()).then_some(agent.role);
                Ok(KnownAgent { id: agent.id, role, offline: agent.offline })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Some(agents)
    } else {
        None
    };
    let roles = if context.check_roles {
        let roles = context
            .roles
            .into_iter()
            .enumerate()
            .map(|(index, role)| {
                if role.name.is_empty() {
                    return Err(Error::invalid(
                        format!("context.roles[{index}].name"),
                        "context.roles: a role has an empty name",
                    ));
                }
                Ok(KnownRole {
                    name: role.name,
                    permitted_tools: role.permitted_tools,
                    permitted_actions: role.permitted_actions,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Some(roles)
    } else {
        None
    };
    let tools = context.check_tools.then_some(context.tools);
    Ok(Context { agents, roles, tools })
}

fn role_format(format: i32, file_name: &str) -> Result<RoleFormat, Error> {
    match wire::RoleFormat::try_from(format) {
        Ok(wire::RoleFormat::Yaml) => Ok(RoleFormat::Yaml),
        Ok(wire::RoleFormat::Markdown) => Ok(RoleFormat::Markdown),
        Ok(wire::RoleFormat::Unspecified) => {
            let lowered = file_name.to_ascii_lowercase();
            Ok(if lowered.ends_with(".md") || lowered.ends_with(".markdown") {
                RoleFormat::Markdown
            } else {
                RoleFormat::Yaml
            })
        }
        Err(_) => Err(Error::invalid("format", format!("format: {format} is not a RoleFormat"))),
    }
}

/// Runs CPU-bound validation off the async workers.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Result<T, Status> {
    tokio::task::spawn_blocking(work).await.map_err(|error| muster_runtime::status::internal(&error))
}

fn has_errors(diagnostics: &[Diagnostic]) -> bool {
    diagnostics.iter().any(Diagnostic::is_error)
}

/// Most findings a response carries, so that a document with a finding on
/// every line is still answered within the message limit.
const MAX_CARRIED: usize = 1_000;

/// The findings a response carries (all of them in source order, or, of
/// more than [`MAX_CARRIED`], the errors first), and how many there are.
fn carried(diagnostics: &[Diagnostic]) -> (Vec<common::Diagnostic>, u32) {
    let count = u32::try_from(diagnostics.len()).unwrap_or(u32::MAX);
    if diagnostics.len() <= MAX_CARRIED {
        return (diagnostics.iter().map(diagnostic_to_wire).collect(), count);
    }
    let errors = diagnostics.iter().filter(|found| found.is_error());
    let warnings = diagnostics.iter().filter(|found| !found.is_error());
    (errors.chain(warnings).take(MAX_CARRIED).map(diagnostic_to_wire).collect(), count)
}

/// A finding of the format library as the contract carries it.
fn diagnostic_to_wire(diagnostic: &Diagnostic) -> common::Diagnostic {
    let severity = match diagnostic.severity {
        Severity::Error => common::Severity::Error,
        Severity::Warning => common::Severity::Warning,
    };
    common::Diagnostic {
        severity: severity.into(),
        code: diagnostic.code.to_owned(),
        message: diagnostic.message.clone(),
        path: diagnostic.path.clone(),
        line: diagnostic.line,
        column: diagnostic.column,
    }
}

#[tonic::async_trait]
impl ValidatorService for ValidatorGrpc {
    async fn validate_process(
        &self,
        request: Request<wire::ValidateProcessRequest>,
    ) -> Result<Response<wire::ValidateProcessResponse>, Status> {
        let request = request.into_inner();
        let context = context_from_wire(request.context)?;
        let limits = self.limits;
        let source = request.source;
        let report = blocking(move || muster_format::validate_process_with_limits(&source, &context, &limits)).await?;
        tracing::debug!(file = %request.file_name, diagnostics = report.diagnostics.len(), "validated a process");
        let valid = !has_errors(&report.diagnostics);
        let (diagnostics, diagnostic_count) = carried(&report.diagnostics);
        Ok(Response::new(wire::ValidateProcessResponse {
            diagnostics,
            diagnostic_count,
            valid,
            process_name: report.name.unwrap_or_default(),
            step_count: u32::try_from(report.step_count).unwrap_or(u32::MAX),
        }))
    }

    async fn validate_role_definition(
        &self,
        request: Request<wire::ValidateRoleDefinitionRequest>,
    ) -> Result<Response<wire::ValidateRoleDefinitionResponse>, Status> {
        let request = request.into_inner();
        let format = role_format(request.format, &request.file_name)?;
        let context = context_from_wire(request.context)?;
        let limits = self.limits;
        let source = request.source;
        let report =
            blocking(move || muster_format::validate_role_definition_with_limits(&source, format, &context, &limits))
                .await?;
        let valid = !has_errors(&report.diagnostics);
        let (diagnostics, diagnostic_count) = carried(&report.diagnostics);
        Ok(Response::new(wire::ValidateRoleDefinitionResponse {
            valid,
            role_names: report.roles.iter().map(|role| role.name.clone()).filter(|name| !name.is_empty()).collect(),
            diagnostics,
            diagnostic_count,
        }))
    }

    async fn validate_permission_matrix(
        &self,
        request: Request<wire::ValidatePermissionMatrixRequest>,
    ) -> Result<Response<wire::ValidatePermissionMatrixResponse>, Status> {
        let request = request.into_inner();
        let limits = self.limits;
        let source = request.source;
        let report = blocking(move || muster_format::validate_permission_matrix_with_limits(&source, &limits)).await?;
        let valid = !has_errors(&report.diagnostics);
        let (diagnostics, diagnostic_count) = carried(&report.diagnostics);
        Ok(Response::new(wire::ValidatePermissionMatrixResponse { diagnostics, diagnostic_count, valid }))
    }
}
