//! The text of delegation decisions: the DELEGATION DECISION format of the
//! agents' prompt, the reasons that describe a colleague, and the decisions
//! that resolve a queued task.

use super::{Decision, DecisionKind, MAX_CANDIDATES, Tier};
use crate::domain::model::Agent;

pub(super) fn tier_phrase(tier: Tier) -> &'static str {
    match tier {
        Tier::SameTeamMatch => "same team",
        Tier::SameTeamPartial => "same team, partial expertise",
        Tier::CrossTeamMatch => "cross-team",
        Tier::QueueForExpert => "primary expert",
        Tier::Escalate => "senior",
        Tier::Named => "named by the requester",
    }
}

pub(super) fn describe(agent: &Agent, matched: &[&str], home_team: &str, phrase: &str) -> String {
    let mut parts = vec![role_label(agent)];
    if !matched.is_empty() {
        parts.push(format!("{} expertise", matched.join(", ")));
    }
    let placement = if phrase == "same team" || phrase.starts_with("same team") || phrase == "cross-team" {
        phrase.to_owned()
    } else if !home_team.is_empty() && agent.team == home_team {
        format!("{phrase}, same team")
    } else {
        format!("{phrase}, team {}", display_team(&agent.team))
    };
    parts.push(placement);
    parts.push(agent.status().as_str().to_owned());
    parts.push(format!("{}/{} tasks", agent.current_workload, agent.workload_capacity));
    parts.join(", ")
}

pub(super) fn role_label(agent: &Agent) -> String {
    if agent.role.is_empty() { "no role".to_owned() } else { agent.role.clone() }
}

pub(super) fn display_team(team: &str) -> &str {
    if team.is_empty() { "(none)" } else { team }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn finish(
    kind: DecisionKind,
    tier: Tier,
    primary: &Agent,
    primary_reason: String,
    fallback: Option<(&Agent, String)>,
    reasoning: String,
    wait_millis: i64,
    notes: Vec<String>,
    candidates: Vec<String>,
) -> Decision {
    let mut candidates = candidates;
    candidates.truncate(MAX_CANDIDATES);
    let (fallback_agent_id, fallback_reason, fallback_name) = match fallback {
        Some((agent, reason)) => (agent.id.clone(), reason, agent.name.clone()),
        None => (String::new(), String::new(), String::new()),
    };
    let mut decision = Decision {
        kind,
        tier,
        primary_agent_id: primary.id.clone(),
        primary_reason,
        fallback_agent_id,
        fallback_reason,
        reasoning,
        wait_millis,
        notes: notes.join("; "),
        text: String::new(),
        candidates,
        over_capacity: false,
    };
    decision.text = render_text(&decision, &primary.name, &fallback_name);
    decision
}

/// Renders a decision in the DELEGATION DECISION format of the agents' prompt.
pub fn render_text(decision: &Decision, primary_name: &str, fallback_name: &str) -> String {
    let mut text = String::from("DELEGATION DECISION:\n");
    text.push_str(&format!("Primary Choice: {primary_name} ({})\n", decision.primary_reason));
    if !decision.fallback_agent_id.is_empty() {
        text.push_str(&format!("Fallback: {fallback_name} ({})\n", decision.fallback_reason));
    }
    let target =
        if decision.primary_agent_id.is_empty() { "the orchestrator".to_owned() } else { primary_name.to_owned() };
    let verb = match decision.kind {
        DecisionKind::Delegate => "to",
        DecisionKind::Queue => "for",
        DecisionKind::Escalate => "to",
    };
    text.push_str(&format!("Decision: {} {verb} {target}\n", decision.kind.as_str()));
    text.push_str(&format!("Reasoning: {}\n", decision.reasoning));
    if decision.kind == DecisionKind::Queue {
        text.push_str(&format!("Wait Time: {}\n", format_wait(decision.wait_millis)));
    }
    if !decision.notes.is_empty() {
        text.push_str(&format!("Notes: {}\n", decision.notes));
    }
    text
}

/// A duration in ms as `2h 5m`, `45m` or `30s`.
pub fn format_wait(millis: i64) -> String {
    let seconds = millis.max(0) / 1000;
    let (hours, minutes) = (seconds / 3600, (seconds % 3600) / 60);
    match (hours, minutes) {
        (0, 0) => format!("{seconds}s"),
        (0, minutes) => format!("{minutes}m"),
        (hours, 0) => format!("{hours}h"),
        (hours, minutes) => format!("{hours}h {minutes}m"),
    }
}

pub(super) fn capitalize(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// The DELEGATE that resolves a queued task when its expert frees a slot.
pub fn queue_offer_decision(expert: &Agent, queued_at: i64, now: i64) -> Decision {
    let reasoning = format!(
        "{} freed a slot and this task was the oldest queued for them (waited {}).",
        expert.name,
        format_wait(now - queued_at)
    );
    finish(
        DecisionKind::Delegate,
        Tier::QueueForExpert,
        expert,
        format!(
            "{}, primary expert, slot freed, {}/{} tasks",
            role_label(expert),
            expert.current_workload,
            expert.workload_capacity
        ),
        None,
        reasoning,
        0,
        Vec::new(),
        vec![expert.id.clone()],
    )
}

/// An ESCALATE to `senior`; without one, an ESCALATE to nobody that leaves the
/// decision to the orchestrator.
pub(super) fn escalation(
    senior: Option<&Agent>,
    reasoning: String,
    mut notes: Vec<String>,
    candidates: Vec<String>,
) -> Decision {
    match senior {
        Some(senior) => finish(
            DecisionKind::Escalate,
            Tier::Escalate,
            senior,
            format!("{}, senior to escalate to", role_label(senior)),
            None,
            reasoning,
            0,
            notes,
            candidates,
        ),
        None => {
            notes.push("no senior or team lead to escalate to: the orchestrator must decide".to_owned());
            let mut decision = Decision {
                kind: DecisionKind::Escalate,
                tier: Tier::Escalate,
                primary_agent_id: String::new(),
                primary_reason: "no senior or team lead to escalate to".to_owned(),
                fallback_agent_id: String::new(),
                fallback_reason: String::new(),
                reasoning,
                wait_millis: 0,
                notes: notes.join("; "),
                text: String::new(),
                candidates,
                over_capacity: false,
            };
            decision.text = render_text(&decision, "none", "");
            decision
        }
    }
}

/// The ESCALATE that resolves a queued task gone stale (or whose expert went
/// offline or was removed). `senior` is the escalation target chosen when queued.
pub fn queue_escalation_decision(expert_id: &str, senior: Option<&Agent>, reason: &str) -> Decision {
    let reasoning = format!("{}.", capitalize(reason));
    let notes = vec![format!("was queued for {expert_id}")];
    escalation(senior, reasoning, notes, vec![expert_id.to_owned()])
}
