//! Who may call what: the coarse rule of every method (enforced by the
//! runtime's authentication layer), and the finer rules the handlers apply —
//! an agent reads only the executions it takes part in, and the permission
//! matrix decides what its role may do (in a session, or outside one when
//! the matrix names its roster role).

use std::sync::Arc;

use muster_runtime::auth::{Access, Caller, Rule, rule};

use super::ExecutionGrpc;
use crate::{
    Error, Result,
    domain::{
        authority::{self, Check, Subject, Verdict},
        model::{Execution, ProcessVersion},
    },
    error::Refusal,
};

/// Who may call each method of the ExecutionService.
pub const ACCESS: &[Rule] = &[
    rule("PublishProcess", Access::OPERATOR),
    rule("GetProcess", Access::ANYONE),
    rule("ListProcesses", Access::ANYONE),
    rule("StartExecution", Access::OPERATOR),
    rule("GetExecution", Access::ANYONE),
    rule("ReadPayload", Access::ANYONE),
    rule("ListExecutions", Access::ANYONE),
    rule("WatchExecution", Access::ANYONE),
    rule("CancelExecution", Access::OPERATOR.or(Access::AGENT)),
    rule("ConnectWorker", Access::OPERATOR.or(Access::AGENT)),
    rule("RelaySteps", Access::SERVICE),
    rule("ListWorkers", Access::OPERATOR.or(Access::SERVICE)),
    rule("InvokeTool", Access::AGENT),
    rule("ListTools", Access::ANYONE),
    rule("SubmitApproval", Access::AGENT),
    rule("Intervene", Access::OPERATOR.or(Access::AGENT)),
    rule("StartSession", Access::OPERATOR.or(Access::AGENT)),
    rule("AssignRole", Access::AGENT),
    rule("GetMyRole", Access::AGENT),
    rule("CheckRole", Access::OPERATOR.or(Access::AGENT)),
    rule("SetLead", Access::OPERATOR.or(Access::AGENT)),
    rule("GetSessionStatus", Access::OPERATOR.or(Access::AGENT)),
    rule("RequestSubtask", Access::AGENT),
    rule("DecideSubtask", Access::OPERATOR.or(Access::AGENT)),
    rule("PutPermissionMatrix", Access::OPERATOR),
    rule("GetPermissionMatrix", Access::ANYONE),
    rule("ListPermissionMatrixVersions", Access::ANYONE),
    rule("PostToInbox", Access::ANYONE),
    rule("ListInboxMessages", Access::ANYONE),
    rule("ArchiveInboxMessage", Access::OPERATOR),
    rule("SetBudget", Access::OPERATOR),
    rule("ListBudgets", Access::ANYONE),
    rule("ListSchedules", Access::ANYONE),
    rule("ListMemory", Access::ANYONE),
    rule("AppendMemory", Access::OPERATOR),
    rule("ForgetMemory", Access::OPERATOR),
];

