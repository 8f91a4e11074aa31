//! Team sessions: starting one, assigning roles, changing the lead, the
//! calling agent's role, role checks, and the lead's dashboard.

use std::collections::{BTreeMap, HashMap};

use muster_proto::{common::v1 as common, execution::v1 as wire};
use muster_runtime::auth::Caller;
use prost::Message as _;

use super::{
    ExecutionGrpc,
    access::denied,
    convert::{execution_to_wire, role_assignment_to_wire, subtask_to_wire},
};
use crate::{
    Error, Result,
    clients::roster::RosterFailure,
    domain::{
        authority::{self, Check, LEAD_ROLE, RoleAssignment, Session, Subject, SubtaskRequest, SubtaskStatus},
        model::{Execution, ProcessVersion},
        session::{
            ASKED_IN_SESSIONS, ASSIGNED_IN_SESSIONS, BudgetUse, Presence, Suggested, activity, context_window,
            dashboard,
        },
    },
    engine::{Control, step_views},
};

/// Longest session title, in characters.
const MAX_TITLE: usize = 200;
/// Longest session description or subtask, in characters.
const MAX_TEXT: usize = 10_000;
/// Most participants of a session.
const MAX_PARTICIPANTS: usize = 1_000;
/// Events a dashboard shows.
const RECENT_EVENTS: u64 = 20;
/// How long a step without a timeout is expected to run, for the dashboard.
const EXPECTED_STEP_SECONDS: u64 = 600;

fn too_long(field: &str, text: &str, limit: usize) -> Result<()> {
    let length = text.chars().count();
    if length > limit {
        return Err(Error::invalid(field, format!("{field} has {length} characters; at most {limit} are accepted")));
    }
    Ok(())
}

impl ExecutionGrpc {
    /// A role an assignment may give: one of the matrix in force, not `lead`
    /// (the lead is designated with SetLead).
    fn assignable_role(&self, field: &str, role: &str) -> Result<()> {
        if role == LEAD_ROLE {
            return Err(Error::invalid(
                field,
                format!("{field}: the lead is not assigned as a role; designate it with SetLead (or lead_agent_id)"),
            ));
        }
        let matrix = self.engine.matrix();
        if matrix.role(role).is_none() {
            let known: Vec<&str> = matrix.roles.iter().map(|role| role.name.as_str()).collect();
            return Err(Error::invalid(
                field,
                format!(
                    "{field}: role '{role}' is not in the permission matrix (version {}): {}",
                    matrix.version,
                    known.join(", ")
                ),
            ));
        }
        Ok(())
    }

