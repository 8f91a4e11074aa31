//! The seed 004 delegation decision framework as a pure function over a
//! snapshot of the roster: no I/O, no clock of its own, deterministic.
//!
//! Priority order: a colleague the requester named (when eligible); best
//! same-team match; partial-expertise same team; best cross-team match; queue
//! for the primary expert when the wait fits; escalate to the senior. Never an
//! offline agent, never one without a free slot, never the requester, never an
//! agent already in the task's delegation chain.

use std::collections::{HashMap, HashSet};

use super::model::{Agent, Status, Team};

/// Most candidates a decision lists (the best ranked), so audit records stay small.
pub const MAX_CANDIDATES: usize = 20;

/// How urgent a task is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize)]
pub enum Urgency {
    /// May wait a day.
    Low,
    /// May wait four hours.
    #[default]
    Normal,
    /// May wait thirty minutes.
    High,
    /// Cannot wait.
    Critical,
}

impl Urgency {
    /// How long a task of this urgency may wait in a queue, in ms; `None` when it may not.
    pub fn max_wait_millis(self) -> Option<i64> {
        match self {
            Self::Low => Some(24 * 3_600_000),
            Self::Normal => Some(4 * 3_600_000),
            Self::High => Some(30 * 60_000),
            Self::Critical => None,
        }
    }

    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Low => "low",
            Self::Normal => "normal",
            Self::High => "high",
            Self::Critical => "critical",
        }
    }
}

/// A request for a delegation decision.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DelegationRequest {
    /// The task's unique id.
    pub task_id: String,
    /// The agent delegating; empty for the orchestrator.
    pub requester_id: String,
    /// Tags the task needs (normalised).
    pub required_expertise: Vec<String>,
    /// A role the delegate must have; empty for any.
    pub required_role: String,
    /// The team to prefer when there is no requester.
    pub team: String,
    /// Urgency.
    pub urgency: Urgency,
    /// Deadline in ms since the epoch.
    pub deadline: Option<i64>,
    /// Agents the task already passed through, oldest first.
    pub delegation_chain: Vec<String>,
    /// A colleague the requester named.
    pub preferred_agent_id: String,
    /// A sentence about the task.
    pub description: String,
    /// Decide only; reserve and record nothing.
    pub dry_run: bool,
}

/// DELEGATE, QUEUE or ESCALATE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum DecisionKind {
    /// Assign now.
    Delegate,
    /// Wait for the expert.
    Queue,
    /// Hand to the senior.
    Escalate,
}

impl DecisionKind {
    /// The seed's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Delegate => "DELEGATE",
            Self::Queue => "QUEUE",
            Self::Escalate => "ESCALATE",
        }
    }
}

/// The tier of the priority order that decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Tier {
    /// 1. Same team, full match.
    SameTeamMatch,
    /// 2. Same team, partial match.
    SameTeamPartial,
    /// 3. Another team, full match.
    CrossTeamMatch,
    /// 4. Queue for the primary expert.
    QueueForExpert,
    /// 5. Escalate.
    Escalate,
    /// The requester's named colleague.
    Named,
}

impl Tier {
    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SameTeamMatch => "same_team_match",
            Self::SameTeamPartial => "same_team_partial",
            Self::CrossTeamMatch => "cross_team_match",
            Self::QueueForExpert => "queue_for_expert",
            Self::Escalate => "escalate",
            Self::Named => "named",
        }
    }
}

/// The seed 004 DELEGATION DECISION.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Decision {
    /// DELEGATE, QUEUE or ESCALATE.
    pub kind: DecisionKind,
    /// The deciding tier.
    pub tier: Tier,
    /// The delegate, the expert queued for, or the senior; empty when no one is left to escalate to.
    pub primary_agent_id: String,
    /// Why the primary.
    pub primary_reason: String,
    /// The fallback; empty for none.
    pub fallback_agent_id: String,
    /// Why the fallback.
    pub fallback_reason: String,
    /// One or two sentences.
    pub reasoning: String,
    /// For QUEUE: the estimated wait in ms.
    pub wait_millis: i64,
    /// Special context.
    pub notes: String,
    /// The seed's text rendering.
    pub text: String,
    /// Agents considered, in ranked order (at most [`MAX_CANDIDATES`]).
    pub candidates: Vec<String>,
}

