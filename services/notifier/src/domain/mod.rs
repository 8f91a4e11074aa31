//! The notifier's rules, free of transport and storage: who hears of an event
//! ([`recipients`]), and what an agent's NDJSON memory line says ([`memory`]).

pub(crate) mod memory;

use std::collections::BTreeMap;

/// What happened, as the notifier distinguishes it (the wire `EventType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventKind {
    StepStarted,
    StepCompleted,
    StepFailed,
    StepQueued,
    StepDelegated,
    StepEscalated,
    ApprovalRequested,
    StepIntervened,
    ExecutionFinished,
    ExecutionStarted,
    SessionStarted,
    RoleAssigned,
    LeadChanged,
    BudgetExceeded,
    /// A model call of a running step: audit in the execution's event log,
    /// for no agent.
    StepProgress,
    SubtaskRequested,
    SubtaskDecided,
}

impl EventKind {
    /// The NDJSON `event_type`: the wire name without `EVENT_TYPE_`, lowercased.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::StepStarted => "step_started",
            Self::StepCompleted => "step_completed",
            Self::StepFailed => "step_failed",
            Self::StepQueued => "step_queued",
            Self::StepDelegated => "step_delegated",
            Self::StepEscalated => "step_escalated",
            Self::ApprovalRequested => "approval_requested",
            Self::StepIntervened => "step_intervened",
            Self::ExecutionFinished => "execution_finished",
            Self::ExecutionStarted => "execution_started",
            Self::SessionStarted => "session_started",
            Self::RoleAssigned => "role_assigned",
            Self::LeadChanged => "lead_changed",
            Self::BudgetExceeded => "budget_exceeded",
            Self::StepProgress => "step_progress",
            Self::SubtaskRequested => "subtask_requested",
            Self::SubtaskDecided => "subtask_decided",
        }
    }

    /// Completion and failure: the events informed agents hear of.
    pub(crate) fn is_outcome(self) -> bool {
        matches!(self, Self::StepCompleted | Self::StepFailed)
    }
}

/// Why an agent hears of an event. The order is the strength: when an agent
/// has several reasons, it gets one notification with the strongest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    /// Informed of the step: hears of its completion and failure.
    Informed,
    /// Addressed as a participant of a session: its start, a role, the lead.
    Participant,
    /// Monitors the step: hears of every event of it.
    Monitor,
    /// Leads the execution: hears of every event of it.
    Lead,
}

impl Reason {
    pub(crate) fn to_i64(self) -> i64 {
        match self {
            Self::Informed => 1,
            Self::Monitor => 2,
            Self::Lead => 3,
            Self::Participant => 4,
        }
    }

    pub(crate) fn from_i64(value: i64) -> Option<Self> {
        match value {
            1 => Some(Self::Informed),
            2 => Some(Self::Monitor),
            3 => Some(Self::Lead),
            4 => Some(Self::Participant),
            _ => None,
        }
    }
}

/// The parts of a step event the notifier's rules read. Built from the wire
/// event in `grpc.rs`, which validates it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Event {
    pub(crate) event_id: String,
    pub(crate) kind: EventKind,
    /// Milliseconds since the epoch.
    pub(crate) occurred_at: i64,
    pub(crate) execution_id: String,
    pub(crate) process_name: String,
    pub(crate) step_id: String,
    pub(crate) step_name: String,
    pub(crate) monitors: Vec<String>,
    pub(crate) informed: Vec<String>,
    pub(crate) lead_agent_id: String,
    pub(crate) output_json: String,
    pub(crate) error_code: String,
    pub(crate) error_message: String,
    pub(crate) retry_count: u32,
    pub(crate) cost: f64,
    pub(crate) duration_ms: u64,
    pub(crate) agent_id: String,
    pub(crate) wait_seconds: u64,
    pub(crate) detail: String,
    pub(crate) waiting_for: Vec<String>,
    /// The execution's final status, lowercased (`completed`), or empty.
    pub(crate) execution_status: String,
    /// Agents a session event is addressed to.
    pub(crate) participants: Vec<String>,
}