    pub(super) async fn start_session_as(
        &self,
        caller: &Caller,
        request: wire::StartSessionRequest,
    ) -> Result<wire::StartSessionResponse> {
        let task = request.task.unwrap_or_default();
        if task.title.trim().is_empty() {
            return Err(Error::invalid("task.title", "task.title is required: what is the session about?"));
        }
        too_long("task.title", &task.title, MAX_TITLE)?;
        too_long("task.description", &task.description, MAX_TEXT)?;
        // The lead starts its own session (operators any): the matrix
        // decides whether its role, `lead`, may `create_task`.
        if let Some(own) = caller.agent_id() {
            if own != request.lead_agent_id {
                return Err(denied(
                    caller,
                    "start a session",
                    "NOT_THE_LEAD",
                    "an agent starts only a session that names it as lead (lead_agent_id)",
                    vec![("lead_agent_id", request.lead_agent_id.clone())],
                ));
            }
            let empty = Session::default();
            let subject = Subject {
                agent_id: own,
                roster_role: caller.roster_role(),
                roster_actions: None,
                lead: own,
                session: Some(&empty),
            };
            let verdict = authority::check(&self.engine.matrix(), &subject, "create_task");
            if !verdict.allowed {
                return Err(denied(
                    caller,
                    "start a session",
                    verdict.check.reason(),
                    verdict.reason,
                    vec![("session_role", verdict.role), ("matrix_version", verdict.matrix_version.to_string())],
                ));
            }
        }
        if request.lead_agent_id.is_empty() {
            return Err(Error::invalid("lead_agent_id", "lead_agent_id is required: a session has a lead"));
        }
        self.roster_agent(&request.lead_agent_id, "lead").await?;
        if request.participants.len() > MAX_PARTICIPANTS {
            return Err(Error::invalid(
                "participants",
                format!("a session has at most {MAX_PARTICIPANTS} participants"),
            ));
        }
        let now = muster_runtime::time::now_millis();
        let mut assignments = BTreeMap::new();
        for (index, participant) in request.participants.into_iter().enumerate() {
            let field = format!("participants[{index}]");
            if participant.agent_id == request.lead_agent_id {
                return Err(Error::invalid(
                    &field,
                    format!("{field}: '{}' is the lead, whose role is '{LEAD_ROLE}'", participant.agent_id),
                ));
            }
            self.assignable_role(&format!("{field}.role"), &participant.role)?;
            too_long(&format!("{field}.subtask"), &participant.subtask, MAX_TEXT)?;
            self.roster_agent(&participant.agent_id, &format!("{field}: agent")).await?;
            let assignment = RoleAssignment {
                agent_id: participant.agent_id.clone(),
                role: participant.role,
                subtask: participant.subtask,
                assigned_by: caller.audit_name(),
                assigned_at: now,
            };
            if assignments.insert(participant.agent_id.clone(), assignment).is_some() {
                return Err(Error::invalid(&field, format!("{field}: '{}' is listed twice", participant.agent_id)));
            }
        }
        let session =
            Session { title: task.title, description: task.description, assignments, subtasks: Default::default() };
        let execution = self
            .start_as_session(
                &request.process_name,
                request.process_version,
                request.inputs.as_ref(),
                request.lead_agent_id,
                session,
                request.idempotency_key,
            )
            .await?;
        Ok(wire::StartSessionResponse { execution: Some(execution) })
    }

    pub(super) async fn assign_role_as(
        &self,
        caller: &Caller,
        request: wire::AssignRoleRequest,
    ) -> Result<wire::AssignRoleResponse> {
        // Who asks is checked before anything is said of the execution.
        let described = format!("assign roles in execution '{}'", request.execution_id);
        let (execution, _) = self.execution_for(caller, &request.execution_id, &described).await?;
        let matrix_version = self.check_matrix_action(caller, &execution, "assign_role", &described).await?;
        if execution.session.is_none() {
            return Err(Error::not_a_session(&request.execution_id, ASSIGNED_IN_SESSIONS));
        }
        self.assignable_role("role", &request.role)?;
        too_long("subtask", &request.subtask, MAX_TEXT)?;
        self.roster_agent(&request.agent_id, "agent").await?;
        if request.agent_id == execution.lead_agent_id {
            return Err(Error::invalid(
                "agent_id",
                format!("'{}' is the lead, whose role is '{LEAD_ROLE}'", request.agent_id),
            ));
        }
        let assignment = RoleAssignment {
            agent_id: request.agent_id,
            role: request.role,
            subtask: request.subtask,
            assigned_by: caller.audit_name(),
            assigned_at: muster_runtime::time::now_millis(),
        };
        let control = |reply| Control::AssignRole { assignment: assignment.clone(), matrix_version, reply };
        self.control(&request.execution_id, control).await?;
        Ok(wire::AssignRoleResponse {
            assignment: Some(role_assignment_to_wire(&assignment, String::new())),
            matrix_version,
        })
    }

