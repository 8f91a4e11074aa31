//! Asking ahead: when a step goes to a worker, the roster is asked for the
//! slot of each dependant that the step's end will make ready and that
//! names its agent (another than the running step's: that one's slot
//! passes on by itself), and of each step that waits for such a dependant
//! alone and names an agent other than both (two steps ahead, so the answer
//! has a whole step's time to come). The ask takes a slot only if the agent
//! has one free now, and writes nothing otherwise (`only_if_free`). The
//! step finds its slot reserved when it becomes ready, so a chain whose
//! steps go from agent to agent does not wait for the roster between two
//! steps. A slot reserved for a step that does not run after all goes back.
//!
//! The asks wait for the turn's commit and go with the slots it gives back,
//! in one placement ([`place_ahead`]): a step of such a chain costs the
//! roster one exchange, not two.

use std::{sync::Arc, time::Duration};

use super::{Driver, RELEASE_PATIENCE};
use crate::engine::{Found, Input, Route};
use crate::{
    clients::roster::{DelegationAsk, RETRY_PAUSE, Roster, patiently},
    domain::{StepStatus, model::DecisionKind},
};

/// How long an ending execution waits for the answers to its asks ahead,
/// to give back the slots they reserved.
const ANSWERS_AT_THE_END: Duration = Duration::from_secs(2);

/// Where a step stands with an ask ahead.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) enum Ahead {
    #[default]
    None,
    /// The roster was asked for this agent's slot, for the attempt the step
    /// will start next; the answer is on its way.
    Asked { agent: String, attempt: u32 },
    /// This agent's slot is reserved for the step.
    Reserved(String),
}

impl Driver {
    /// The step at `position` went to a worker: the roster is asked ahead
    /// for the dependants it will make ready, and for theirs that wait for
    /// them alone (two steps ahead: the answer has a whole step's time to
    /// come, so a step of a chain does not wait for the roster even when
    /// the roster answers more slowly than a worker does a step).
    pub(super) fn ask_ahead(&mut self, position: usize) {
        let running = &self.steps[position].executor;
        let mut asks = Vec::new();
        for &next in self.dag.dependants(position) {
            if let Some(agent) = self.ahead_agent(position, next, [Some(running), None]) {
                asks.push((next, agent));
            }
            if self.steps[next].status != StepStatus::Pending || !self.waits_for_alone(next, position) {
                continue;
            }
            let next_agent = self.named_executor(next);
            for &after in self.dag.dependants(next) {
                if let Some(agent) = self.ahead_agent(next, after, [Some(running), next_agent.as_ref()]) {
                    asks.push((after, agent));
                }
            }
        }
        for (dependant, agent) in asks {
            if self.ahead[dependant] != Ahead::None {
                continue;
            }
            let Some(mut ask) = self.delegation_ask(dependant, Some(agent.clone())) else { continue };
            ask.only_if_free = true;
            let attempt = self.steps[dependant].attempt + 1;
            let route = Route { attempt, ..self.route(dependant) };
            self.ahead[dependant] = Ahead::Asked { agent, attempt };
            self.asked_ahead.push(dependant);
            self.asks_ahead.push((ask, route));
        }
    }

    /// Whether `dependant` waits for `step` alone (its other dependencies completed).
    fn waits_for_alone(&self, dependant: usize, step: usize) -> bool {
        self.dag
            .dependencies(dependant)
            .iter()
            .all(|&dependency| dependency == step || self.steps[dependency].status == StepStatus::Completed)
    }

    /// The agent to ask ahead for: the one `dependant` names, when it waits
    /// only for `before` to complete and will then ask the roster for that
    /// agent alone, and it is none of `busy` (agents whose slot passes on
    /// to it by itself, or is held until it is ready).
    fn ahead_agent(&self, before: usize, dependant: usize, busy: [Option<&String>; 2]) -> Option<String> {
        let (step, definition) = (&self.steps[dependant], self.definition(dependant));
        if step.status != StepStatus::Pending
            || self.is_active(dependant)
            || step.roster_reserved
            || !step.slot_task.is_empty()
            || step.retry_at.is_some()
            || self.ahead[dependant] != Ahead::None
            || definition.step_type == crate::engine::HUMAN_APPROVAL
            || definition.delegate.is_some()
            || !self.waits_for_alone(dependant, before)
        {
            return None;
        }
        self.named_executor(dependant).filter(|agent| !busy.contains(&Some(agent)))
    }

    /// The answer to an ask ahead for the step at `position`, asked for
    /// `agent` and attempt `attempt`. The step started meanwhile: the answer
    /// is that attempt's (a slot not free, or an agent no longer the step's,
    /// and it asks as any step does). It has not: a slot taken is kept for
    /// it while it waits to start, and given back otherwise.
    pub(super) fn ahead_answered(&mut self, position: usize, attempt: u32, agent: String, found: Found) {
        let chosen = matches!(&found, Found::Chosen { agent_id, .. } if *agent_id == agent);
        if self.is_current(position, attempt) {
            let named = self.named_executor(position);
            if chosen && named.as_ref() == Some(&agent) {
                return self.executor_found(position, attempt, found);
            }
            return self.ask_roster(position, named);
        }
        if !chosen {
            return;
        }
        let step = &self.steps[position];
        if matches!(step.status, StepStatus::Pending | StepStatus::Ready)
            && !self.is_active(position)
            && !step.roster_reserved
            && step.slot_task.is_empty()
        {
            self.steps[position].roster_reserved = true;
            self.ahead[position] = Ahead::Reserved(agent);
            self.stage_quietly(position);
        } else {
            self.release_later(self.task_id(position));
        }
    }

