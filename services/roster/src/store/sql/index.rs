//! The organisation in memory: every agent and team, indexed by team and by
//! expertise tag, from which delegation decisions and roster views are read
//! without a query. The database stays the truth: a slot is taken there, in
//! one conditional update, so a stale entry here can cost a decision a retry
//! but can never give a slot twice.
//!
//! Every agent row carries a version that each change of the row raises by
//! one. The index keeps the version it holds and takes a newer one only:
//!
//! - this store's own writes are applied once committed, from the rows they
//!   returned (a workload change that skips a version, because another
//!   transaction changed the row in between, reads the row again instead);
//! - other replicas' writes on a shared database are found by
//!   [`SqlStore::refresh_index`], run in the background every second: the
//!   rows changed lately (by `updated_at`, over a window wider than the
//!   interval) whose version is newer, read again in full, and every
//!   [`refresh::FULL_CHECK_EVERY`] refreshes a pass over every id and version, which
//!   also finds the agents and teams removed elsewhere.

pub(in crate::store) mod refresh;

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    sync::{Arc, RwLock},
};

use sqlx::Row;

use crate::domain::{
    delegation::{DelegationRequest, MAX_CANDIDATES, Snapshot, matched_count, role_matches},
    model::{Agent, Status, Team},
};
use crate::error::Result;
use crate::store::AgentQuery;

/// Most cross-team matches taken beyond the delegation chain's length: the
/// framework needs the best two (primary and fallback).
const CROSS_TEAM_MARGIN: usize = 8;
/// Idle colleagues that, found in id order, are the best ranked candidates
/// of a decision: every candidate it lists, and one more besides a named
/// colleague listed first.
const BEST_COLLEAGUES: usize = MAX_CANDIDATES + 1;
/// Most busy experts taken for the queue tier.
const MAX_BUSY_EXPERTS: usize = 500;
/// Most offline experts taken (only to explain an escalation).
const MAX_OFFLINE_EXPERTS: usize = 20;
/// How far up the hierarchy a snapshot follows seniors.
const MAX_HIERARCHY_DEPTH: usize = 32;
/// One agent as the index holds it.
#[derive(Debug, Clone)]
struct Entry {
    version: i64,
    agent: Arc<Agent>,
}

/// Maps of the index: keyed by ids, team names and tags, hashed fast (with
/// a seed of the process's own).
type Map<K, V> = HashMap<K, V, foldhash::quality::RandomState>;

#[derive(Debug, Default)]
struct State {
    agents: Map<Arc<str>, Entry>,
    /// Every id, in order.
    ids: BTreeSet<Arc<str>>,
    by_team: Map<String, BTreeSet<Arc<str>>>,
    by_tag: Map<String, BTreeSet<Arc<str>>>,
    /// Each team's members by tag: a Delegate looks at the colleagues with
    /// a required tag, not at the whole team.
    by_team_tag: Map<String, Map<String, BTreeSet<Arc<str>>>>,
    teams: Map<String, Team>,
}

/// An agent's workload as a caller of [`Index::snapshot`] knows it.
pub(super) type Load<'a> = dyn Fn(&Agent) -> u32 + 'a;

/// A workload a write left on an agent: (id, version, workload).
pub(super) type WorkloadChange = (String, i64, u32);

/// The index. Cheap to share: the store holds it in an `Arc`.
#[derive(Debug, Default)]
pub(super) struct Index {
    state: RwLock<State>,
    loaded: tokio::sync::OnceCell<()>,
    refreshes: std::sync::atomic::AtomicU64,
    last_refresh: std::sync::atomic::AtomicI64,
}

impl State {
    fn unlink(&mut self, id: &Arc<str>, agent: &Agent) {
        if let Some(members) = self.by_team.get_mut(&agent.team) {
            members.remove(id);
            if members.is_empty() {
                self.by_team.remove(&agent.team);
            }
        }
        for tag in &agent.expertise {
            if let Some(holders) = self.by_tag.get_mut(tag) {
                holders.remove(id);
                if holders.is_empty() {
                    self.by_tag.remove(tag);
                }
            }
        }
        if let Some(tags) = self.by_team_tag.get_mut(&agent.team) {
            for tag in &agent.expertise {
                if let Some(holders) = tags.get_mut(tag) {
                    holders.remove(id);
                    if holders.is_empty() {
                        tags.remove(tag);
                    }
                }
            }
            if tags.is_empty() {
                self.by_team_tag.remove(&agent.team);
            }
        }
    }

