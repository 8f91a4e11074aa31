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
//!
//! An agent missing is asked about once however many runs want it at the
//! same moment: the others wait for that answer. Without it, a thousand
//! runs started together (or running when a change forgot everything)
//! asked the roster a thousand times for the same ten agents.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

use tracing::Instrument as _;

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
    agents: Kept<Arc<AgentContext>>,
    /// The roster's answer about each agent asked about.
    known: Kept<AgentInfo>,
    /// Each role's memory (`""`: agents without a role) and its version.
    memories: Mutex<HashMap<String, KeptMemory>>,
}

/// Answers kept by agent, and the agents being asked about: whoever wants
/// one of those waits for its turn and then finds it kept.
#[derive(Debug)]
struct Kept<T> {
    values: Mutex<HashMap<String, T>>,
    asking: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl<T> Default for Kept<T> {
    fn default() -> Self {
        Self { values: Mutex::default(), asking: Mutex::default() }
    }
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
        self.agents.values.lock().unwrap_or_else(PoisonError::into_inner).clear();
        self.known.values.lock().unwrap_or_else(PoisonError::into_inner).clear();
    }

    /// What `kept` holds for `agent_id`, while the changes are followed.
    fn get<T: Clone>(&self, kept: &Kept<T>, agent_id: &str) -> Option<T> {
        if !self.following.load(Ordering::Acquire) {
            return None;
        }
        kept.values.lock().unwrap_or_else(PoisonError::into_inner).get(agent_id).cloned()
    }

    /// Keeps `value` for `agent_id` in `kept`, unless it was read across a
    /// change (`generation` moved) or the changes are no longer followed.
    fn keep<T>(&self, kept: &Kept<T>, agent_id: &str, value: T, generation: u64) {
        let mut kept = kept.values.lock().unwrap_or_else(PoisonError::into_inner);
        // Checked under the lock `forget` clears: a change after this keeps nothing stale.
        if !self.following.load(Ordering::Acquire) || self.generation.load(Ordering::Acquire) != generation {
            return;
        }
        if kept.len() >= KEPT {
            kept.clear();
        }
        kept.insert(agent_id.to_owned(), value);
    }

    /// What `kept` holds for `agent_id`, else what `fetch` answers (kept for
    /// the next). While the changes are followed, one fetch per agent runs
    /// at a time and those who wait for it take what it kept.
    async fn kept_or_fetched<T, F>(
        &self,
        kept: &Kept<T>,
        agent_id: &str,
        fetch: impl FnOnce() -> F,
    ) -> Result<T, RosterFailure>
    where
        T: Clone,
        F: Future<Output = Result<T, RosterFailure>>,
    {
        if let Some(value) = self.get(kept, agent_id) {
            return Ok(value);
        }
        if !self.following.load(Ordering::Acquire) {
            return fetch().await;
        }
        let turn =
            kept.asking.lock().unwrap_or_else(PoisonError::into_inner).entry(agent_id.to_owned()).or_default().clone();
        let fetched = async {
            let _turn = turn.lock().await;
            if let Some(value) = self.get(kept, agent_id) {
                return Ok(value);
            }
            let generation = self.generation.load(Ordering::Acquire);
            let value = fetch().await?;
            self.keep(kept, agent_id, value.clone(), generation);
            Ok(value)
        }
        .await;
        let mut asking = kept.asking.lock().unwrap_or_else(PoisonError::into_inner);
        // Nobody else waits for this agent's turn: it goes.
        if Arc::strong_count(&turn) == 2 {
            asking.remove(agent_id);
        }
        fetched
    }

    /// Whether no agent is being asked about (for tests).
    #[cfg(test)]
    pub(crate) fn asking_nobody(&self) -> bool {
        [&self.agents.asking, &self.known.asking]
            .iter()
            .all(|asking| asking.lock().unwrap_or_else(PoisonError::into_inner).is_empty())
    }
}

impl Engine {
    /// An agent of the roster (its role, whether it may delegate), as kept
    /// or from the roster. Its `offline` is as it was when read: status
    /// changes are not followed, so whoever acts on it asks the roster.
    pub(crate) async fn roster_agent(&self, agent_id: &str) -> Result<AgentInfo, RosterFailure> {
        let contexts = &self.contexts;
        contexts.kept_or_fetched(&contexts.known, agent_id, || self.roster.agent(agent_id.to_owned())).await
    }

    /// What an assignment tells `agent_id` about itself (without its
    /// memory), as kept or from the roster.
    pub(crate) async fn agent_context(&self, agent_id: &str) -> Result<Arc<AgentContext>, RosterFailure> {
        let contexts = &self.contexts;
        let fetch = || async {
            patiently(RETRY_PAUSE, "an assignment", || self.roster.agent_context(agent_id.to_owned()))
                .await
                .map(Arc::new)
        };
        contexts.kept_or_fetched(&contexts.agents, agent_id, fetch).await
    }

    /// An agent's context with its role's memory, and that memory's
    /// version, when all of it is at hand: the context and the memory kept,
    /// and the memory's version, read on the calling thread, unmoved since.
    pub(crate) fn context_at_hand(&self, agent_id: &str) -> Option<(Arc<AgentContext>, i64)> {
        let contexts = &self.contexts;
        let context = contexts.get(&contexts.agents, agent_id)?;
        let role = context.roster_role.as_str();
        let (version, memory) = contexts.memories.lock().unwrap_or_else(PoisonError::into_inner).get(role).cloned()?;
        match self.store.memory_version_at_hand(role)? {
            Ok(now) if now == version => {
                Some((Arc::new(AgentContext { memory: memory.to_vec(), ..(*context).clone() }), version))
            }
            _ => None,
        }
    }

    /// Fetches in the background what is not kept of the contexts of
    /// `agents` and of their roles' memories, so that a run's later steps
    /// find them at hand: without it, a thousand runs started together
    /// each wait for the roster at the first step of each of their agents,
    /// and that step's start takes a commit of its own. The roster's calls
    /// are made in the caller's span (the execution's trace).
    pub(crate) fn prefetch_contexts(self: &Arc<Self>, agents: impl IntoIterator<Item = String>) {
        let contexts = &self.contexts;
        if !contexts.following.load(Ordering::Acquire) {
            return;
        }
        for agent_id in agents {
            if contexts.get(&contexts.agents, &agent_id).is_some() {
                continue;
            }
            let engine = self.clone();
            self.spawn(
                async move {
                    let Ok(context) = engine.agent_context(&agent_id).await else { return };
                    let role = &context.roster_role;
                    let kept =
                        engine.contexts.memories.lock().unwrap_or_else(PoisonError::into_inner).contains_key(role);
                    if !kept {
                        engine.recall_kept(role).await;
                    }
                }
                .instrument(tracing::Span::current()),
            );
        }
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
