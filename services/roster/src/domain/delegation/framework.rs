//! The framework itself: the tiers of the priority order over a snapshot,
//! the matching of expertise and roles, and the estimated wait.

use std::collections::{HashMap, HashSet};

use super::text::{capitalize, describe, display_team, escalation, finish, role_label, tier_phrase};
use super::{
    Decision, DecisionKind, DelegationRequest, MAX_CANDIDATES, Settings, Snapshot, Tier, Urgency, format_wait,
};
use crate::domain::model::{Agent, Status};

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
///
/// A task assigned to an agent ([`DelegationRequest::assigned_agent_id`])
/// goes to that agent when it has a free slot (or, urgent, its one slot
/// over capacity), waits in its queue when it is at capacity or busy, and
/// escalates when it is offline or not in the roster; the criteria, the
/// chain and the requester do not apply.
pub fn decide(request: &DelegationRequest, snapshot: &Snapshot, now: i64, settings: Settings) -> Decision {
    let deciding = Deciding::new(request, snapshot);
    if !request.assigned_agent_id.is_empty() {
        return deciding.assigned(now, settings);
    }
    let mut notes = Vec::new();
    // The colleague the requester named comes first when eligible; an unknown
    // one is "colleague not in the roster": escalate.
    if !request.preferred_agent_id.is_empty() {
        let Some(preferred) = deciding.by_id.get(request.preferred_agent_id.as_str()) else {
            let reason =
                format!("colleague {:?} is not in the roster; escalating to the manager", request.preferred_agent_id);
            return deciding.escalate(reason, Vec::new(), notes);
        };
        if let Some(decision) = deciding.named(preferred, &mut notes) {
            return decision;
        }
    }
    let ranked = rank(request, snapshot, deciding.home_team, &deciding.chain);
    let loop_note = loop_note(request, snapshot, &deciding.chain);
    if let Some(note) = &loop_note {
        notes.push(note.clone());
    }
    let candidates: Vec<String> = ranked.iter().map(|c| c.agent.id.clone()).collect();
    if let Some(primary) = ranked.first() {
        return deciding.best_match(primary, ranked.get(1), notes, candidates);
    }
    deciding.expert_at_capacity(candidates, loop_note.is_some(), notes, now, settings)
}

/// One decision underway: the request, the snapshot it reads, and what
/// every tier derives from them once.
struct Deciding<'a> {
    request: &'a DelegationRequest,
    snapshot: &'a Snapshot,
    by_id: HashMap<&'a str, &'a Agent>,
    /// The team named in the request, else the requester's.
    home_team: &'a str,
    /// The agents already in the task's delegation chain.
    chain: HashSet<&'a str>,
}

impl<'a> Deciding<'a> {
    fn new(request: &'a DelegationRequest, snapshot: &'a Snapshot) -> Self {
        let by_id: HashMap<&str, &Agent> = snapshot.agents.iter().map(|agent| (agent.id.as_str(), &**agent)).collect();
        let requester = by_id.get(request.requester_id.as_str()).copied();
        // A team named in the request wins; else the requester's team.
        let home_team = if request.team.is_empty() {
            requester.map(|agent| agent.team.as_str()).unwrap_or_default()
        } else {
            request.team.as_str()
        };
        let chain = request.delegation_chain.iter().map(String::as_str).collect();
        Self { request, snapshot, by_id, home_team, chain }
    }

    /// Why `agent` fits, for the decision's text.
    fn describe(&self, agent: &Agent, tier: &str) -> String {
        describe(agent, &matching_tags(self.request, agent), self.home_team, tier)
    }

    /// The colleague the requester named, when eligible with a free slot;
    /// otherwise `None`, with a note saying why the framework decided.
    fn named(&self, preferred: &Agent, notes: &mut Vec<String>) -> Option<Decision> {
        let request = self.request;
        match exclusion(request, preferred, &self.chain) {
            None if preferred.has_free_slot() => {
                let ranked = rank(request, self.snapshot, self.home_team, &self.chain);
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
                let primary_reason = describe(preferred, &matched, self.home_team, "named by the requester");
                let reasoning = format!(
                    "{} was named by the requester and is eligible: not offline, with a free slot ({}/{} tasks), not in the delegation chain.",
                    preferred.name, preferred.current_workload, preferred.workload_capacity
                );
                Some(finish(
                    DecisionKind::Delegate,
                    Tier::Named,
                    preferred,
                    primary_reason,
                    fallback.map(|f| (f.agent, self.describe(f.agent, tier_phrase(f.tier)))),
                    reasoning,
                    0,
                    std::mem::take(notes),
                    candidates,
                ))
            }
            None => {
                notes.push(format!(
                    "named colleague {} has no free slot ({}/{} tasks, {}); the framework decided",
                    preferred.name,
                    preferred.current_workload,
                    preferred.workload_capacity,
                    preferred.status().as_str()
                ));
                None
            }
            Some(why) => {
                notes.push(format!("named colleague {} was not chosen: {why}", preferred.name));
                None
            }
        }
    }

