//! Workers that stop being trusted or stop answering: a revoked token takes
//! its agents (and their assignments) from every worker, and a worker
//! silent past its lease is cut off, its assignments going back to be
//! assigned again.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use muster_runtime::auth::TokenHash;

use super::{Closing, ToWorker, WorkerSender, Workers};
use crate::domain::model::Outcome;

impl Workers {
    /// Ends the connections opened with a token that is now `revoked`, and
    /// takes from every other worker the agents whose token is revoked: their
    /// assignments on that worker are withdrawn and go back to be assigned.
    pub(crate) fn drop_revoked(self: &Arc<Self>, revoked: impl Fn(&TokenHash) -> bool) {
        let closed: Vec<(u64, WorkerSender)> = self
            .lock()
            .workers
            .iter()
            .filter(|(_, worker)| worker.connection.opened_with.as_ref().is_some_and(&revoked))
            .map(|(worker_id, worker)| (*worker_id, worker.connection.sender.clone()))
            .collect();
        for (worker_id, sender) in closed {
            tracing::info!(worker_id, "the token the worker connected with was revoked; disconnecting it");
            let _ = sender.send(ToWorker::Close(Closing::Revoked));
            self.unregister(worker_id);
        }
        let mut state = self.lock();
        let mut dropped: Vec<(u64, String)> = Vec::new();
        for (worker_id, worker) in &mut state.workers {
            worker.connection.agents.retain(|agent| {
                let keep = !revoked(&agent.token);
                if !keep {
                    dropped.push((*worker_id, agent.agent_id.clone()));
                }
                keep
            });
        }
        if dropped.is_empty() {
            return;
        }
        let lost: Vec<String> = state
            .pending
            .iter()
            .filter(|(_, pending)| {
                dropped
                    .iter()
                    .any(|(worker_id, agent_id)| *worker_id == pending.worker_id && *agent_id == pending.agent_id)
            })
            .map(|(assignment_id, _)| assignment_id.clone())
            .collect();
        let routes = Self::take_back(&mut state, &lost, |pending| {
            format!("the token of agent '{}' was revoked", pending.agent_id)
        });
        drop(state);
        for route in routes {
            route.report(Outcome::WorkerLost);
        }
        self.changed();
        for (worker_id, agent_id) in &dropped {
            tracing::info!(worker_id, agent_id = %agent_id, "token revoked; the worker no longer serves the agent");
        }
    }

    /// Notes a sign of life from a worker.
    pub(crate) fn touch(&self, worker_id: u64) {
        if let Some(worker) = self.lock().workers.get_mut(&worker_id) {
            worker.last_seen = Instant::now();
        }
    }

    /// Disconnects the workers silent for longer than `lease`: their streams
    /// end with DEADLINE_EXCEEDED and their assignments go back to be
    /// assigned again.
    pub(crate) fn expire_silent(&self, lease: Duration) {
        let silent: Vec<(u64, WorkerSender)> = self
            .lock()
            .workers
            .iter()
            .filter(|(_, worker)| worker.last_seen.elapsed() > lease)
            .map(|(worker_id, worker)| (*worker_id, worker.connection.sender.clone()))
            .collect();
        for (worker_id, sender) in silent {
            tracing::warn!(
                worker_id,
                lease_ms = lease.as_millis() as u64,
                "worker silent past its lease; disconnecting it"
            );
            let _ = sender.send(ToWorker::Close(Closing::LeaseExpired(lease)));
            self.unregister(worker_id);
        }
    }
}