/// A refusal naming the caller, the action and why.
pub(super) fn denied(
    caller: &Caller,
    action: impl Into<String>,
    reason: &'static str,
    message: impl Into<String>,
    metadata: Vec<(&'static str, String)>,
) -> Error {
    Error::PermissionDenied(Box::new(Refusal {
        caller: caller.clone(),
        action: action.into(),
        reason,
        message: message.into(),
        metadata,
    }))
}

/// The refusal of an action the checks denied.
pub(super) fn refusal(caller: &Caller, action: &str, execution_id: &str, verdict: &Verdict) -> Error {
    denied(
        caller,
        action,
        verdict.check.reason(),
        verdict.reason.clone(),
        vec![
            ("execution_id", execution_id.to_owned()),
            ("session_role", verdict.role.clone()),
            ("matrix_version", verdict.matrix_version.to_string()),
        ],
    )
}

impl ExecutionGrpc {
    /// Whether `agent_id` takes part in an execution: its lead, a participant
    /// of its session, named in a step (roles, approvers), or the executor of
    /// a step (the store is asked only when nothing else says so). The
    /// store lists an agent's executions by the same rule
    /// (`ExecutionFilter::agent_id`): change both together.
    pub(super) async fn takes_part(
        &self,
        agent_id: &str,
        execution: &Execution,
        process: &ProcessVersion,
    ) -> Result<bool> {
        Ok(execution.lead_agent_id == agent_id
            || execution.session.as_ref().is_some_and(|session| session.assignments.contains_key(agent_id))
            || process.names(agent_id)
            || self.engine.store.executes_a_step(&execution.id, agent_id).await?)
    }

    /// The execution `execution_id` names, with its process, for a caller
    /// that may learn of it. Operators and services learn that it is
    /// missing (NOT_FOUND). An agent that takes no part in it is refused
    /// with the same PERMISSION_DENIED, byte for byte, whether it exists or
    /// not, naming nothing of it: so the refusal confirms no id and names
    /// none of its agents. Every handler about one execution starts here,
    /// before it says anything else of the execution. `action` ends with
    /// the execution's quoted id (`cancel execution 'ID'`), which the
    /// stranger's refusal leaves out of its message (the `ErrorInfo` still
    /// echoes it), so that its message is the same for every id.
    pub(super) async fn execution_for(
        &self,
        caller: &Caller,
        execution_id: &str,
        action: &str,
    ) -> Result<(Execution, Arc<ProcessVersion>)> {
        let Some(agent_id) = caller.agent_id() else { return self.execution_and_process(execution_id).await };
        let stranger = || {
            let quoted = format!(" '{execution_id}'");
            denied(
                caller,
                action.strip_suffix(&quoted).unwrap_or(action),
                "NOT_A_PARTICIPANT",
                "it takes no part in it, or there is no such execution",
                vec![("execution_id", execution_id.to_owned())],
            )
        };
        let Some(execution) = self.engine.store.execution(execution_id).await? else { return Err(stranger()) };
        let process = self.engine.definition_of(&execution).await?;
        if !self.takes_part(agent_id, &execution, &process).await? {
            return Err(stranger());
        }
        Ok((execution, process))
    }

    /// The actions an agent's roster role lists, when they may bind it:
    /// outside sessions, acting in its roster role (not as the lead).
    pub(super) async fn roster_actions(
        &self,
        agent_id: &str,
        roster_role: &str,
        lead: &str,
        in_session: bool,
    ) -> Result<Option<Arc<crate::clients::roster::RoleGrants>>> {
        if in_session || roster_role.is_empty() || (!lead.is_empty() && agent_id == lead) {
            return Ok(None);
        }
        Ok(Some(self.role_grants.of(self.engine.roster.as_ref(), roster_role).await?))
    }

    /// An agent's `action` must pass the permission matrix: in a session
    /// always, outside one when the matrix governs its role, after the
    /// actions its roster role lists (see [`authority`]). Returns the matrix
    /// version that decided (0 when no rule applied: operators, or a role
    /// the matrix does not govern).
    pub(super) async fn check_matrix_action(
        &self,
        caller: &Caller,
        execution: &Execution,
        action: &str,
        described: &str,
    ) -> Result<u32> {
        let Some(agent_id) = caller.agent_id() else { return Ok(0) };
        let grants = self
            .roster_actions(agent_id, caller.roster_role(), &execution.lead_agent_id, execution.session.is_some())
            .await?;
        let subject = Subject {
            agent_id,
            roster_role: caller.roster_role(),
            roster_actions: grants.as_deref().map(|grants| grants.actions.as_slice()),
            lead: &execution.lead_agent_id,
            session: execution.session.as_ref(),
        };
        let verdict = authority::check(&self.engine.matrix(), &subject, action);
        match verdict.check {
            _ if !verdict.allowed => Err(refusal(caller, described, &execution.id, &verdict)),
            Check::NotGoverned | Check::RosterRole => Ok(0),
            _ => Ok(verdict.matrix_version),
        }
    }
}