    /// Tiers 1 to 3: the best ranked colleague with a free slot (same team
    /// and full match, same team and partial, another team and full).
    fn best_match(
        &self,
        primary: &Ranked<'_>,
        fallback: Option<&Ranked<'_>>,
        mut notes: Vec<String>,
        candidates: Vec<String>,
    ) -> Decision {
        let reasoning = match primary.tier {
            Tier::SameTeamMatch => format!(
                "{} has the required expertise, is on the same team (no coordination overhead) and has the lowest workload among the matches ({}/{} tasks).",
                primary.agent.name, primary.agent.current_workload, primary.agent.workload_capacity
            ),
            Tier::SameTeamPartial => format!(
                "No available same-team colleague has all the required expertise; {} has part of it ({}) and can learn with guidance.",
                primary.agent.name,
                matching_tags(self.request, primary.agent).join(", ")
            ),
            _ => format!(
                "No same-team colleague is available with the required expertise; {} on team {} has it and a free slot ({}/{} tasks).",
                primary.agent.name,
                display_team(&primary.agent.team),
                primary.agent.current_workload,
                primary.agent.workload_capacity
            ),
        };
        if primary.tier == Tier::CrossTeamMatch && !self.home_team.is_empty() {
            notes.push(format!(
                "cross-team delegation from team {} to team {}: expect coordination overhead",
                self.home_team,
                display_team(&primary.agent.team)
            ));
        }
        finish(
            DecisionKind::Delegate,
            primary.tier,
            primary.agent,
            self.describe(primary.agent, tier_phrase(primary.tier)),
            fallback.map(|f| (f.agent, self.describe(f.agent, tier_phrase(f.tier)))),
            reasoning,
            0,
            notes,
            candidates,
        )
    }

    /// Tier 4, when no colleague has a free slot: the primary expert, busy
    /// but not offline, takes an urgent task in its one slot over capacity,
    /// or the task queues for it when the wait fits; tier 5 otherwise.
    fn expert_at_capacity(
        &self,
        candidates: Vec<String>,
        looped: bool,
        notes: Vec<String>,
        now: i64,
        settings: Settings,
    ) -> Decision {
        let request = self.request;
        let home_team = self.home_team;
        let mut experts: Vec<(&Agent, i64)> = self
            .snapshot
            .agents
            .iter()
            .filter(|agent| !is_excluded(request, agent, &self.chain))
            .filter(|agent| expertise_match(request, agent) == Match::Full && !agent.has_free_slot())
            .map(|agent| (&**agent, estimated_wait(agent, self.snapshot, now, settings)))
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
        // 5/5 means only urgent tasks: an urgent task takes the primary expert's
        // one slot over capacity rather than wait (an expert already over, or set
        // busy by hand, has none to give).
        if request.urgency.is_urgent()
            && let Some((expert, _)) = experts.iter().find(|(agent, _)| has_slot_over_capacity(agent))
        {
            return self.over_capacity(expert, notes, considered);
        }
        let Some(&(expert, wait)) = experts.first() else {
            return self.escalate(self.why_no_expert(looped), considered, notes);
        };
        let limit = request.urgency.max_wait_millis();
        let fits_deadline = request.deadline.is_none_or(|deadline| now.saturating_add(wait) <= deadline);
        let reason = match limit {
            Some(limit) if wait <= limit && fits_deadline => {
                let target = self.escalation_target();
                let fallback = target.map(|senior| {
                    (senior, format!("{}, senior to escalate to if the wait runs over", role_label(senior)))
                });
                let reasoning = format!(
                    "Every matching colleague is at capacity; {} is the primary expert and expects to free a slot in about {}, which fits a {} task.",
                    expert.name,
                    format_wait(wait),
                    request.urgency.as_str()
                );
                return finish(
                    DecisionKind::Queue,
                    Tier::QueueForExpert,
                    expert,
                    self.describe(expert, "primary expert, at capacity"),
                    fallback,
                    reasoning,
                    wait,
                    notes,
                    considered,
                );
            }
            None => format!("{} is the primary expert but at capacity, and a critical task cannot wait", expert.name),
            Some(limit) if wait > limit => format!(
                "{} is the primary expert but the estimated wait of {} exceeds the {} a {} task may wait",
                expert.name,
                format_wait(wait),
                format_wait(limit),
                request.urgency.as_str()
            ),
            Some(_) => format!(
                "{} is the primary expert but the estimated wait of {} runs past the deadline",
                expert.name,
                format_wait(wait)
            ),
        };
        self.escalate(reason, considered, notes)
    }