/// What the framework reads: the agents that may matter for one request.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Agents, including the requester, the named colleague and the senior chain.
    pub agents: Vec<Agent>,
    /// Tasks queued per expert, which lengthen the estimated wait.
    pub queued: HashMap<String, u32>,
    /// Teams (for their leads, the escalation target without a requester).
    pub teams: Vec<Team>,
}

/// Tunables of the framework.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// The assumed duration of one task, in ms, for wait estimates.
    pub average_task_millis: i64,
}

impl Default for Settings {
    fn default() -> Self {
        Self { average_task_millis: 30 * 60_000 }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Match {
    Full,
    Partial,
    None,
}

struct Ranked<'a> {
    agent: &'a Agent,
    tier: Tier,
    matched: usize,
}

/// Decides who takes a task. `now` is in ms since the epoch.
pub fn decide(request: &DelegationRequest, snapshot: &Snapshot, now: i64, settings: Settings) -> Decision {
    let by_id: HashMap<&str, &Agent> = snapshot.agents.iter().map(|agent| (agent.id.as_str(), agent)).collect();
    let requester = by_id.get(request.requester_id.as_str()).copied();
    let home_team = requester.map(|agent| agent.team.as_str()).filter(|team| !team.is_empty()).unwrap_or(&request.team);
    let chain: HashSet<&str> = request.delegation_chain.iter().map(String::as_str).collect();
    let mut notes = Vec::new();

    // The colleague the requester named comes first when eligible; an unknown
    // one is the seed's "colleague not in roster": escalate.
    if !request.preferred_agent_id.is_empty() {
        match by_id.get(request.preferred_agent_id.as_str()) {
            None => {
                let reason = format!(
                    "colleague {:?} is not in the roster; escalating to the manager",
                    request.preferred_agent_id
                );
                return escalate(request, snapshot, &by_id, home_team, &chain, reason, Vec::new(), notes);
            }
            Some(preferred) => match exclusion(request, preferred, &chain) {
                None if preferred.has_free_slot() => {
                    let ranked = rank(request, snapshot, home_team, &chain);
                    let fallback = ranked.iter().find(|candidate| candidate.agent.id != preferred.id);
                    let matched = matching_tags(request, preferred);
                    let mut candidates = vec![preferred.id.clone()];
                    candidates.extend(ranked.iter().map(|c| c.agent.id.clone()).filter(|id| *id != preferred.id));
                    if !request.required_expertise.is_empty() && matched.len() < request.required_expertise.len() {
                        notes.push(format!(
                            "{} was named by the requester but lacks some required expertise",
                            preferred.name
                        ));
                    }
                    let primary_reason = describe(preferred, &matched, home_team, "named by the requester");
                    let reasoning = format!(
                        "{} was named by the requester and is eligible: not offline, with a free slot ({}/{} tasks), not in the delegation chain.",
                        preferred.name, preferred.current_workload, preferred.workload_capacity
                    );
                    return finish(
                        DecisionKind::Delegate,
                        Tier::Named,
                        preferred,
                        primary_reason,
                        fallback.map(|f| (f.agent, describe(f.agent, &matching_tags(request, f.agent), home_team, tier_phrase(f.tier)))),
                        reasoning,
                        0,
                        notes,
                        candidates,
                    );
                }
                None => notes.push(format!(
                    "named colleague {} has no free slot ({}/{} tasks, {}); the framework decided",
                    preferred.name,
                    preferred.current_workload,
                    preferred.workload_capacity,
                    preferred.status().as_str()
                )),
                Some(why) => notes.push(format!("named colleague {} was not chosen: {why}", preferred.name)),
            },
        }
    }

    let ranked = rank(request, snapshot, home_team, &chain);
    let loop_note = loop_note(request, snapshot, &chain);
    if let Some(note) = &loop_note {
        notes.push(note.clone());
    }
    let candidates: Vec<String> = ranked.iter().map(|c| c.agent.id.clone()).collect();
    if let Some(primary) = ranked.first() {
        let fallback = ranked.get(1);
        let reasoning = match primary.tier {
            Tier::SameTeamMatch => format!(
                "{} has the required expertise, is on the same team (no coordination overhead) and has the lowest workload among the matches ({}/{} tasks).",
                primary.agent.name, primary.agent.current_workload, primary.agent.workload_capacity
            ),
            Tier::SameTeamPartial => format!(
                "No available same-team colleague has all the required expertise; {} has part of it ({}) and can learn with guidance.",
                primary.agent.name,
                matching_tags(request, primary.agent).join(", ")
            ),
            _ => format!(
                "No same-team colleague is available with the required expertise; {} on team {} has it and a free slot ({}/{} tasks).",
                primary.agent.name,
                display_team(&primary.agent.team),
                primary.agent.current_workload,
                primary.agent.workload_capacity
            ),
        };
        if primary.tier == Tier::CrossTeamMatch && !home_team.is_empty() {
            notes.push(format!(
                "cross-team delegation from team {home_team} to team {}: expect coordination overhead",
                display_team(&primary.agent.team)
            ));
        }
        return finish(
            DecisionKind::Delegate,
            primary.tier,
            primary.agent,
            describe(primary.agent, &matching_tags(request, primary.agent), home_team, tier_phrase(primary.tier)),
            fallback.map(|f| (f.agent, describe(f.agent, &matching_tags(request, f.agent), home_team, tier_phrase(f.tier)))),
            reasoning,
            0,
            notes,
            candidates,
        );
    }

    // Tier 4: the primary expert is busy but not offline; queue when the wait fits.
    let mut experts: Vec<(&Agent, i64)> = snapshot
        .agents
        .iter()
        .filter(|agent| !is_excluded(request, agent, &chain))
        .filter(|agent| expertise_match(request, agent) == Match::Full && !agent.has_free_slot())
        .map(|agent| (agent, estimated_wait(agent, snapshot, now, settings)))
        .collect();
    experts.sort_by(|(a, wait_a), (b, wait_b)| {
        (a.team != home_team || home_team.is_empty(), *wait_a, &a.id).cmp(&(
            b.team != home_team || home_team.is_empty(),
            *wait_b,
            &b.id,
        ))
    });
    let mut considered = candidates;
    considered.extend(experts.iter().map(|(agent, _)| agent.id.clone()));
    let reason = if let Some((expert, wait)) = experts.first() {
        let limit = request.urgency.max_wait_millis();
        let fits_deadline = request.deadline.is_none_or(|deadline| now.saturating_add(*wait) <= deadline);
        match limit {
            Some(limit) if *wait <= limit && fits_deadline => {
                let target = escalation_target(request, snapshot, &by_id, home_team, &chain);
                let fallback = target.map(|senior| {
                    (senior, format!("{}, senior to escalate to if the wait runs over", role_label(senior)))
                });
                let reasoning = format!(
                    "Every matching colleague is at capacity; {} is the primary expert and expects to free a slot in about {}, which fits a {} task.",
                    expert.name,
                    format_wait(*wait),
                    request.urgency.as_str()
                );
                let matched = matching_tags(request, expert);
                return finish(
                    DecisionKind::Queue,
                    Tier::QueueForExpert,
                    expert,
                    describe(expert, &matched, home_team, "primary expert, at capacity"),
                    fallback,
                    reasoning,
                    *wait,
                    notes,
                    considered,
                );
            }
            None => format!("{} is the primary expert but at capacity, and a critical task cannot wait", expert.name),
            Some(limit) if *wait > limit => format!(
                "{} is the primary expert but the estimated wait of {} exceeds the {} a {} task may wait",
                expert.name,
                format_wait(*wait),
                format_wait(limit),
                request.urgency.as_str()
            ),
            Some(_) => format!(
                "{} is the primary expert but the estimated wait of {} runs past the deadline",
                expert.name,
                format_wait(*wait)
            ),
        }
    } else if snapshot.agents.iter().any(|agent| {
        agent.id != request.requester_id
            && expertise_match(request, agent) != Match::None
            && role_matches(request, agent)
    }) {
        if loop_note.is_some()
            && !snapshot.agents.iter().any(|agent| {
                agent.id != request.requester_id
                    && !chain.contains(agent.id.as_str())
                    && expertise_match(request, agent) != Match::None
                    && role_matches(request, agent)
                    && agent.status() != Status::Offline
            })
        {
            "every colleague with the expertise is already in the delegation chain or offline; delegating back would loop".to_owned()
        } else {
            "every colleague with the required expertise is offline".to_owned()
        }
    } else {
        "no colleague has the required expertise; escalating to the manager for guidance".to_owned()
    };
    escalate(request, snapshot, &by_id, home_team, &chain, reason, considered, notes)
}

#[allow(clippy::too_many_arguments)]
fn escalate(
    request: &DelegationRequest,
    snapshot: &Snapshot,
    by_id: &HashMap<&str, &Agent>,
    home_team: &str,
    chain: &HashSet<&str>,
    reason: String,
    candidates: Vec<String>,
    notes: Vec<String>,
) -> Decision {
    let target = escalation_target(request, snapshot, by_id, home_team, chain);
    let reasoning = format!("{}.", capitalize(&reason));
    let mut candidates = candidates;
    candidates.truncate(MAX_CANDIDATES);
    match target {
        Some(senior) => {
            let primary_reason = format!("{}, senior to escalate to", role_label(senior));
            finish(
                DecisionKind::Escalate,
                Tier::Escalate,
                senior,
                primary_reason,
                None,
                reasoning,
                0,
                notes,
                candidates,
            )
        }
        None => {
            let mut notes = notes;
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
            };
            decision.text = render_text(&decision, "none", "");
            decision
        }
    }
}