    fn link(&mut self, id: &Arc<str>, agent: &Agent) {
        self.by_team.entry(agent.team.clone()).or_default().insert(id.clone());
        for tag in &agent.expertise {
            self.by_tag.entry(tag.clone()).or_default().insert(id.clone());
        }
        if !agent.expertise.is_empty() {
            let tags = self.by_team_tag.entry(agent.team.clone()).or_default();
            for tag in &agent.expertise {
                tags.entry(tag.clone()).or_default().insert(id.clone());
            }
        }
    }

    /// Takes `agent` at `version` unless the index holds that version or a newer one.
    fn put(&mut self, agent: Agent, version: i64) {
        let existing = self.agents.get_key_value(agent.id.as_str()).map(|(id, entry)| (id.clone(), entry.clone()));
        let id = match existing {
            Some((_, entry)) if entry.version >= version => return,
            Some((id, entry)) => {
                if entry.agent.team != agent.team || entry.agent.expertise != agent.expertise {
                    self.unlink(&id, &entry.agent);
                    self.link(&id, &agent);
                }
                id
            }
            None => {
                let id: Arc<str> = Arc::from(agent.id.as_str());
                self.link(&id, &agent);
                self.ids.insert(id.clone());
                id
            }
        };
        self.agents.insert(id, Entry { version, agent: Arc::new(agent) });
    }

    fn remove(&mut self, id: &str) {
        if let Some((id, entry)) = self.agents.remove_entry(id) {
            self.unlink(&id, &entry.agent);
            self.ids.remove(&id);
        }
    }

    fn agent(&self, id: &str) -> Option<&Arc<Agent>> {
        self.agents.get(id).map(|entry| &entry.agent)
    }

    /// Ids in order: those with `tag`, or every agent's.
    fn ids_with<'a>(&'a self, tag: Option<&String>) -> Box<dyn Iterator<Item = &'a Arc<str>> + 'a> {
        match tag {
            Some(tag) => Box::new(self.by_tag.get(tag).into_iter().flatten()),
            None => Box::new(self.ids.iter()),
        }
    }
}

fn has_every_tag(request: &DelegationRequest, agent: &Agent) -> bool {
    matched_count(request, agent) == request.required_expertise.len()
}

impl Index {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes a committed row.
    pub(super) fn put(&self, agent: Agent, version: i64) {
        self.write().put(agent, version);
    }

    /// Forgets a removed agent, and the teams it led lose their lead.
    pub(super) fn remove(&self, id: &str) {
        let mut state = self.write();
        state.remove(id);
        for team in state.teams.values_mut() {
            if team.lead_agent_id == id {
                team.lead_agent_id.clear();
            }
        }
    }

    pub(super) fn put_team(&self, team: Team) {
        self.write().teams.insert(team.name.clone(), team);
    }

    pub(super) fn remove_team(&self, name: &str) {
        self.write().teams.remove(name);
    }

    /// Takes committed workload changes; returns the ids whose change skips a
    /// version (another transaction changed the row meanwhile): they are to
    /// be read again.
    pub(super) fn apply_workloads(&self, changes: &[WorkloadChange]) -> Vec<String> {
        let mut state = self.write();
        let mut stale = Vec::new();
        for (id, version, workload) in changes {
            let Some(entry) = state.agents.get_mut(id.as_str()) else {
                stale.push(id.clone());
                continue;
            };
            if *version <= entry.version {
                continue;
            }
            if *version == entry.version + 1 {
                Arc::make_mut(&mut entry.agent).current_workload = *workload;
                entry.version = *version;
            } else {
                stale.push(id.clone());
            }
        }
        stale
    }

    /// Sets the observed task durations a release computed (the row's
    /// version moved with its workload, which `apply_workloads` took).
    pub(super) fn apply_averages(&self, averages: &[(String, i64)]) {
        if averages.is_empty() {
            return;
        }
        let mut state = self.write();
        for (id, average) in averages {
            if let Some(entry) = state.agents.get_mut(id.as_str()) {
                Arc::make_mut(&mut entry.agent).average_task_millis = *average;
            }
        }
    }

