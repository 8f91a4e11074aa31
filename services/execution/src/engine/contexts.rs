//! What the roster says of each agent for its assignments (role definition,
//! rendered system prompt, limits, LLM settings) and what each role
//! remembers, kept for every execution, so that a run whose steps go to one
//! agent after another does not ask the roster three times per step; and
//! the roster's answer about each agent that a run, a session or a budget
//! names, so that starting a run does not ask once per agent it names.
//!
//! Agents' contexts are kept only while the engine follows the roster's
//! changes ([`Engine::follow_roles`]): any change of an agent or a role
//! forgets them all (a rendered prompt names the role and colleagues), as
//! does losing the change stream, and a context read across a change is not
//! kept. Changes made through another roster replica arrive with that
//! replica's next refresh (a second by default). Memories are kept with
//! their version, which is read again for every assignment.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

use super::Engine;
use crate::{
    clients::roster::{AgentInfo, RETRY_PAUSE, RosterFailure, patiently},
    domain::{memory::MemoryEntry, model::AgentContext},
};

/// Most agents' contexts, and roles' memories, kept: past it, all are forgotten.
const KEPT: usize = 10_000;

/// A role's memory as kept, with its version.
type KeptMemory = (i64, Arc<Vec<MemoryEntry>>);

/// The agents' contexts and roles' memories kept.
#[derive(Debug, Default)]
pub(crate) struct Contexts {
    /// Whether the roster's changes are being followed: nothing is kept otherwise.
    following: AtomicBool,
    /// Moved by every change: a context read across one is not kept.
    generation: AtomicU64,
    agents: Mutex<HashMap<String, Arc<AgentContext>>>,
    /// The roster's answer about each agent asked about.
    known: Mutex<HashMap<String, AgentInfo>>,
    /// Each role's memory (`""`: agents without a role) and its version.
    memories: Mutex<HashMap<String, KeptMemory>>,
}

impl Contexts {
    /// The roster's changes are followed (`true`), or no longer (`false`);
    /// either way what was kept is forgotten.
    pub(crate) fn following(&self, following: bool) {
        self.following.store(following, Ordering::Release);
        self.forget();
    }

    /// An agent or a role changed: every context is forgotten.
    pub(crate) fn forget(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.agents.lock().unwrap_or_else(PoisonError::into_inner).clear();
        self.known.lock().unwrap_or_else(PoisonError::into_inner).clear();
    }

    /// What `kept` holds for `agent_id`, while the changes are followed.
    fn get<T: Clone>(&self, kept: &Mutex<HashMap<String, T>>, agent_id: &str) -> Option<T> {
        if !self.following.load(Ordering::Acquire) {
            return None;
        }
        kept.lock().unwrap_or_else(PoisonError::into_inner).get(agent_id).cloned()
    }

    /// Keeps `value` for `agent_id` in `kept`, unless it was read across a
    /// change (`generation` moved) or the changes are no longer followed.
    fn keep<T>(&self, kept: &Mutex<HashMap<String, T>>, agent_id: &str, value: T, generation: u64) {
        let mut kept = kept.lock().unwrap_or_else(PoisonError::into_inner);
        // Checked under the lock `forget` clears: a change after this keeps nothing stale.
        if !self.following.load(Ordering::Acquire) || self.generation.load(Ordering::Acquire) != generation {
            return;
        }
        if kept.len() >= KEPT {
            kept.clear();
        }
        kept.insert(agent_id.to_owned(), value);
    }
}

impl Engine {
    /// An agent of the roster (its role, whether it may delegate), as kept
    /// or from the roster. Its `offline` is as it was when read: status
    /// changes are not followed, so whoever acts on it asks the roster.
    pub(crate) async fn roster_agent(&self, agent_id: &str) -> Result<AgentInfo, RosterFailure> {
        let contexts = &self.contexts;
        if let Some(known) = contexts.get(&contexts.known, agent_id) {
            return Ok(known);
        }
        let generation = contexts.generation.load(Ordering::Acquire);
        let agent = self.roster.agent(agent_id.to_owned()).await?;
        contexts.keep(&contexts.known, agent_id, agent.clone(), generation);
        Ok(agent)
    }

    /// What an assignment tells `agent_id` about itself (without its
    /// memory), as kept or from the roster.
    pub(crate) async fn agent_context(&self, agent_id: &str) -> Result<Arc<AgentContext>, RosterFailure> {
        let contexts = &self.contexts;
        if let Some(known) = contexts.get(&contexts.agents, agent_id) {
            return Ok(known);
        }
        let generation = contexts.generation.load(Ordering::Acquire);
        let context = patiently(RETRY_PAUSE, "an assignment", || self.roster.agent_context(agent_id.to_owned()))
            .await
            .map(Arc::new)?;
        contexts.keep(&contexts.agents, agent_id, context.clone(), generation);
        Ok(context)
    }

    /// What an agent of `role` remembers and its version: as kept when its
    /// version has not moved, else read again.
    pub(crate) async fn recall_kept(&self, role: &str) -> (i64, Vec<MemoryEntry>) {
        let kept = self.contexts.memories.lock().unwrap_or_else(PoisonError::into_inner).get(role).cloned();
        let (version, memory) = match kept {
            Some((version, memory)) => match self.recall_if_changed(role, version).await {
                None => return (version, memory.to_vec()),
                Some(fresh) => fresh,
            },
            None => self.recall(role).await,
        };
        let mut memories = self.contexts.memories.lock().unwrap_or_else(PoisonError::into_inner);
        if memories.len() >= KEPT {
            memories.clear();
        }
        if memories.get(role).is_none_or(|(kept, _)| *kept < version) {
            memories.insert(role.to_owned(), (version, Arc::new(memory.clone())));
        }
        (version, memory)
    }
}