    /// A step starting with the slot reserved for it ahead goes on without
    /// asking the roster; one whose ask ahead is still on its way waits for
    /// that answer. `false`: the step asks as any step does.
    pub(super) fn start_ahead(&mut self, position: usize, attempt: u32) -> bool {
        let agent = match &self.ahead[position] {
            Ahead::None => return false,
            Ahead::Asked { attempt: asked, .. } => return *asked == attempt,
            Ahead::Reserved(agent) => agent.clone(),
        };
        self.ahead[position] = Ahead::None;
        if !self.steps[position].roster_reserved || self.named_executor(position).as_ref() != Some(&agent) {
            return false;
        }
        self.steps[position].wait_seconds = 0;
        self.executor_known(position, attempt, agent);
        true
    }

    /// Whether a started step waits for the answer to its ask ahead (the
    /// steps whose answer came are forgotten on the way).
    pub(super) fn awaits_ahead(&mut self) -> bool {
        let ahead = &self.ahead;
        self.asked_ahead.retain(|&position| matches!(ahead[position], Ahead::Asked { .. }));
        self.asked_ahead.iter().any(
            |&position| matches!(&self.ahead[position], Ahead::Asked { attempt, .. } if self.is_current(position, *attempt)),
        )
    }

    /// The ask ahead for the step at `position`, if one is on its way for `attempt`.
    pub(super) fn asked_ahead(&mut self, position: usize, attempt: u32) -> Option<String> {
        match &self.ahead[position] {
            Ahead::Asked { agent, attempt: asked } if *asked == attempt => {
                let agent = agent.clone();
                self.ahead[position] = Ahead::None;
                Some(agent)
            }
            _ => None,
        }
    }

    /// The step's slot was given back: what it reserved ahead is no more.
    pub(super) fn forget_reserved_ahead(&mut self, position: usize) {
        if matches!(self.ahead[position], Ahead::Reserved(_)) {
            self.ahead[position] = Ahead::None;
        }
    }

    /// The execution ends: answers still on their way for asks ahead are
    /// awaited (briefly), and the slots they took go back.
    pub(super) async fn give_back_ahead(&mut self) {
        // Those not yet asked took nothing.
        for (_, route) in std::mem::take(&mut self.asks_ahead) {
            self.ahead[route.position] = Ahead::None;
        }
        let deadline = tokio::time::Instant::now() + ANSWERS_AT_THE_END;
        while self.ahead.iter().any(|ahead| matches!(ahead, Ahead::Asked { .. })) {
            match tokio::time::timeout_at(deadline, self.next_input()).await {
                Ok(Some(Input::Executor { position, attempt, found })) => {
                    if self.asked_ahead(position, attempt).is_some() && matches!(found, Found::Chosen { .. }) {
                        self.release_later(self.task_id(position));
                    }
                }
                // Anything else finds the execution ended.
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => return,
            }
        }
    }
}

/// Gives back `releases` and asks `asks` ahead in one placement, telling
/// each ask's driver whether its slot is taken (an ask ahead that fails
/// costs nothing: the step asks again when it starts). Releases that fail
/// are asked again while the roster is unavailable, [`RELEASE_PATIENCE`] at
/// most (a roster restarting would otherwise keep the slots taken).
pub(super) async fn place_ahead(roster: Arc<dyn Roster>, releases: Vec<String>, asks: Vec<(DelegationAsk, Route)>) {
    let (questions, routes): (Vec<_>, Vec<_>) = asks.into_iter().unzip();
    let placed = roster.place(releases.clone(), questions).await;
    let failure = placed.as_ref().err().map(|failure| failure.message().to_owned());
    let mut decisions = placed.unwrap_or_default().into_iter();
    for route in routes {
        let found = match (decisions.next(), &failure) {
            (Some(decision), _) if decision.kind == DecisionKind::Delegate => {
                Found::Chosen { agent_id: decision.primary_agent_id, escalated: false, detail: String::new() }
            }
            (Some(decision), _) => Found::Failed { code: "NOT_FREE".to_owned(), message: decision.reasoning },
            (None, failure) => Found::Failed {
                code: "NOT_ASKED".to_owned(),
                message: failure.clone().unwrap_or_else(|| "the roster did not answer the ask".to_owned()),
            },
        };
        let _ = route.driver.send(Input::Executor { position: route.position, attempt: route.attempt, found });
    }
    if failure.is_none() || releases.is_empty() {
        return;
    }
    let release = || match releases.as_slice() {
        [task_id] => roster.release(task_id.clone()),
        _ => roster.release_batch(releases.clone()),
    };
    let released = tokio::time::timeout(RELEASE_PATIENCE, patiently(RETRY_PAUSE, "a release", release)).await;
    let failure = match released {
        Ok(Ok(())) => return,
        Ok(Err(failure)) => failure.message().to_owned(),
        Err(_) => format!("the roster was unavailable for {RELEASE_PATIENCE:?}"),
    };
    tracing::warn!(tasks = ?releases, error = %failure, "could not release the slots");
}