    /// The ids of rows (`id`, `version`) whose version the index does not
    /// hold. One it holds a higher version of is forgotten first, so that
    /// reading it again takes the row whatever its version: an agent removed
    /// and created again elsewhere starts again from version 0.
    ///
    /// The comparison takes the read lock only (decisions go on meanwhile);
    /// the write lock only when a higher version is to be forgotten.
    fn differing(&self, rows: Vec<(String, i64)>) -> Vec<String> {
        let mut higher = false;
        let differing: Vec<(String, bool)> = {
            let state = self.read();
            rows.into_iter()
                .filter_map(|(id, version)| match state.agents.get(id.as_str()).map(|entry| entry.version) {
                    Some(held) if held == version => None,
                    held => {
                        let forget = held.is_some_and(|held| held > version);
                        higher |= forget;
                        Some((id, forget))
                    }
                })
                .collect()
        };
        if higher {
            let mut state = self.write();
            for (id, _) in differing.iter().filter(|(_, forget)| *forget) {
                state.remove(id);
            }
        }
        differing.into_iter().map(|(id, _)| id).collect()
    }

    /// One agent, as last seen.
    pub(super) fn agent(&self, id: &str) -> Option<Arc<Agent>> {
        self.read().agent(id).cloned()
    }

    /// What [`crate::store::Store::list_agents`] answers, from memory.
    pub(super) fn list(&self, query: &AgentQuery) -> Vec<Arc<Agent>> {
        let state = self.read();
        let base: Box<dyn Iterator<Item = &Arc<str>>> = if !query.expertise.is_empty() {
            state.ids_with(Some(&query.expertise))
        } else if !query.team.is_empty() {
            Box::new(state.by_team.get(&query.team).into_iter().flatten())
        } else {
            state.ids_with(None)
        };
        let limit = if query.limit == 0 { usize::MAX } else { query.limit as usize };
        base.filter(|id| &***id > query.after_id.as_str())
            .filter_map(|id| state.agent(id))
            .filter(|agent| {
                (query.team.is_empty() || agent.team == query.team)
                    && (query.role.is_empty() || agent.role == query.role)
                    && query.status.is_none_or(|status| agent.status() == status)
                    && (query.expertise.is_empty() || agent.expertise.binary_search(&query.expertise).is_ok())
                    && (!query.available_only || agent.has_free_slot())
            })
            .take(limit)
            .cloned()
            .collect()
    }