    pub(super) async fn request_subtask_as(
        &self,
        caller: &Caller,
        request: wire::RequestSubtaskRequest,
    ) -> Result<wire::RequestSubtaskResponse> {
        let described = format!("request a subtask in execution '{}'", request.execution_id);
        let (execution, _) = self.execution_for(caller, &request.execution_id, &described).await?;
        let Some(session) = &execution.session else {
            return Err(Error::not_a_session(&request.execution_id, ASKED_IN_SESSIONS));
        };
        let requester = caller.agent_id().unwrap_or_default().to_owned();
        // Only a participant asks, and only if its session role may.
        self.check_matrix_action(caller, &execution, "create_subtask", &described).await?;
        if request.subtask.trim().is_empty() {
            return Err(Error::invalid("subtask", "subtask is required: what is to be done?"));
        }
        too_long("subtask", &request.subtask, MAX_TEXT)?;
        too_long("reason", &request.reason, MAX_TEXT)?;
        let agent_id = if request.agent_id.is_empty() { requester.clone() } else { request.agent_id };
        if agent_id == execution.lead_agent_id {
            return Err(Error::invalid(
                "agent_id",
                format!("'{agent_id}' is the lead, whose role is '{LEAD_ROLE}': a subtask goes to a participant"),
            ));
        }
        let role = match (request.role.as_str(), session.assignments.get(&agent_id)) {
            ("", Some(assignment)) => assignment.role.clone(),
            ("", None) => {
                return Err(Error::invalid(
                    "role",
                    format!("role is required: '{agent_id}' has no role in this session to keep"),
                ));
            }
            (role, _) => role.to_owned(),
        };
        self.assignable_role("role", &role)?;
        if agent_id != requester {
            self.roster_agent(&agent_id, "agent").await?;
        }
        let subtask = SubtaskRequest {
            id: uuid::Uuid::now_v7().to_string(),
            requested_by: requester,
            agent_id,
            role,
            subtask: request.subtask,
            reason: request.reason,
            status: SubtaskStatus::Pending,
            decided_by: String::new(),
            note: String::new(),
            requested_at: muster_runtime::time::now_millis(),
            decided_at: 0,
        };
        let control = |reply| Control::RequestSubtask { request: Box::new(subtask.clone()), reply };
        self.control(&execution.id, control).await?;
        Ok(wire::RequestSubtaskResponse { request: Some(subtask_to_wire(&execution.id, &subtask)) })
    }

    pub(super) async fn decide_subtask_as(
        &self,
        caller: &Caller,
        request: wire::DecideSubtaskRequest,
    ) -> Result<wire::DecideSubtaskResponse> {
        let described = format!("decide a subtask request in execution '{}'", request.execution_id);
        let (execution, _) = self.execution_for(caller, &request.execution_id, &described).await?;
        let who = "only operators and the execution's lead decide subtask requests";
        let matrix_version = self.check_the_lead(caller, &execution, &described, who).await?;
        too_long("note", &request.note, MAX_TEXT)?;
        let pending = execution.session.as_ref().and_then(|session| session.subtasks.get(&request.request_id));
        let Some(pending) = pending else {
            return Err(Error::no_subtask_request(&execution.id, &request.request_id));
        };
        let now = muster_runtime::time::now_millis();
        let decided = SubtaskRequest {
            status: if request.approve { SubtaskStatus::Approved } else { SubtaskStatus::Rejected },
            decided_by: caller.audit_name(),
            note: request.note,
            decided_at: now,
            ..pending.clone()
        };
        let assignment = request.approve.then(|| RoleAssignment {
            agent_id: decided.agent_id.clone(),
            role: decided.role.clone(),
            subtask: decided.subtask.clone(),
            assigned_by: decided.decided_by.clone(),
            assigned_at: now,
        });
        if assignment.is_some() {
            // The role must still be one the matrix in force assigns.
            self.assignable_role("role", &decided.role)?;
        }
        let control = |reply| Control::DecideSubtask {
            decided: Box::new(decided.clone()),
            assignment: assignment.clone().map(Box::new),
            matrix_version,
            reply,
        };
        self.control(&execution.id, control).await?;
        Ok(wire::DecideSubtaskResponse {
            request: Some(subtask_to_wire(&execution.id, &decided)),
            assignment: assignment.map(|assignment| role_assignment_to_wire(&assignment, String::new())),
        })
    }

