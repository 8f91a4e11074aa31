//! Live fan-out of new notifications to the agents subscribed right now.
//!
//! Each subscription has its own bounded buffer. Publishing never waits: when
//! a subscriber's buffer is full, the subscriber is cut off (its buffer is
//! closed and marked overflowed) and it resumes from the durable inbox. So a
//! slow or stuck subscriber costs at most one buffer of memory and never slows
//! ingestion or the other subscribers.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

use muster_proto::common::v1::StepEvent;

use crate::domain::Reason;
use tokio::sync::mpsc;

/// A new notification as the hub passes it on: the event and summary are
/// shared by every notification of the event.
pub(crate) struct LiveNotification {
    pub(crate) cursor: u64,
    pub(crate) agent_id: String,
    pub(crate) reason: Reason,
    pub(crate) event: Arc<StepEvent>,
    pub(crate) output_summary: Arc<str>,
    /// When stored, ms since the epoch.
    pub(crate) created_at: i64,
}

struct Subscriber {
    id: u64,
    sender: mpsc::Sender<Arc<LiveNotification>>,
    overflowed: Arc<AtomicBool>,
}

/// The live subscribers, by agent.
pub(crate) struct Hub {
    subscribers: Mutex<HashMap<String, Vec<Subscriber>>>,
    buffer: usize,
    next_id: AtomicU64,
}

/// One subscription's end: live notifications in cursor order. Unregisters on drop.
pub(crate) struct LiveReceiver {
    receiver: mpsc::Receiver<Arc<LiveNotification>>,
    overflowed: Arc<AtomicBool>,
    agent_id: String,
    id: u64,
    hub: Arc<Hub>,
}

impl LiveReceiver {
    /// The next live notification; `None` once cut off (see [`Self::overflowed`]).
    pub(crate) async fn recv(&mut self) -> Option<Arc<LiveNotification>> {
        self.receiver.recv().await
    }

    /// Whether the buffer overflowed, so notifications after the buffered ones were missed.
    pub(crate) fn overflowed(&self) -> bool {
        self.overflowed.load(Ordering::Acquire)
    }
}

impl Drop for LiveReceiver {
    fn drop(&mut self) {
        self.hub.remove(&self.agent_id, self.id);
    }
}

impl Hub {
    /// A hub whose subscribers buffer up to `buffer` notifications each.
    pub(crate) fn new(buffer: usize) -> Arc<Self> {
        Arc::new(Self { subscribers: Mutex::new(HashMap::new()), buffer: buffer.max(1), next_id: AtomicU64::new(1) })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Subscriber>>> {
        // A panic while holding the lock leaves the map consistent: recover it.
        self.subscribers.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Registers a live subscription for `agent_id`.
    pub(crate) fn subscribe(self: &Arc<Self>, agent_id: &str) -> LiveReceiver {
        let (sender, receiver) = mpsc::channel(self.buffer);
        let overflowed = Arc::new(AtomicBool::new(false));
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.lock().entry(agent_id.to_owned()).or_default().push(Subscriber {
            id,
            sender,
            overflowed: Arc::clone(&overflowed),
        });
        LiveReceiver { receiver, overflowed, agent_id: agent_id.to_owned(), id, hub: Arc::clone(self) }
    }

    fn remove(&self, agent_id: &str, id: u64) {
        let mut subscribers = self.lock();
        if let Some(list) = subscribers.get_mut(agent_id) {
            list.retain(|subscriber| subscriber.id != id);
            if list.is_empty() {
                subscribers.remove(agent_id);
            }
        }
    }

    /// Offers each notification to the subscribers of its agent, in order.
    /// `build(index)` makes the notification of `deliveries[index]`; it is
    /// called only when someone listens.
    pub(crate) fn publish(&self, deliveries: &[&str], build: impl Fn(usize) -> LiveNotification) {
        let mut subscribers = self.lock();
        if subscribers.is_empty() {
            return;
        }
        for (index, agent_id) in deliveries.iter().enumerate() {
            let Some(list) = subscribers.get_mut(*agent_id) else { continue };
            let notification = Arc::new(build(index));
            list.retain(|subscriber| match subscriber.sender.try_send(Arc::clone(&notification)) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    subscriber.overflowed.store(true, Ordering::Release);
                    tracing::info!(agent_id = %agent_id, "subscriber fell behind; cutting it off");
                    false
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            });
            if list.is_empty() {
                subscribers.remove(*agent_id);
            }
        }
    }
}