/// The senior to escalate to: the requester's senior, or further up when that
/// one is offline or in the chain; without a requester, the team's lead.
fn escalation_target<'a>(
    request: &DelegationRequest,
    snapshot: &'a Snapshot,
    by_id: &HashMap<&str, &'a Agent>,
    home_team: &str,
    chain: &HashSet<&str>,
) -> Option<&'a Agent> {
    let usable = |agent: &&Agent| {
        agent.id != request.requester_id && !chain.contains(agent.id.as_str()) && agent.status() != Status::Offline
    };
    let mut seen = HashSet::new();
    let mut current = by_id.get(request.requester_id.as_str()).copied();
    while let Some(agent) = current {
        if !seen.insert(agent.id.as_str()) {
            break;
        }
        let senior = by_id.get(agent.senior_id.as_str()).copied();
        if let Some(senior) = senior.filter(usable) {
            return Some(senior);
        }
        current = senior;
    }
    snapshot
        .teams
        .iter()
        .find(|team| team.name == home_team)
        .and_then(|team| by_id.get(team.lead_agent_id.as_str()).copied())
        .filter(usable)
}

fn rank<'a>(
    request: &'a DelegationRequest,
    snapshot: &'a Snapshot,
    home_team: &str,
    chain: &HashSet<&str>,
) -> Vec<Ranked<'a>> {
    let mut ranked: Vec<Ranked<'a>> = snapshot
        .agents
        .iter()
        .filter(|agent| !is_excluded(request, agent, chain) && agent.has_free_slot())
        .filter_map(|agent| {
            let same_team = !home_team.is_empty() && agent.team == home_team;
            let tier = match (expertise_match(request, agent), same_team) {
                (Match::Full, true) => Tier::SameTeamMatch,
                (Match::Partial, true) => Tier::SameTeamPartial,
                (Match::Full, false) => Tier::CrossTeamMatch,
                _ => return None,
            };
            Some(Ranked { agent, tier, matched: matched_count(request, agent) })
        })
        .collect();
    let order = |tier: Tier| match tier {
        Tier::SameTeamMatch => 0,
        Tier::SameTeamPartial => 1,
        _ => 2,
    };
    ranked.sort_by(|a, b| {
        (order(a.tier), std::cmp::Reverse(a.matched), a.agent.current_workload, &a.agent.id).cmp(&(
            order(b.tier),
            std::cmp::Reverse(b.matched),
            b.agent.current_workload,
            &b.agent.id,
        ))
    });
    ranked
}