    pub(super) async fn my_role(
        &self,
        caller: &Caller,
        request: wire::GetMyRoleRequest,
    ) -> Result<wire::GetMyRoleResponse> {
        let agent_id = caller.agent_id().unwrap_or_default();
        let described = format!("read its role in execution '{}'", request.execution_id);
        let (execution, process) = self.execution_for(caller, &request.execution_id, &described).await?;
        let matrix = self.engine.matrix();
        let subject = Subject {
            agent_id,
            roster_role: caller.roster_role(),
            roster_actions: None,
            lead: &execution.lead_agent_id,
            session: execution.session.as_ref(),
        };
        let role = subject.role().unwrap_or_default().to_owned();
        let steps = self.steps(&execution.id).await?;
        let views = step_views(&steps, &process.definition);
        let assignment = execution.session.as_ref().and_then(|session| session.assignments.get(agent_id));
        Ok(wire::GetMyRoleResponse {
            assignment: Some(match assignment {
                Some(assignment) => role_assignment_to_wire(assignment, activity(agent_id, &views)),
                None => wire::RoleAssignment {
                    agent_id: agent_id.to_owned(),
                    role: role.clone(),
                    status: activity(agent_id, &views),
                    ..Default::default()
                },
            }),
            is_lead: execution.lead_agent_id == agent_id,
            permitted_actions: matrix.role(&role).map(|role| role.permitted_actions.clone()).unwrap_or_default(),
            matrix_version: matrix.version,
            context_window: execution
                .session
                .as_ref()
                .map(|session| context_window(&execution.id, session, &execution.lead_agent_id, &views))
                .unwrap_or_default(),
        })
    }

    pub(super) async fn check_role_as(
        &self,
        caller: &Caller,
        request: wire::CheckRoleRequest,
    ) -> Result<wire::CheckRoleResponse> {
        if request.action.trim().is_empty() {
            return Err(Error::invalid("action", "action is required, such as `code` or `approve`"));
        }
        let agent_id = match (request.agent_id.as_str(), caller.agent_id()) {
            ("", Some(own)) => own.to_owned(),
            ("", None) => return Err(Error::invalid("agent_id", "agent_id is required: which agent to check")),
            (named, _) => named.to_owned(),
        };
        let execution = if request.execution_id.is_empty() {
            None
        } else {
            let described = format!("check roles in execution '{}'", request.execution_id);
            Some(self.execution_for(caller, &request.execution_id, &described).await?)
        };
        // Agents check themselves; the lead may check the agents of its execution.
        if let Some(own) = caller.agent_id()
            && own != agent_id
            && execution.as_ref().is_none_or(|(execution, _)| execution.lead_agent_id != own)
        {
            return Err(denied(
                caller,
                format!("check the role of '{agent_id}'"),
                "NOT_THE_AGENT",
                "an agent checks only its own role, except the lead for the agents of its execution",
                vec![("agent_id", agent_id.clone())],
            ));
        }
        let roster_role = if caller.agent_id() == Some(agent_id.as_str()) {
            caller.roster_role().to_owned()
        } else {
            self.roster_agent(&agent_id, "agent").await?.role
        };
        let (lead, session) = match &execution {
            Some((execution, _)) => (execution.lead_agent_id.as_str(), execution.session.as_ref()),
            None => ("", None),
        };
        // The same actions bind here as in the action itself (`check_matrix_action`).
        let grants = self.roster_actions(&agent_id, &roster_role, lead, session.is_some()).await?;
        let subject = Subject {
            agent_id: &agent_id,
            roster_role: &roster_role,
            roster_actions: grants.as_deref().map(|grants| grants.actions.as_slice()),
            lead,
            session,
        };
        let verdict = authority::check(&self.engine.matrix(), &subject, request.action.trim());
        Ok(wire::CheckRoleResponse {
            allowed: verdict.allowed,
            reason: verdict.reason,
            agent_id,
            role: verdict.role,
            decided_by: match verdict.check {
                Check::NotAssigned => wire::RoleCheck::NotAssigned,
                Check::UnknownRole => wire::RoleCheck::UnknownRole,
                Check::Action => wire::RoleCheck::Action,
                Check::NotGoverned => wire::RoleCheck::NotGoverned,
                Check::RosterRole => wire::RoleCheck::RosterRole,
            } as i32,
            matrix_version: verdict.matrix_version,
        })
    }

