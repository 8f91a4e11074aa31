//! The long-lived watches: a queued task's resolution, and the roster's
//! changes (agents, roles, statuses) as they are announced. The trait
//! methods in `mod.rs` call these.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, MutexGuard, PoisonError},
};

use muster_proto::roster::v1::{self as pb};
use tokio::sync::broadcast;
use tokio_stream::{Stream, StreamExt, wrappers::BroadcastStream};
use tonic::{Request, Response, Status as GrpcStatus};

use super::convert::{agent_to_wire, decision_to_wire};
use super::{ResponseStream, RosterGrpc};
use crate::error::{Error, Result};
use crate::store::{QueueResolution, QueueState, Store};
use muster_runtime::roles::role_to_wire;

impl<S: Store> RosterGrpc<S> {
    pub(super) async fn announce_agents(&self, kind: pb::RosterChangeKind, ids: &[String]) {
        let status_unwatched = kind == pb::RosterChangeKind::AgentStatus
            && self.inner.status_watchers.load(std::sync::atomic::Ordering::Relaxed) == 0;
        if self.inner.roster_changes.receiver_count() == 0 || status_unwatched {
            return;
        }
        for id in ids {
            // The organisation in memory has every change this replica committed.
            match self.inner.store.indexed_agent(id).await {
                Ok(agent) => {
                    let _ = self.inner.roster_changes.send(pb::WatchRosterResponse {
                        kind: kind as i32,
                        agent: Some(agent_to_wire(&agent)),
                        role: None,
                    });
                }
                Err(error) => {
                    tracing::debug!(%error, agent_id = %id, "agent changed and vanished before it was announced")
                }
            }
        }
    }

    /// Tells the roster's watchers about roles put (as stored) or removed
    /// (by name).
    pub(super) fn announce_roles(&self, kind: pb::RosterChangeKind, roles: Vec<pb::RoleDefinition>) {
        if let Some(known) = self.known_roles().as_mut() {
            for role in &roles {
                if kind == pb::RosterChangeKind::RoleRemoved {
                    known.remove(&role.name);
                } else {
                    known.insert(role.name.clone(), role.clone());
                }
            }
        }
        for role in roles {
            let _ = self.inner.roster_changes.send(pb::WatchRosterResponse {
                kind: kind as i32,
                agent: None,
                role: Some(role),
            });
        }
    }

    pub(super) fn announce_resolutions(&self, resolutions: &[QueueResolution]) {
        for resolution in resolutions {
            tracing::info!(task_id = %resolution.task_id, decision = resolution.decision.kind.as_str(), agent_id = %resolution.decision.primary_agent_id, "queued task resolved");
            let _ = self.inner.queue_resolutions.send(resolution.clone());
        }
    }

    pub(super) fn known_roles(&self) -> MutexGuard<'_, Option<HashMap<String, pb::RoleDefinition>>> {
        self.inner.known_roles.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Announces the roles another replica put or removed since the last look.
    pub(super) async fn follow_roles(&self) -> Result<()> {
        let listed: HashMap<String, pb::RoleDefinition> =
            self.inner.store.list_roles().await?.iter().map(|role| (role.name.clone(), role_to_wire(role))).collect();
        let (put, removed) = {
            let mut known = self.known_roles();
            let Some(previous) = known.as_mut() else {
                *known = Some(listed);
                return Ok(());
            };
            let put: Vec<pb::RoleDefinition> =
                listed.values().filter(|role| previous.get(&role.name) != Some(*role)).cloned().collect();
            let removed: Vec<pb::RoleDefinition> = previous
                .keys()
                .filter(|name| !listed.contains_key(*name))
                .map(|name| pb::RoleDefinition { name: name.clone(), ..Default::default() })
                .collect();
            *previous = listed;
            (put, removed)
        };
        self.announce_roles(pb::RosterChangeKind::RoleUpserted, put);
        self.announce_roles(pb::RosterChangeKind::RoleRemoved, removed);
        Ok(())
    }