    /// The agents and teams that may matter to one request, and no more
    /// (the queue lengths are the caller's to add): the requester's team
    /// members of the required role with at least one required tag and
    /// the best cross-team full matches with a free slot (in the framework's
    /// order: workload, then id), or only the first idle colleagues who can
    /// take the task when they are enough to fill the candidates; with
    /// `with_unavailable`, busy full-match experts (for the queue) and a few
    /// offline experts (to explain an escalation); the requester, the named
    /// colleague, the delegation chain, the seniors above the requester and
    /// the team's lead.
    /// A task assigned to one agent needs only that agent and whom it escalates to.
    ///
    /// `load` gives each agent's workload where the caller knows better than
    /// the index (slots its own transaction took or gave back); the snapshot
    /// chooses by it and carries it.
    pub(super) fn snapshot(&self, request: &DelegationRequest, with_unavailable: bool, load: &Load) -> Snapshot {
        let state = self.read();
        let free = |agent: &Agent| {
            !matches!(agent.manual_status, Some(Status::Offline | Status::Busy))
                && load(agent) < agent.workload_capacity
        };
        let mut agents: Vec<Arc<Agent>> = Vec::new();
        let mut seen: HashSet<*const Agent, foldhash::quality::RandomState> = HashSet::default();
        let mut keep = |agent: &Arc<Agent>, agents: &mut Vec<Arc<Agent>>| {
            if seen.insert(Arc::as_ptr(agent)) {
                agents.push(agent.clone());
            }
        };
        let requester = state.agent(&request.requester_id);
        let home_team = if request.team.is_empty() {
            requester.map(|agent| agent.team.as_str()).unwrap_or_default()
        } else {
            request.team.as_str()
        };
        if let Some(requester) = requester {
            keep(requester, &mut agents);
        }
        if !request.assigned_agent_id.is_empty() {
            if let Some(assigned) = state.agent(&request.assigned_agent_id) {
                keep(assigned, &mut agents);
            }
        } else {
            // Idle colleagues who can take the task with every required tag
            // come first in the framework's order, in id order among them:
            // when there are enough of them to fill the candidates, they are
            // the best ranked and nobody else, colleague or not, is listed.
            let best: Vec<&Arc<Agent>> = if home_team.is_empty() || with_unavailable {
                Vec::new()
            } else {
                let ids: Box<dyn Iterator<Item = &Arc<str>>> = match request.required_expertise.first() {
                    None => Box::new(state.by_team.get(home_team).into_iter().flatten()),
                    Some(tag) => {
                        Box::new(state.by_team_tag.get(home_team).and_then(|tags| tags.get(tag)).into_iter().flatten())
                    }
                };
                ids.filter_map(|id| state.agent(id))
                    .filter(|agent| {
                        load(agent) == 0
                            && free(agent)
                            && agent.id != request.requester_id
                            && !request.delegation_chain.contains(&agent.id)
                            && role_matches(request, agent)
                            && has_every_tag(request, agent)
                    })
                    .take(BEST_COLLEAGUES)
                    .collect()
            };
            let enough_colleagues = best.len() == BEST_COLLEAGUES;
            if enough_colleagues {
                best.into_iter().for_each(|agent| keep(agent, &mut agents));
            } else if home_team.is_empty() {
                // No team: no colleagues.
            } else if request.required_expertise.is_empty() {
                // Colleagues with none of the required tags, or another role,
                // can neither take the task nor explain an escalation: the
                // framework passes over them, so they are left out.
                for id in state.by_team.get(home_team).into_iter().flatten() {
                    if let Some(agent) = state.agent(id).filter(|agent| role_matches(request, agent)) {
                        keep(agent, &mut agents);
                    }
                }
            } else if let Some(tags) = state.by_team_tag.get(home_team) {
                for tag in &request.required_expertise {
                    for id in tags.get(tag).into_iter().flatten() {
                        if let Some(agent) = state.agent(id).filter(|agent| role_matches(request, agent)) {
                            keep(agent, &mut agents);
                        }
                    }
                }
            }
            let first_tag = request.required_expertise.first();
            let cross_team = |agent: &&Arc<Agent>| {
                (home_team.is_empty() || agent.team != home_team)
                    && free(agent)
                    && role_matches(request, agent)
                    && has_every_tag(request, agent)
            };
            // Idle agents come first in the framework's order; in id order
            // they are found without looking at every match.
            let limit = request.delegation_chain.len() + CROSS_TEAM_MARGIN;
            if enough_colleagues {
                // Another team's agents rank after every one of them.
            } else {
                let idle: Vec<&Arc<Agent>> = state
                    .ids_with(first_tag)
                    .filter_map(|id| state.agent(id))
                    .filter(|agent| load(agent) == 0)
                    .filter(cross_team)
                    .take(limit)
                    .collect();
                if idle.len() == limit {
                    idle.into_iter().for_each(|agent| keep(agent, &mut agents));
                } else {
                    let mut free: Vec<(u32, &Arc<Agent>)> = state
                        .ids_with(first_tag)
                        .filter_map(|id| state.agent(id))
                        .filter(cross_team)
                        .map(|agent| (load(agent), agent))
                        .collect();
                    free.sort_by(|(a_load, a), (b_load, b)| (a_load, &a.id).cmp(&(b_load, &b.id)));
                    free.into_iter().take(limit).for_each(|(_, agent)| keep(agent, &mut agents));
                }
            }
            if with_unavailable {
                state
                    .ids_with(first_tag)
                    .filter_map(|id| state.agent(id))
                    .filter(|agent| {
                        agent.manual_status != Some(Status::Offline)
                            && (load(agent) >= agent.workload_capacity || agent.manual_status == Some(Status::Busy))
                            && role_matches(request, agent)
                            && has_every_tag(request, agent)
                    })
                    .take(MAX_BUSY_EXPERTS)
                    .for_each(|agent| keep(agent, &mut agents));
                let mut offline: BTreeSet<&Arc<str>> = BTreeSet::new();
                for tag in &request.required_expertise {
                    offline.extend(
                        state
                            .ids_with(Some(tag))
                            .filter(|id| {
                                state.agent(id).is_some_and(|agent| agent.manual_status == Some(Status::Offline))
                            })
                            .take(MAX_OFFLINE_EXPERTS),
                    );
                }
                for id in offline.into_iter().take(MAX_OFFLINE_EXPERTS) {
                    if let Some(agent) = state.agent(id) {
                        keep(agent, &mut agents);
                    }
                }
            }
            for id in request.delegation_chain.iter().chain([&request.preferred_agent_id]) {
                if let Some(agent) = state.agent(id) {
                    keep(agent, &mut agents);
                }
            }
        }

        // The seniors above the requester, for escalation.
        let mut senior_id = requester.map(|agent| agent.senior_id.as_str()).unwrap_or_default();
        for _ in 0..MAX_HIERARCHY_DEPTH {
            let Some(senior) = state.agent(senior_id) else { break };
            keep(senior, &mut agents);
            senior_id = &senior.senior_id;
        }

        let mut teams = Vec::new();
        if let Some(team) = state.teams.get(home_team) {
            if let Some(lead) = state.agent(&team.lead_agent_id) {
                keep(lead, &mut agents);
            }
            teams.push(team.clone());
        }
        for agent in &mut agents {
            let workload = load(agent);
            if workload != agent.current_workload {
                Arc::make_mut(agent).current_workload = workload;
            }
        }
        Snapshot { agents, queued: HashMap::new(), teams }
    }
}