    pub(super) async fn set_lead_as(
        &self,
        caller: &Caller,
        request: wire::SetLeadRequest,
    ) -> Result<wire::SetLeadResponse> {
        let described = format!("set the lead of execution '{}'", request.execution_id);
        let (execution, process) = self.execution_for(caller, &request.execution_id, &described).await?;
        let who = "only operators and the current lead may designate a lead";
        self.check_the_lead(caller, &execution, &described, who).await?;
        self.roster_agent(&request.agent_id, "lead").await?;
        let control = |reply| Control::SetLead { agent_id: request.agent_id, by: caller.audit_name(), reply };
        self.control(&request.execution_id, control).await?;
        let execution = self.engine.store.execution(&request.execution_id).await?.unwrap_or(execution);
        let steps = self.steps(&request.execution_id).await?;
        Ok(wire::SetLeadResponse {
            execution: Some(execution_to_wire(&execution, &steps, Some(&process.definition), self.outputs_room())),
        })
    }

    pub(super) async fn session_status(
        &self,
        caller: &Caller,
        request: wire::GetSessionStatusRequest,
    ) -> Result<wire::GetSessionStatusResponse> {
        let described = format!("read the dashboard of execution '{}'", request.execution_id);
        let (execution, process) = self.execution_for(caller, &request.execution_id, &described).await?;
        if let Some(own) = caller.agent_id()
            && execution.lead_agent_id != own
        {
            return Err(denied(
                caller,
                described,
                "NOT_THE_LEAD",
                format!(
                    "the dashboard is for operators and the execution's lead ({})",
                    if execution.lead_agent_id.is_empty() { "none is set" } else { &execution.lead_agent_id }
                ),
                vec![("execution_id", execution.id.clone())],
            ));
        }
        let steps = self.steps(&execution.id).await?;
        let mut views = step_views(&steps, &process.definition);
        // Approvers named are those SubmitApproval would accept.
        for view in &mut views {
            let mut accepted = Vec::with_capacity(view.approvers.len());
            for approver in std::mem::take(&mut view.approvers) {
                if self.may_decide(&execution, &approver).await {
                    accepted.push(approver);
                }
            }
            view.approvers = accepted;
        }
        // Who can work: the roster's status and the connected workers.
        let mut presence: HashMap<String, Presence> = HashMap::new();
        let agents = views
            .iter()
            .map(|view| view.executor.to_owned())
            .chain(execution.session.iter().flat_map(|session| session.assignments.keys().cloned()))
            .filter(|agent| !agent.is_empty());
        for agent_id in agents {
            if presence.contains_key(&agent_id) {
                continue;
            }
            // Not in the roster (a person deciding an approval) or the roster is away: say nothing.
            let offline = self.engine.roster.agent(agent_id.clone()).await.is_ok_and(|agent| agent.offline);
            let served = self.engine.workers.serves(&agent_id);
            presence.insert(agent_id, Presence { offline, served });
        }
        let budgets = self.budget_use(&process).await?;
        let now = muster_runtime::time::now_millis();
        let present = |agent: &str| presence.get(agent).copied().unwrap_or(Presence { offline: false, served: true });
        let ended = execution.status.is_final();
        let (blockers, suggestions) = dashboard(ended, &views, &present, &budgets, now, EXPECTED_STEP_SECONDS);
        let last = self.engine.store.last_event_sequence(&execution.id).await?;
        let recent_activity: Vec<common::StepEvent> = self
            .engine
            .store
            .events_after(&execution.id, last.saturating_sub(RECENT_EVENTS), RECENT_EVENTS as u32)
            .await?
            .iter()
            .map(|bytes| {
                common::StepEvent::decode(bytes.as_slice())
                    .map_err(|error| Error::Storage(format!("corrupt stored event: {error}")))
            })
            .collect::<Result<_>>()?;
        let session = execution.session.clone().unwrap_or_default();
        Ok(wire::GetSessionStatusResponse {
            lead_agent_id: execution.lead_agent_id.clone(),
            assignments: session
                .assignments
                .values()
                .map(|assignment| role_assignment_to_wire(assignment, activity(&assignment.agent_id, &views)))
                .collect(),
            blockers: blockers
                .into_iter()
                .map(|blocker| wire::SessionBlocker {
                    step_id: blocker.step_id,
                    agent_id: blocker.agent_id,
                    reason: blocker.reason,
                })
                .collect(),
            recent_activity,
            suggested_interventions: suggestions
                .into_iter()
                .map(|suggestion| wire::SuggestedIntervention {
                    rule: suggestion.rule.to_owned(),
                    step_id: suggestion.step_id,
                    agent_id: suggestion.agent_id,
                    action: match suggestion.action {
                        Suggested::Retry => wire::InterventionAction::Retry,
                        Suggested::Reassign => wire::InterventionAction::Reassign,
                        Suggested::Resume => wire::InterventionAction::Resume,
                        Suggested::Pause => wire::InterventionAction::Pause,
                        Suggested::Nothing => wire::InterventionAction::Unspecified,
                    } as i32,
                    text: suggestion.text,
                })
                .collect(),
            context_window: execution
                .session
                .as_ref()
                .map(|session| context_window(&execution.id, session, &execution.lead_agent_id, &views))
                .unwrap_or_default(),
            status: crate::grpc::convert::execution_status_to_wire(execution.status) as i32,
            task: execution.session.as_ref().map(|session| wire::SessionTask {
                title: session.title.clone(),
                description: session.description.clone(),
            }),
            subtask_requests: session
                .subtasks
                .values()
                .map(|subtask| subtask_to_wire(&execution.id, subtask))
                .collect(),
        })
    }