    pub(super) async fn serve_watch_queued_task(
        &self,
        request: Request<pb::WatchQueuedTaskRequest>,
    ) -> Result<Response<ResponseStream<pb::WatchQueuedTaskResponse>>, GrpcStatus> {
        let task_id = request.into_inner().task_id.trim().to_owned();
        if task_id.is_empty() {
            return Err(Error::invalid("task_id", "task_id: required").into());
        }
        // Subscribe before reading the state, so a resolution in between is not missed.
        let mut receiver = self.inner.queue_resolutions.subscribe();
        let state = self.inner.store.queue_state(&task_id).await?;
        let roster = self.clone();
        let stream = async_stream_once(async move {
            if let QueueState::Resolved(decision) = state {
                return Ok(pb::WatchQueuedTaskResponse { decision: Some(decision_to_wire(&decision)) });
            }
            loop {
                let Ok(received) = tokio::time::timeout(QUEUE_WATCH_POLL, receiver.recv()).await else {
                    // Another replica may have resolved it.
                    if let QueueState::Resolved(decision) = roster.inner.store.queue_state(&task_id).await? {
                        return Ok(pb::WatchQueuedTaskResponse { decision: Some(decision_to_wire(&decision)) });
                    }
                    continue;
                };
                match received {
                    Ok(resolution) if resolution.task_id == task_id => {
                        return Ok(pb::WatchQueuedTaskResponse {
                            decision: Some(decision_to_wire(&resolution.decision)),
                        });
                    }
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        if let QueueState::Resolved(decision) = roster.inner.store.queue_state(&task_id).await? {
                            return Ok(pb::WatchQueuedTaskResponse { decision: Some(decision_to_wire(&decision)) });
                        }
                    }
                    Err(broadcast::error::RecvError::Closed) => {
                        return Err(Error::RetryLater {
                            reason: "SHUTTING_DOWN",
                            message: "the roster is shutting down; try again".to_owned(),
                        });
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }

    pub(super) async fn serve_watch_roster(
        &self,
        request: Request<pb::WatchRosterRequest>,
    ) -> Result<Response<ResponseStream<pb::WatchRosterResponse>>, GrpcStatus> {
        let mut kinds = HashSet::new();
        for (index, &kind) in request.get_ref().kinds.iter().enumerate() {
            match pb::RosterChangeKind::try_from(kind) {
                Ok(pb::RosterChangeKind::Unspecified) | Err(_) => {
                    return Err(Error::invalid(
                        format!("kinds[{index}]"),
                        format!("kinds[{index}]: {kind} is not a kind of change"),
                    )
                    .into());
                }
                Ok(_) => {
                    kinds.insert(kind);
                }
            }
        }
        let status = kinds.is_empty() || kinds.contains(&(pb::RosterChangeKind::AgentStatus as i32));
        // Counted while the stream lives.
        let watching = status.then(|| StatusWatcher::new(&self.inner.status_watchers));
        let stream = BroadcastStream::new(self.inner.roster_changes.subscribe()).filter_map(move |change| {
            let _watching = &watching;
            match change {
                Ok(change) if kinds.is_empty() || kinds.contains(&change.kind) => Some(Ok(change)),
                Ok(_) => None,
                Err(error) => {
                    tracing::warn!(%error, "a roster watcher fell behind; changes were skipped");
                    None
                }
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }
}

/// How often a watch of a queued task reads the task's state from the
/// database, for a resolution another replica made (its own it hears of at once).
const QUEUE_WATCH_POLL: std::time::Duration = std::time::Duration::from_secs(1);

/// One watcher of agents' status changes, counted while it lives.
struct StatusWatcher(Arc<std::sync::atomic::AtomicUsize>);

impl StatusWatcher {
    fn new(count: &Arc<std::sync::atomic::AtomicUsize>) -> Self {
        count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Self(count.clone())
    }
}

impl Drop for StatusWatcher {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A stream of the one item `future` produces; the future is dropped when the client goes away.
fn async_stream_once<T: Send + 'static>(
    future: impl std::future::Future<Output = Result<T>> + Send + 'static,
) -> impl Stream<Item = Result<T, GrpcStatus>> + Send + 'static {
    let (sender, receiver) = tokio::sync::mpsc::channel(1);
    tokio::spawn(async move {
        tokio::select! {
            result = future => {
                let _ = sender.send(result.map_err(GrpcStatus::from)).await;
            }
            () = sender.closed() => {}
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(receiver)
}