/// Whether an agent can never take this task (apart from capacity); the
/// allocation-free twin of [`exclusion`].
fn is_excluded(request: &DelegationRequest, agent: &Agent, chain: &HashSet<&str>) -> bool {
    agent.id == request.requester_id
        || chain.contains(agent.id.as_str())
        || agent.status() == Status::Offline
        || !role_matches(request, agent)
}

fn matched_count(request: &DelegationRequest, agent: &Agent) -> usize {
    request.required_expertise.iter().filter(|tag| agent.expertise.binary_search(tag).is_ok()).count()
}

/// Why an agent can never take this task (apart from capacity), if it cannot.
fn exclusion(request: &DelegationRequest, agent: &Agent, chain: &HashSet<&str>) -> Option<String> {
    if agent.id == request.requester_id {
        Some("it is the requester itself".to_owned())
    } else if chain.contains(agent.id.as_str()) {
        Some(format!(
            "it is already in the delegation chain ({}); delegating back would loop",
            request.delegation_chain.join(" -> ")
        ))
    } else if agent.status() == Status::Offline {
        Some("it is offline".to_owned())
    } else if !role_matches(request, agent) {
        Some(format!("its role {:?} is not the required role {:?}", agent.role, request.required_role))
    } else {
        None
    }
}

fn loop_note(request: &DelegationRequest, snapshot: &Snapshot, chain: &HashSet<&str>) -> Option<String> {
    let by_id: HashMap<&str, &Agent> = snapshot.agents.iter().map(|agent| (agent.id.as_str(), agent)).collect();
    let mut looped: Vec<&str> = Vec::new();
    for id in &request.delegation_chain {
        let Some(agent) = by_id.get(id.as_str()) else { continue };
        if *id != request.requester_id
            && !looped.contains(&id.as_str())
            && chain.contains(id.as_str())
            && expertise_match(request, agent) != Match::None
            && role_matches(request, agent)
        {
            looped.push(id);
        }
    }
    if looped.is_empty() {
        return None;
    }
    let mut path = request.delegation_chain.join(" -> ");
    if !request.requester_id.is_empty() && request.delegation_chain.last() != Some(&request.requester_id) {
        path = format!("{path} -> {}", request.requester_id);
    }
    Some(format!("loop prevented: the task came through {path}; not delegating back to {}", looped.join(", ")))
}

