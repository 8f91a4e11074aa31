//! What a session looks like to its members: each participant's current
//! activity, the context window an agent puts in its prompt, and the lead's
//! dashboard — blockers, and interventions suggested by stated rules:
//!
//! - `step_overdue`: a step running past 80% of its timeout, or, without one,
//!   past the expected step time → RETRY or REASSIGN;
//! - `assignee_offline`: a step waits for (or runs with) an agent the roster
//!   marks offline or no connected worker serves → REASSIGN;
//! - `queued_behind_busy_expert`: a step waits in a busy expert's queue → REASSIGN;
//! - `step_failed`: a step failed on its own (not because of an upstream
//!   step) → RETRY, unless retrying cannot help: refused (`PERMISSION_DENIED`:
//!   the executor's role must change first) or given invalid input (the
//!   same input fails again) → no intervention, what would help instead;
//! - `approval_waiting`: an approval step waits for a decision → remind its
//!   approvers, naming only those SubmitApproval would accept;
//! - `step_paused`: a paused step → RESUME;
//! - `budget_near_limit`: the process has used 80% or more of a budget
//!   limit in the current period → PAUSE.
//!
//! An ended execution takes no intervention (each is refused), so its
//! dashboard suggests none: it shows its blockers only.

use std::fmt::Write as _;

use super::{StepStatus, authority::Session};

/// Why a role cannot be assigned outside a session.
pub const ASSIGNED_IN_SESSIONS: &str = "roles are assigned in sessions";
/// Why a subtask cannot be asked for outside a session.
pub const ASKED_IN_SESSIONS: &str = "subtasks are asked of a session's lead";

/// A step as the dashboard sees it.
#[derive(Debug, Clone)]
pub struct StepView<'a> {
    pub id: &'a str,
    pub name: &'a str,
    pub status: StepStatus,
    /// The agent executing it, or to execute it.
    pub executor: &'a str,
    pub started_at: Option<i64>,
    pub timeout_seconds: Option<u64>,
    pub error_code: &'a str,
    pub error_message: &'a str,
    /// For approval steps: who may decide (the session view narrows it to
    /// those SubmitApproval would accept).
    pub approvers: Vec<String>,
}

/// Whether an agent can work now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Presence {
    /// The roster marks it offline.
    pub offline: bool,
    /// A connected worker serves it.
    pub served: bool,
}

/// A budget limit and its use in the current period.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetUse {
    /// `cost`, `tokens` or `runs`.
    pub limit: &'static str,
    pub used: f64,
    pub max: f64,
}

/// An intervention the dashboard may suggest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Suggested {
    Retry,
    Reassign,
    Resume,
    Pause,
    Nothing,
}

/// A step that holds a session up, and who can unblock it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocker {
    pub step_id: String,
    pub agent_id: String,
    pub reason: String,
}

/// An intervention the dashboard suggests, and the rule that suggests it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Suggestion {
    pub rule: &'static str,
    pub step_id: String,
    pub agent_id: String,
    pub action: Suggested,
    pub text: String,
}