pub(super) fn team_from_row(row: &sqlx::any::AnyRow) -> Result<Team> {
    Ok(Team {
        name: row.try_get("name")?,
        description: row.try_get("description")?,
        lead_agent_id: row.try_get("lead_agent_id")?,
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::domain::delegation::{Decision, DecisionKind, Settings, decide, tests::case_strategy};

    fn member(id: &str, team: &str, tags: &[&str]) -> Agent {
        Agent {
            id: id.into(),
            team: team.into(),
            expertise: tags.iter().map(|tag| (*tag).to_owned()).collect(),
            workload_capacity: 1,
            ..Agent::default()
        }
    }

    /// The members of `team` with `tag` as the index holds them.
    fn colleagues(index: &Index, team: &str, tag: &str) -> Vec<String> {
        let state = index.read();
        let members = state.by_team_tag.get(team).and_then(|tags| tags.get(tag));
        members.into_iter().flatten().map(|id| id.to_string()).collect()
    }

    /// Colleagues are found by team and tag; a move to another team, a change
    /// of expertise and a removal each leave that index as they should.
    #[test]
    fn colleagues_by_team_and_tag_follow_every_change() {
        let index = Index::default();
        index.put(member("a", "red", &["rust", "sql"]), 1);
        index.put(member("b", "red", &["sql"]), 1);
        index.put(member("c", "blue", &["rust"]), 1);
        assert_eq!(colleagues(&index, "red", "rust"), ["a"]);
        assert_eq!(colleagues(&index, "red", "sql"), ["a", "b"]);

        index.put(member("a", "blue", &["rust", "sql"]), 2);
        assert_eq!(colleagues(&index, "red", "rust"), Vec::<String>::new());
        assert_eq!(colleagues(&index, "red", "sql"), ["b"]);
        assert_eq!(colleagues(&index, "blue", "rust"), ["a", "c"]);

        index.put(member("c", "blue", &["go"]), 2);
        assert_eq!(colleagues(&index, "blue", "rust"), ["a"]);
        assert_eq!(colleagues(&index, "blue", "go"), ["c"]);

        index.remove("a");
        assert_eq!(colleagues(&index, "blue", "rust"), Vec::<String>::new());
        assert_eq!(colleagues(&index, "blue", "sql"), Vec::<String>::new());
        // An older version changes nothing.
        index.put(member("b", "blue", &["sql"]), 1);
        assert_eq!(colleagues(&index, "red", "sql"), ["b"]);
    }

    /// The workload the index holds.
    fn as_indexed(agent: &Agent) -> u32 {
        agent.current_workload
    }

    /// `request` decided from the index of `agents` (as the store does: the
    /// unavailable too when the first look finds no delegate, or one over
    /// capacity), then from all of them.
    fn decided_from_index_and_whole(agents: &[Agent], request: &DelegationRequest) -> (Decision, Decision) {
        let index = Index::default();
        for agent in agents {
            index.put(agent.clone(), 0);
        }
        let mut decided = decide(request, &index.snapshot(request, false, &as_indexed), 1_000, Settings::default());
        if decided.kind != DecisionKind::Delegate || decided.over_capacity {
            decided = decide(request, &index.snapshot(request, true, &as_indexed), 1_000, Settings::default());
        }
        let whole = Snapshot { agents: agents.iter().cloned().map(Arc::new).collect(), ..Snapshot::default() };
        (decided, decide(request, &whole, 1_000, Settings::default()))
    }

    proptest! {
        /// The index hands the framework a part of the roster; the part must
        /// decide as the whole roster would.
        #[test]
        fn the_index_decides_as_the_whole_roster((agents, request) in case_strategy()) {
            let (decided, expected) = decided_from_index_and_whole(&agents, &request);
            prop_assert_eq!(
                (decided.kind, decided.tier, &decided.primary_agent_id, &decided.fallback_agent_id),
                (expected.kind, expected.tier, &expected.primary_agent_id, &expected.fallback_agent_id),
                "{:?}", request
            );
        }

        /// Teams large enough that idle colleagues alone fill the
        /// candidates: the index hands over only those, and the decision
        /// lists the same candidates as over the whole roster whenever the
        /// whole roster's are all colleagues.
        #[test]
        fn a_large_team_decides_from_its_best_colleagues((agents, request) in large_team_strategy()) {
            let (decided, expected) = decided_from_index_and_whole(&agents, &request);
            prop_assert_eq!(
                (decided.kind, decided.tier, &decided.primary_agent_id, &decided.fallback_agent_id),
                (expected.kind, expected.tier, &expected.primary_agent_id, &expected.fallback_agent_id),
                "{:?}", request
            );
            let home = &request.team;
            let all_colleagues = expected.candidates.len() == MAX_CANDIDATES
                && expected.candidates.iter().all(|id| agents.iter().any(|agent| agent.id == *id && agent.team == *home));
            if all_colleagues {
                prop_assert_eq!(&decided.candidates, &expected.candidates);
            }
        }
    }

    /// The tags "x" and "y" that `on` turns on, in order.
    fn tags_of(on: &[bool]) -> Vec<String> {
        ["x", "y"].iter().zip(on).filter(|(_, on)| **on).map(|(tag, _)| (*tag).to_owned()).collect()
    }

    /// 80 agents in two teams, most of them idle, and a request from one of the teams.
    fn large_team_strategy() -> impl Strategy<Value = (Vec<Agent>, DelegationRequest)> {
        let agent = |index: usize| {
            (proptest::collection::vec(any::<bool>(), 2), 0..8_u32, 0..10_u8, any::<bool>()).prop_map(
                move |(tags, workload, manual, even)| Agent {
                    id: format!("a{index:02}"),
                    name: format!("A{index}"),
                    role: if even { "even".into() } else { "odd".into() },
                    team: format!("t{}", index % 2),
                    expertise: tags_of(&tags),
                    manual_status: match manual {
                        0 => Some(Status::Offline),
                        1 => Some(Status::Busy),
                        _ => None,
                    },
                    // Mostly idle, some with tasks, some full.
                    current_workload: workload.saturating_sub(4),
                    workload_capacity: 3,
                    ..Agent::default()
                },
            )
        };
        (
            (0..80_usize).map(agent).collect::<Vec<_>>(),
            0..80_usize,
            proptest::collection::vec(any::<bool>(), 2),
            proptest::collection::vec(0..80_usize, 0..4),
            0..90_usize,
            any::<bool>(),
        )
            .prop_map(|(agents, requester, tags, chain, preferred, by_role)| {
                let request = DelegationRequest {
                    task_id: "task".into(),
                    requester_id: format!("a{requester:02}"),
                    team: format!("t{}", requester % 2),
                    required_expertise: tags_of(&tags),
                    required_role: if by_role { "even".into() } else { String::new() },
                    delegation_chain: chain.into_iter().map(|index| format!("a{index:02}")).collect(),
                    preferred_agent_id: if preferred < 80 { format!("a{preferred:02}") } else { String::new() },
                    ..DelegationRequest::default()
                };
                (agents, request)
            })
    }
}