fn role_matches(request: &DelegationRequest, agent: &Agent) -> bool {
    request.required_role.is_empty() || agent.role == request.required_role
}

fn expertise_match(request: &DelegationRequest, agent: &Agent) -> Match {
    if request.required_expertise.is_empty() {
        return Match::Full;
    }
    let matched = matched_count(request, agent);
    if matched == request.required_expertise.len() {
        Match::Full
    } else if matched > 0 {
        Match::Partial
    } else {
        Match::None
    }
}

fn matching_tags<'a>(request: &'a DelegationRequest, agent: &Agent) -> Vec<&'a str> {
    request
        .required_expertise
        .iter()
        .filter(|tag| agent.expertise.binary_search(tag).is_ok())
        .map(String::as_str)
        .collect()
}

/// The estimated wait for a slot of a busy agent: until its `availability_until`
/// when that lies ahead, else one average task, plus one average task per task
/// already queued for it.
pub fn estimated_wait(agent: &Agent, snapshot: &Snapshot, now: i64, settings: Settings) -> i64 {
    let base = match agent.availability_until {
        Some(until) if until > now => until - now,
        _ => settings.average_task_millis,
    };
    let ahead = i64::from(snapshot.queued.get(&agent.id).copied().unwrap_or(0));
    base.saturating_add(ahead.saturating_mul(settings.average_task_millis))
}

fn tier_phrase(tier: Tier) -> &'static str {
    match tier {
        Tier::SameTeamMatch => "same team",
        Tier::SameTeamPartial => "same team, partial expertise",
        Tier::CrossTeamMatch => "cross-team",
        Tier::QueueForExpert => "primary expert",
        Tier::Escalate => "senior",
        Tier::Named => "named by the requester",
    }
}