/// What an agent is doing now, from the steps.
pub fn activity(agent_id: &str, steps: &[StepView<'_>]) -> String {
    let mine = || steps.iter().filter(move |step| step.executor == agent_id);
    if let Some(step) = mine().find(|step| step.status == StepStatus::Running) {
        return format!("working on {}", step.name);
    }
    if let Some(step) = steps
        .iter()
        .find(|step| step.status == StepStatus::WaitingApproval && step.approvers.iter().any(|agent| agent == agent_id))
    {
        return format!("waiting for its decision on {}", step.name);
    }
    if let Some(step) = mine().find(|step| step.status == StepStatus::Queued) {
        return format!("queued for {}", step.name);
    }
    if let Some(step) = mine().find(|step| step.status == StepStatus::WaitingForWorker) {
        return format!("waiting for a worker to start {}", step.name);
    }
    if let Some(step) = mine().find(|step| matches!(step.status, StepStatus::Pending | StepStatus::Ready)) {
        return format!("waiting to start {}", step.name);
    }
    if mine().next().is_some() && mine().all(|step| step.status == StepStatus::Completed) {
        return "done".to_owned();
    }
    "idle".to_owned()
}

/// The session as text for an agent's prompt: the task, the lead marked,
/// each participant with its role, subtask and current activity.
pub fn context_window(execution_id: &str, session: &Session, lead: &str, steps: &[StepView<'_>]) -> String {
    let mut text = format!("**Session: {execution_id} - {}**\n", session.title);
    if !session.description.is_empty() {
        let _ = writeln!(text, "{}", session.description);
    }
    if lead.is_empty() {
        text.push_str("👑 LEAD: (none)\n");
    } else {
        let _ = writeln!(text, "👑 LEAD: {lead}");
    }
    for assignment in session.assignments.values().filter(|assignment| assignment.agent_id != lead) {
        let _ = write!(text, "\n📍 {} [{}]", assignment.agent_id, assignment.role.to_uppercase());
        if !assignment.subtask.is_empty() {
            let _ = write!(text, " — {}", assignment.subtask);
        }
        let doing = activity(&assignment.agent_id, steps);
        let marker = if doing.starts_with("working") { "🔧" } else { "⏳" };
        let _ = writeln!(text, "\n   {marker} {doing}");
    }
    text
}

/// Failures a retry repeats: the same executor is refused again, or the
/// same input is invalid again.
const NOT_RETRYABLE: [&str; 3] = ["PERMISSION_DENIED", "INVALID_INPUT", "INPUT_SCHEMA"];

/// The dashboard's blockers and suggestions at `now` (milliseconds); none
/// for an `ended` execution.
pub fn dashboard(
    ended: bool,
    steps: &[StepView<'_>],
    presence: &dyn Fn(&str) -> Presence,
    budgets: &[BudgetUse],
    now: i64,
    expected_step_seconds: u64,
) -> (Vec<Blocker>, Vec<Suggestion>) {
    let mut blockers = Vec::new();
    let mut suggestions = Vec::new();
    let mut suggest = |rule, step: &StepView<'_>, action, text: String| {
        suggestions.push(Suggestion {
            rule,
            step_id: step.id.to_owned(),
            agent_id: step.executor.to_owned(),
            action,
            text,
        });
    };
    for step in steps {
        let waits_for_agent = matches!(
            step.status,
            StepStatus::Pending
                | StepStatus::Ready
                | StepStatus::Running
                | StepStatus::Queued
                | StepStatus::WaitingForWorker
        ) && !step.executor.is_empty();
        if waits_for_agent {
            let presence = presence(step.executor);
            if presence.offline || !presence.served {
                let why = if presence.offline { "is offline" } else { "is served by no connected worker" };
                blockers.push(Blocker {
                    step_id: step.id.to_owned(),
                    agent_id: step.executor.to_owned(),
                    reason: format!("step '{}' waits for {}, who {why}", step.id, step.executor),
                });
                suggest(
                    "assignee_offline",
                    step,
                    Suggested::Reassign,
                    format!("{} {why}: REASSIGN step '{}' to an available agent", step.executor, step.id),
                );
            }
        }
        match step.status {
            StepStatus::Running => {
                let elapsed = step.started_at.map_or(0, |started| (now - started).max(0) as u64 / 1000);
                let expected = step.timeout_seconds.map_or(expected_step_seconds, |timeout| timeout * 8 / 10);
                if elapsed > expected {
                    suggest(
                        "step_overdue",
                        step,
                        Suggested::Reassign,
                        format!(
                            "step '{}' has run {elapsed} s with {}, past the expected {expected} s: check on it, RETRY or REASSIGN it",
                            step.id, step.executor
                        ),
                    );
                }
            }
            StepStatus::Queued => {
                blockers.push(Blocker {
                    step_id: step.id.to_owned(),
                    agent_id: step.executor.to_owned(),
                    reason: format!("step '{}' is queued for the busy expert {}", step.id, step.executor),
                });
                suggest(
                    "queued_behind_busy_expert",
                    step,
                    Suggested::Reassign,
                    format!("step '{}' waits for {}: REASSIGN it to an available colleague", step.id, step.executor),
                );
            }
            StepStatus::Failed if step.error_code != "UPSTREAM_FAILED" => {
                blockers.push(Blocker {
                    step_id: step.id.to_owned(),
                    agent_id: step.executor.to_owned(),
                    reason: format!("step '{}' failed: {}: {}", step.id, step.error_code, step.error_message),
                });
                if step.error_code == "PERMISSION_DENIED" {
                    suggest(
                        "step_failed",
                        step,
                        Suggested::Nothing,
                        format!(
                            "step '{}' was refused: a RETRY is refused again until {}'s role permits it; change the role, or OVERRIDE_OUTPUT",
                            step.id, step.executor
                        ),
                    );
                } else if NOT_RETRYABLE.contains(&step.error_code) {
                    suggest(
                        "step_failed",
                        step,
                        Suggested::Nothing,
                        format!(
                            "step '{}' had invalid input ({}): a RETRY fails the same way; OVERRIDE_OUTPUT, or start again with valid inputs",
                            step.id, step.error_code
                        ),
                    );
                } else {
                    suggest(
                        "step_failed",
                        step,
                        Suggested::Retry,
                        format!("RETRY step '{}' ({})", step.id, step.error_code),
                    );
                }
            }
            StepStatus::WaitingApproval if step.approvers.is_empty() => {
                blockers.push(Blocker {
                    step_id: step.id.to_owned(),
                    agent_id: String::new(),
                    reason: format!("step '{}' waits for a decision that none of its approvers may make", step.id),
                });
                suggest(
                    "approval_waiting",
                    step,
                    Suggested::Nothing,
                    format!(
                        "no approver of step '{}' may decide it now: give one a role that may approve, or CANCEL the step",
                        step.id
                    ),
                );
            }
            StepStatus::WaitingApproval => {
                let approvers = step.approvers.join(", ");
                blockers.push(Blocker {
                    step_id: step.id.to_owned(),
                    agent_id: String::new(),
                    reason: format!("step '{}' waits for a decision by {approvers}", step.id),
                });
                suggest(
                    "approval_waiting",
                    step,
                    Suggested::Nothing,
                    format!("remind {approvers} to decide step '{}'", step.id),
                );
            }
            StepStatus::Paused => {
                blockers.push(Blocker {
                    step_id: step.id.to_owned(),
                    agent_id: step.executor.to_owned(),
                    reason: format!("step '{}' is paused", step.id),
                });
                suggest("step_paused", step, Suggested::Resume, format!("RESUME step '{}' when ready", step.id));
            }
            _ => {}
        }
    }
    if ended {
        suggestions.clear();
        return (blockers, suggestions);
    }
    for budget in budgets.iter().filter(|budget| budget.max > 0.0 && budget.used >= budget.max * 0.8) {
        suggestions.push(Suggestion {
            rule: "budget_near_limit",
            step_id: String::new(),
            agent_id: String::new(),
            action: Suggested::Pause,
            text: format!(
                "the process has used {:.0}% of its {} budget for this period ({} of {}): PAUSE the execution or raise the budget",
                budget.used / budget.max * 100.0,
                budget.limit,
                budget.used,
                budget.max
            ),
        });
    }
    (blockers, suggestions)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::domain::authority::RoleAssignment;

    fn step(id: &'static str, status: StepStatus, executor: &'static str) -> StepView<'static> {
        StepView {
            id,
            name: id,
            status,
            executor,
            started_at: Some(0),
            timeout_seconds: None,
            error_code: "",
            error_message: "",
            approvers: Vec::new(),
        }
    }

    #[test]
    fn the_context_window_marks_the_lead_and_shows_each_participant() {
        let session = Session {
            title: "Implement feature X".to_owned(),
            description: String::new(),
            subtasks: Default::default(),
            assignments: BTreeMap::from([(
                "dev".to_owned(),
                RoleAssignment {
                    agent_id: "dev".to_owned(),
                    role: "developer".to_owned(),
                    subtask: "Write endpoint".to_owned(),
                    assigned_by: "boss".to_owned(),
                    assigned_at: 0,
                },
            )]),
        };
        let steps = [step("endpoint", StepStatus::Running, "dev")];
        let text = context_window("task-001", &session, "boss", &steps);
        assert_eq!(
            text,
            "**Session: task-001 - Implement feature X**\n👑 LEAD: boss\n\n📍 dev [DEVELOPER] — Write endpoint\n   🔧 working on endpoint\n"
        );
    }

    #[test]
    fn each_rule_fires_on_its_situation() {
        let mut overdue = step("slow", StepStatus::Running, "dev");
        overdue.timeout_seconds = Some(100);
        let mut failed = step("broken", StepStatus::Failed, "dev");
        failed.error_code = "WORKER_FAILED";
        let steps = [
            overdue,
            step("waiting", StepStatus::Queued, "expert"),
            failed,
            step("next", StepStatus::WaitingForWorker, "ghost"),
        ];
        let presence = |agent: &str| Presence { offline: agent == "ghost", served: agent != "ghost" };
        let budgets = [BudgetUse { limit: "cost", used: 9.0, max: 10.0 }];
        let (blockers, suggestions) = dashboard(false, &steps, &presence, &budgets, 90_000, 600);
        let rules: Vec<&str> = suggestions.iter().map(|suggestion| suggestion.rule).collect();
        assert_eq!(
            rules,
            ["step_overdue", "queued_behind_busy_expert", "step_failed", "assignee_offline", "budget_near_limit"]
        );
        assert_eq!(blockers.len(), 3, "{blockers:?}");
        assert!(blockers.iter().any(|blocker| blocker.reason.contains("ghost, who is offline")));
        let (blockers_when_ended, none) = dashboard(true, &steps, &presence, &budgets, 90_000, 600);
        assert!(none.is_empty(), "an ended execution takes no intervention: {none:?}");
        assert_eq!(blockers_when_ended, blockers);
    }

    #[test]
    fn a_retry_is_suggested_only_where_it_can_help() {
        let presence = |_: &str| Presence { offline: false, served: true };
        for (code, retry) in
            [("WORKER_FAILED", true), ("TIMEOUT", true), ("PERMISSION_DENIED", false), ("INVALID_INPUT", false)]
        {
            let mut failed = step("broken", StepStatus::Failed, "dev");
            failed.error_code = code;
            let (_, suggestions) = dashboard(false, &[failed], &presence, &[], 0, 600);
            assert_eq!(suggestions.len(), 1, "{code}: {suggestions:?}");
            assert_eq!(suggestions[0].action == Suggested::Retry, retry, "{code}: {suggestions:?}");
        }
    }
}