    /// Operators, and the execution's lead when its role may `assign_role`
    /// (`who` says so to another agent); the permission matrix version that
    /// allowed it (0 for operators).
    async fn check_the_lead(&self, caller: &Caller, execution: &Execution, described: &str, who: &str) -> Result<u32> {
        let Some(own) = caller.agent_id() else { return Ok(0) };
        if execution.lead_agent_id != own {
            return Err(denied(caller, described, "NOT_THE_LEAD", who, vec![("execution_id", execution.id.clone())]));
        }
        self.check_matrix_action(caller, execution, "assign_role", described).await
    }

    /// Whether SubmitApproval would accept a decision of `agent_id`, one of
    /// a step's approvers: it must be an agent of the roster, and the checks
    /// of `check_matrix_action` let it `approve` or `request_changes`. When
    /// the roster cannot say, the process's word stands.
    async fn may_decide(&self, execution: &Execution, agent_id: &str) -> bool {
        let roster_role = match self.engine.roster.agent(agent_id.to_owned()).await {
            Ok(agent) => agent.role,
            Err(RosterFailure::NotFound(_)) => return false,
            Err(_) => return true,
        };
        let grants = self
            .roster_actions(agent_id, &roster_role, &execution.lead_agent_id, execution.session.is_some())
            .await
            .unwrap_or(None);
        let subject = Subject {
            agent_id,
            roster_role: &roster_role,
            roster_actions: grants.as_deref().map(|grants| grants.actions.as_slice()),
            lead: &execution.lead_agent_id,
            session: execution.session.as_ref(),
        };
        let matrix = self.engine.matrix();
        ["approve", "request_changes"].iter().any(|action| authority::check(&matrix, &subject, action).allowed)
    }

    /// The use of the process's budget in force in its current period.
    async fn budget_use(&self, process: &ProcessVersion) -> Result<Vec<BudgetUse>> {
        let Some(budget) = self.engine.budget_of(process).await? else { return Ok(Vec::new()) };
        let since = budget.period_start(muster_runtime::time::now_millis());
        let usage = self.engine.store.process_usage(&process.name, since, "").await?;
        Ok(vec![
            BudgetUse { limit: "cost", used: usage.cost, max: budget.max_cost },
            BudgetUse { limit: "tokens", used: usage.tokens as f64, max: budget.max_tokens as f64 },
            BudgetUse { limit: "runs", used: usage.runs as f64, max: f64::from(budget.max_runs) },
        ])
    }
}