fn describe(agent: &Agent, matched: &[&str], home_team: &str, phrase: &str) -> String {
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

fn role_label(agent: &Agent) -> String {
    if agent.role.is_empty() { "no role".to_owned() } else { agent.role.clone() }
}

fn display_team(team: &str) -> &str {
    if team.is_empty() { "(none)" } else { team }
}

#[allow(clippy::too_many_arguments)]
fn finish(
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
    };
    decision.text = render_text(&decision, &primary.name, &fallback_name);
    decision
}

/// Renders a decision in the seed's DELEGATION DECISION format.
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

fn capitalize(text: &str) -> String {
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

/// The ESCALATE that resolves a queued task gone stale (or whose expert went
/// offline or was removed). `senior` is the escalation target chosen when queued.
pub fn queue_escalation_decision(expert_id: &str, senior: Option<&Agent>, reason: &str) -> Decision {
    let reasoning = format!("{}.", capitalize(reason));
    let notes = vec![format!("was queued for {expert_id}")];
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
            vec![expert_id.to_owned()],
        ),
        None => {
            let mut decision = Decision {
                kind: DecisionKind::Escalate,
                tier: Tier::Escalate,
                primary_agent_id: String::new(),
                primary_reason: "no senior or team lead to escalate to".to_owned(),
                fallback_agent_id: String::new(),
                fallback_reason: String::new(),
                reasoning,
                wait_millis: 0,
                notes: format!(
                    "{}; no senior or team lead to escalate to: the orchestrator must decide",
                    notes.join("; ")
                ),
                text: String::new(),
                candidates: vec![expert_id.to_owned()],
            };
            decision.text = render_text(&decision, "none", "");
            decision
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const TAGS: [&str; 3] = ["x", "y", "z"];

    fn agent_strategy(index: usize) -> impl Strategy<Value = Agent> {
        (
            0..3_usize,
            proptest::collection::vec(any::<bool>(), 3),
            1..6_u32,
            0..6_u32,
            0..4_u8,
            0..11_usize,
            any::<bool>(),
        )
            .prop_map(move |(team, tags, capacity, workload, manual, senior, has_until)| Agent {
                id: format!("a{index}"),
                name: format!("A{index}"),
                role: if index.is_multiple_of(2) { "even".into() } else { "odd".into() },
                team: format!("t{team}"),
                senior_id: if senior < 10 && senior != index { format!("a{senior}") } else { String::new() },
                expertise: TAGS.iter().zip(&tags).filter(|(_, on)| **on).map(|(tag, _)| (*tag).to_owned()).collect(),
                manual_status: match manual {
                    0 => Some(Status::Offline),
                    1 => Some(Status::Busy),
                    _ => None,
                },
                current_workload: workload.min(capacity),
                workload_capacity: capacity,
                availability_until: has_until.then_some(1_000 + i64::from(workload) * 3_600_000),
                ..Agent::default()
            })
    }

    fn case_strategy() -> impl Strategy<Value = (Vec<Agent>, DelegationRequest)> {
        let agents = (0..10_usize).map(agent_strategy).collect::<Vec<_>>();
        (
            agents,
            0..11_usize,
            proptest::collection::vec(any::<bool>(), 3),
            proptest::collection::vec(0..10_usize, 0..4),
            0..13_usize,
            0..4_u8,
            0..3_u8,
        )
            .prop_map(|(agents, requester, tags, chain, preferred, urgency, role)| {
                let request = DelegationRequest {
                    task_id: "task".into(),
                    requester_id: if requester < 10 { format!("a{requester}") } else { String::new() },
                    required_expertise: TAGS
                        .iter()
                        .zip(&tags)
                        .filter(|(_, on)| **on)
                        .map(|(tag, _)| (*tag).to_owned())
                        .collect(),
                    required_role: match role {
                        0 => "even".into(),
                        _ => String::new(),
                    },
                    team: "t1".into(),
                    urgency: [Urgency::Low, Urgency::Normal, Urgency::High, Urgency::Critical][usize::from(urgency)],
                    delegation_chain: chain.into_iter().map(|index| format!("a{index}")).collect(),
                    preferred_agent_id: match preferred {
                        10 => "ghost".into(),
                        11 | 12 => String::new(),
                        index => format!("a{index}"),
                    },
                    ..DelegationRequest::default()
                };
                (agents, request)
            })
    }

    proptest! {
        #[test]
        fn never_offline_never_full_never_in_the_chain((agents, request) in case_strategy()) {
            let snapshot = Snapshot { agents: agents.clone(), ..Snapshot::default() };
            let decision = decide(&request, &snapshot, 1_000, Settings::default());
            let chosen = agents.iter().find(|agent| agent.id == decision.primary_agent_id);
            if !decision.primary_agent_id.is_empty() {
                prop_assert!(!request.delegation_chain.contains(&decision.primary_agent_id), "{decision:?}");
                prop_assert_ne!(&decision.primary_agent_id, &request.requester_id);
            }
            match decision.kind {
                DecisionKind::Delegate => {
                    let chosen = chosen.expect("a delegate exists");
                    prop_assert!(chosen.status() != Status::Offline);
                    prop_assert!(chosen.has_free_slot() && chosen.current_workload < chosen.workload_capacity);
                    prop_assert!(request.required_role.is_empty() || chosen.role == request.required_role);
                }
                DecisionKind::Queue => {
                    let chosen = chosen.expect("an expert exists");
                    prop_assert!(chosen.status() != Status::Offline);
                    prop_assert!(!chosen.has_free_slot());
                    prop_assert!(request.urgency != Urgency::Critical);
                    prop_assert!(decision.wait_millis <= request.urgency.max_wait_millis().unwrap_or(0));
                }
                DecisionKind::Escalate => {
                    if let Some(senior) = chosen {
                        prop_assert!(senior.status() != Status::Offline);
                    }
                }
            }
            prop_assert!(decision.text.starts_with("DELEGATION DECISION:\nPrimary Choice: "));
        }

        #[test]
        fn the_decision_does_not_depend_on_the_order_of_the_roster((agents, request) in case_strategy(), seed in any::<u64>()) {
            let forward = decide(&request, &Snapshot { agents: agents.clone(), ..Snapshot::default() }, 1_000, Settings::default());
            let mut shuffled = agents;
            let len = shuffled.len();
            for index in 0..len {
                let other = usize::try_from(seed.rotate_left(u32::try_from(index).unwrap_or(0)) % len as u64).unwrap_or(0);
                shuffled.swap(index, other);
            }
            let backward = decide(&request, &Snapshot { agents: shuffled, ..Snapshot::default() }, 1_000, Settings::default());
            prop_assert_eq!(forward, backward);
        }

        #[test]
        fn an_available_same_team_expert_is_always_found((agents, request) in case_strategy()) {
            let snapshot = Snapshot { agents: agents.clone(), ..Snapshot::default() };
            let decision = decide(&request, &snapshot, 1_000, Settings::default());
            let requester_team = agents.iter().find(|a| a.id == request.requester_id).map(|a| a.team.clone()).unwrap_or_else(|| request.team.clone());
            let exists = agents.iter().any(|agent| {
                agent.team == requester_team
                    && agent.id != request.requester_id
                    && !request.delegation_chain.contains(&agent.id)
                    && agent.has_free_slot()
                    && (request.required_role.is_empty() || agent.role == request.required_role)
                    && request.required_expertise.iter().all(|tag| agent.expertise.contains(tag))
            });
            if exists && request.preferred_agent_id != "ghost" {
                prop_assert!(matches!(decision.tier, Tier::SameTeamMatch | Tier::Named), "{decision:?}");
            }
        }
    }

    #[test]
    fn format_wait_reads_well() {
        assert_eq!(format_wait(30 * 60_000), "30m");
        assert_eq!(format_wait(5 * 3_600_000 + 60_000), "5h 1m");
        assert_eq!(format_wait(4 * 3_600_000), "4h");
        assert_eq!(format_wait(5_000), "5s");
    }
}
