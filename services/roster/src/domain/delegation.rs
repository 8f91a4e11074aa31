//! The delegation decision framework as a pure function over a snapshot of the
//! roster: no I/O, no clock of its own, deterministic.
//!
//! Priority order: a colleague the requester named (when eligible); best
//! same-team match; partial-expertise same team; best cross-team match; queue
//! for the primary expert when the wait fits; escalate to the senior. Never an
//! offline agent, never the requester, never an agent already in the task's
//! delegation chain, and never one without a free slot, with one exception:
//! at capacity (5/5) an agent takes only urgent tasks. An urgent task (HIGH
//! or CRITICAL) that no colleague with a free slot can take goes to the
//! primary expert at capacity, in one slot over capacity (6/5, never 7/5),
//! rather than wait; the decision says so ([`Decision::over_capacity`]).
//!
//! This file holds the framework's types; [`decide`] and its tiers are in
//! `framework.rs`, the text of decisions in `text.rs`.

use std::{collections::HashMap, sync::Arc};

mod framework;
mod text;

pub use framework::{decide, estimated_wait, has_slot_over_capacity};
pub(crate) use framework::{matched_count, role_matches};
pub use text::{format_wait, queue_escalation_decision, queue_offer_decision, render_text};

use super::model::{Agent, Team};

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

    /// Whether the task is urgent (HIGH or CRITICAL): only an urgent task
    /// may take an agent's one slot over capacity.
    pub fn is_urgent(self) -> bool {
        matches!(self, Self::High | Self::Critical)
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
    /// The agent the task is for (a process names it): only its capacity
    /// and status decide, see [`decide`]. Empty to choose by the criteria.
    #[serde(default)]
    pub assigned_agent_id: String,
    /// With `assigned_agent_id`: placed only on a free slot of that agent
    /// (never over capacity); otherwise answered QUEUE with nothing written.
    #[serde(default)]
    pub only_if_free: bool,
}

impl DelegationRequest {
    /// Whether a decision of `kind` is written (slot, queue, audit trail):
    /// not for a dry run, nor for a task asked for only if free that found
    /// no free slot.
    pub fn writes(&self, kind: DecisionKind) -> bool {
        !self.dry_run && (!self.only_if_free || kind == DecisionKind::Delegate)
    }
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
    /// The spelling in the decision text (`Decision: DELEGATE ...`), also stored.
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

/// A delegation decision: who takes a task, who is the fallback, and why.
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
    /// The decision as DELEGATION DECISION text.
    pub text: String,
    /// Agents considered, in ranked order (at most [`MAX_CANDIDATES`]).
    pub candidates: Vec<String>,
    /// For DELEGATE: the task takes the primary agent's one slot over
    /// capacity (an urgent task, the agent exactly at capacity). Its
    /// reservation then succeeds only while the agent is still exactly at
    /// capacity, so at most one task is ever over.
    #[serde(default)]
    pub over_capacity: bool,
}

/// What the framework reads: the agents that may matter for one request.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Agents, including the requester, the named colleague and the senior
    /// chain (shared with the roster's index, which they are read from).
    pub agents: Vec<Arc<Agent>>,
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

#[cfg(test)]
pub(crate) mod tests;