    /// An urgent task in the primary expert's one slot over capacity.
    fn over_capacity(&self, expert: &Agent, mut notes: Vec<String>, considered: Vec<String>) -> Decision {
        let request = self.request;
        let fallback = self
            .escalation_target()
            .filter(|senior| senior.id != expert.id)
            .map(|senior| (senior, format!("{}, senior to escalate to", role_label(senior))));
        let reasoning = format!(
            "Every matching colleague is at capacity; {} is the primary expert, at capacity ({}/{} tasks), and takes this {} task in one slot over capacity: only an urgent task goes to an agent at capacity, and only one at a time.",
            expert.name,
            expert.current_workload,
            expert.workload_capacity,
            request.urgency.as_str()
        );
        notes.push(over_capacity_note(expert, request.urgency));
        let mut decision = finish(
            DecisionKind::Delegate,
            Tier::QueueForExpert,
            expert,
            self.describe(expert, "primary expert, at capacity"),
            fallback,
            reasoning,
            0,
            notes,
            considered,
        );
        decision.over_capacity = true;
        decision
    }

    /// Why no expert can take the task, when none is merely at capacity:
    /// offline, all in the delegation chain, or none with the expertise.
    fn why_no_expert(&self, looped: bool) -> String {
        let request = self.request;
        let agents = &self.snapshot.agents;
        if !agents.iter().any(|agent| {
            agent.id != request.requester_id
                && expertise_match(request, agent) != Match::None
                && role_matches(request, agent)
        }) {
            return "no colleague has the required expertise; escalating to the manager for guidance".to_owned();
        }
        if looped
            && !agents.iter().any(|agent| {
                agent.id != request.requester_id
                    && !self.chain.contains(agent.id.as_str())
                    && expertise_match(request, agent) != Match::None
                    && role_matches(request, agent)
                    && agent.status() != Status::Offline
            })
        {
            "every colleague with the expertise is already in the delegation chain or offline; delegating back would loop".to_owned()
        } else {
            "every colleague with the required expertise is offline".to_owned()
        }
    }

    /// A task a process assigned to one agent: that agent, its queue, or escalation.
    fn assigned(&self, now: i64, settings: Settings) -> Decision {
        let request = self.request;
        let assigned = request.assigned_agent_id.as_str();
        let Some(agent) = self.by_id.get(assigned).copied() else {
            let reason = format!("{assigned:?}, assigned the task, is not in the roster; escalating to the manager");
            return self.escalate(reason, Vec::new(), Vec::new());
        };
        if agent.status() == Status::Offline {
            let reason = format!("{}, assigned the task, is offline; escalating to the manager", agent.name);
            return self.escalate(reason, vec![agent.id.clone()], Vec::new());
        }
        if agent.has_free_slot() {
            let reasoning = format!(
                "{} is assigned the task and has a free slot ({}/{} tasks).",
                agent.name, agent.current_workload, agent.workload_capacity
            );
            return finish(
                DecisionKind::Delegate,
                Tier::Named,
                agent,
                self.describe(agent, "assigned the task"),
                None,
                reasoning,
                0,
                Vec::new(),
                vec![agent.id.clone()],
            );
        }
        if request.urgency.is_urgent() && !request.only_if_free && has_slot_over_capacity(agent) {
            let reasoning = format!(
                "{} is assigned the task and at capacity ({}/{} tasks); the task is {}, so it takes the agent's one slot over capacity rather than wait.",
                agent.name,
                agent.current_workload,
                agent.workload_capacity,
                request.urgency.as_str()
            );
            let mut decision = finish(
                DecisionKind::Delegate,
                Tier::Named,
                agent,
                self.describe(agent, "assigned the task, at capacity"),
                None,
                reasoning,
                0,
                vec![over_capacity_note(agent, request.urgency)],
                vec![agent.id.clone()],
            );
            decision.over_capacity = true;
            return decision;
        }
        let wait = estimated_wait(agent, self.snapshot, now, settings);
        let fallback = self
            .escalation_target()
            .map(|senior| (senior, format!("{}, senior to escalate to if the wait runs over", role_label(senior))));
        let reasoning = format!(
            "{} is assigned the task and has no free slot ({}/{} tasks, {}); the task waits for its next free slot, in about {}.",
            agent.name,
            agent.current_workload,
            agent.workload_capacity,
            agent.status().as_str(),
            format_wait(wait)
        );
        finish(
            DecisionKind::Queue,
            Tier::Named,
            agent,
            self.describe(agent, "assigned the task, at capacity"),
            fallback,
            reasoning,
            wait,
            Vec::new(),
            vec![agent.id.clone()],
        )
    }