/// The agents that hear of `event`, each once with its strongest reason, in
/// agent id order:
/// - the step's informed agents on completion and failure;
/// - the step's monitors on every event of the step;
/// - the execution's lead on every event of the execution;
/// - the participants a session event is addressed to;
/// - the agent a step was delegated or escalated to (the event's
///   `agent_id`), as a participant: it hears that the step is now its own.
///
/// A step's progress (its model calls) reaches nobody: it is audit, read in
/// the execution's event log. An empty agent id names nobody and is skipped.
pub(crate) fn recipients(event: &Event) -> Vec<(String, Reason)> {
    fn add<'event>(strongest: &mut BTreeMap<&'event str, Reason>, agent: &'event str, reason: Reason) {
        if agent.is_empty() {
            return;
        }
        let entry = strongest.entry(agent).or_insert(reason);
        if reason > *entry {
            *entry = reason;
        }
    }
    if event.kind == EventKind::StepProgress {
        return Vec::new();
    }
    let mut strongest: BTreeMap<&str, Reason> = BTreeMap::new();
    if event.kind.is_outcome() {
        for agent in &event.informed {
            add(&mut strongest, agent, Reason::Informed);
        }
    }
    if !event.step_id.is_empty() {
        for agent in &event.monitors {
            add(&mut strongest, agent, Reason::Monitor);
        }
    }
    add(&mut strongest, &event.lead_agent_id, Reason::Lead);
    for agent in &event.participants {
        add(&mut strongest, agent, Reason::Participant);
    }
    if matches!(event.kind, EventKind::StepDelegated | EventKind::StepEscalated) {
        add(&mut strongest, &event.agent_id, Reason::Participant);
    }
    strongest.into_iter().map(|(agent, reason)| (agent.to_owned(), reason)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn event(kind: EventKind) -> Event {
        Event {
            event_id: "e1".to_owned(),
            kind,
            occurred_at: 1_768_559_400_000,
            execution_id: "x1".to_owned(),
            process_name: "content-pipeline".to_owned(),
            step_id: "research".to_owned(),
            step_name: "Research Topic".to_owned(),
            monitors: vec!["quality".to_owned(), "both".to_owned()],
            informed: vec!["learning".to_owned(), "both".to_owned(), "lead".to_owned()],
            lead_agent_id: "lead".to_owned(),
            output_json: String::new(),
            error_code: String::new(),
            error_message: String::new(),
            retry_count: 0,
            cost: 0.0,
            duration_ms: 0,
            agent_id: String::new(),
            wait_seconds: 0,
            detail: String::new(),
            waiting_for: Vec::new(),
            execution_status: String::new(),
            participants: Vec::new(),
        }
    }

    #[test]
    fn completion_reaches_informed_monitors_and_lead_once_each() {
        let recipients = recipients(&event(EventKind::StepCompleted));
        assert_eq!(
            recipients,
            vec![
                ("both".to_owned(), Reason::Monitor),
                ("lead".to_owned(), Reason::Lead),
                ("learning".to_owned(), Reason::Informed),
                ("quality".to_owned(), Reason::Monitor),
            ]
        );
    }

    #[test]
    fn start_skips_informed_agents() {
        let recipients = recipients(&event(EventKind::StepStarted));
        assert_eq!(
            recipients,
            vec![
                ("both".to_owned(), Reason::Monitor),
                ("lead".to_owned(), Reason::Lead),
                ("quality".to_owned(), Reason::Monitor),
            ]
        );
    }

    #[test]
    fn session_events_reach_their_participants_once() {
        let mut assigned = event(EventKind::RoleAssigned);
        assigned.step_id.clear();
        assigned.participants = vec!["dev".to_owned(), "lead".to_owned(), String::new()];
        assert_eq!(
            recipients(&assigned),
            vec![("dev".to_owned(), Reason::Participant), ("lead".to_owned(), Reason::Lead)]
        );
    }

    #[test]
    fn a_steps_progress_reaches_nobody() {
        let mut progress = event(EventKind::StepProgress);
        progress.participants = vec!["dev".to_owned()];
        assert!(recipients(&progress).is_empty());
    }

    #[test]
    fn execution_events_reach_only_the_lead() {
        let mut execution_event = event(EventKind::ExecutionFinished);
        execution_event.step_id.clear();
        assert_eq!(recipients(&execution_event), vec![("lead".to_owned(), Reason::Lead)]);
        execution_event.lead_agent_id.clear();
        assert!(recipients(&execution_event).is_empty());
    }

    #[test]
    fn the_agent_a_step_is_handed_to_hears_of_it() {
        for kind in [EventKind::StepDelegated, EventKind::StepEscalated] {
            let mut handed = event(kind);
            handed.agent_id = "delegate".to_owned();
            let heard = recipients(&handed);
            assert!(heard.contains(&("delegate".to_owned(), Reason::Participant)), "{kind:?}: {heard:?}");
        }
        let mut started = event(EventKind::StepStarted);
        started.agent_id = "executor".to_owned();
        assert!(
            recipients(&started).iter().all(|(agent, _)| agent != "executor"),
            "the executor is no recipient as such"
        );
    }
}