    /// Tier 5: escalate to the senior, saying why.
    fn escalate(&self, reason: String, mut candidates: Vec<String>, notes: Vec<String>) -> Decision {
        let reasoning = format!("{}.", capitalize(&reason));
        candidates.truncate(MAX_CANDIDATES);
        escalation(self.escalation_target(), reasoning, notes, candidates)
    }

    /// The senior to escalate to: the requester's senior, or further up when that
    /// one is offline or in the chain; without a requester, the team's lead.
    fn escalation_target(&self) -> Option<&'a Agent> {
        let request = self.request;
        let usable = |agent: &&Agent| {
            agent.id != request.requester_id
                && !self.chain.contains(agent.id.as_str())
                && agent.status() != Status::Offline
        };
        let mut seen = HashSet::new();
        let mut current = self.by_id.get(request.requester_id.as_str()).copied();
        while let Some(agent) = current {
            if !seen.insert(agent.id.as_str()) {
                break;
            }
            let senior = self.by_id.get(agent.senior_id.as_str()).copied();
            if let Some(senior) = senior.filter(usable) {
                return Some(senior);
            }
            current = senior;
        }
        self.snapshot
            .teams
            .iter()
            .find(|team| team.name == self.home_team)
            .and_then(|team| self.by_id.get(team.lead_agent_id.as_str()).copied())
            .filter(usable)
    }
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

/// Whether an agent has its one slot over capacity to give to an urgent
/// task: exactly at capacity, neither offline nor set busy by hand.
pub fn has_slot_over_capacity(agent: &Agent) -> bool {
    !matches!(agent.manual_status, Some(Status::Offline | Status::Busy))
        && agent.current_workload == agent.workload_capacity
}

/// The note of the audit trail on a task placed over capacity.
fn over_capacity_note(agent: &Agent, urgency: Urgency) -> String {
    format!(
        "placed over capacity because the task is urgent ({}): {} goes from {}/{} to {}/{} tasks",
        urgency.as_str(),
        agent.name,
        agent.current_workload,
        agent.workload_capacity,
        agent.current_workload.saturating_add(1),
        agent.workload_capacity
    )
}

/// Whether an agent can never take this task (apart from capacity); the
/// allocation-free twin of [`exclusion`].
fn is_excluded(request: &DelegationRequest, agent: &Agent, chain: &HashSet<&str>) -> bool {
    agent.id == request.requester_id
        || chain.contains(agent.id.as_str())
        || agent.status() == Status::Offline
        || !role_matches(request, agent)
}

pub(crate) fn matched_count(request: &DelegationRequest, agent: &Agent) -> usize {
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
    let by_id: HashMap<&str, &Agent> = snapshot.agents.iter().map(|agent| (agent.id.as_str(), &**agent)).collect();
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

pub(crate) fn role_matches(request: &DelegationRequest, agent: &Agent) -> bool {
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
/// when that lies ahead, else one of its tasks, plus one of its tasks per
/// task already queued for it. A task lasts what the agent's tasks took so
/// far (`average_task_millis`, observed), or the configured average until
/// one of them ended.
pub fn estimated_wait(agent: &Agent, snapshot: &Snapshot, now: i64, settings: Settings) -> i64 {
    let task = if agent.average_task_millis > 0 { agent.average_task_millis } else { settings.average_task_millis };
    let base = match agent.availability_until {
        Some(until) if until > now => until - now,
        _ => task,
    };
    let ahead = i64::from(snapshot.queued.get(&agent.id).copied().unwrap_or(0));
    base.saturating_add(ahead.saturating_mul(task))
}
