//! Live fan-out of new notifications to the agents subscribed right now.
//!
//! Each subscription has its own bounded buffer. Publishing never waits: when
//! a subscriber's buffer is full, the subscriber is cut off (its buffer is
//! closed and marked overflowed) and it resumes from the durable inbox. So a
//! slow or stuck subscriber costs at most one buffer of memory and never slows
//! ingestion or the other subscribers.
//!
//! The hub also knows every open Subscribe stream, and reports them when
//! `/metrics` is scraped: `muster_notifier_subscribers` and
//! `muster_notifier_subscriber_lag{agent_id}` (see [`Hub::gauges`]).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

use bytes::Bytes;

use crate::domain::Reason;
use tokio::sync::mpsc;

/// A new notification as the hub passes it on: the encoded event and the
/// summary are shared by every notification of the event, and the whole
/// notification by every subscription of its agent.
pub(crate) struct LiveNotification {
    pub(crate) cursor: u64,
    pub(crate) agent_id: Arc<str>,
    pub(crate) reason: Reason,
    /// The wire event, encoded once.
    pub(crate) event: Bytes,
    pub(crate) output_summary: Arc<str>,
    /// When stored, ms since the epoch.
    pub(crate) created_at: i64,
}

struct Subscriber {
    id: u64,
    sender: mpsc::Sender<Arc<LiveNotification>>,
    overflowed: Arc<AtomicBool>,
    /// The subscription's count of notifications handed over and not yet written.
    unsent: Arc<AtomicU64>,
}

/// An open Subscribe stream, as the metrics see it.
struct OpenStream {
    agent_id: String,
    unsent: Arc<AtomicU64>,
}

/// The live subscribers, by agent, and the open Subscribe streams.
pub(crate) struct Hub {
    subscribers: Mutex<HashMap<String, Vec<Subscriber>>>,
    streams: Mutex<HashMap<u64, OpenStream>>,
    /// Agents with a lag series, so it is set to 0 when their last stream closes.
    lag_series: Mutex<BTreeSet<String>>,
    buffer: usize,
    next_id: AtomicU64,
}

/// What the hub reports when `/metrics` is scraped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Gauges {
    /// Open Subscribe streams.
    pub(crate) subscriptions: usize,
    /// Per agent with an open stream, the lag of its most lagging one.
    pub(crate) lag: BTreeMap<String, u64>,
}

/// One Subscribe stream, from its start to its end (across the live
/// registrations it makes when it catches up again after an overflow):
/// counted in the metrics while it lives.
pub(crate) struct Subscription {
    hub: Arc<Hub>,
    id: u64,
    agent_id: String,
    /// Notifications handed to its live buffers and not yet written to the
    /// response stream (see [`Hub::gauges`]).
    unsent: Arc<AtomicU64>,
}

impl Subscription {
    /// Registers a live buffer for the subscription's agent: every
    /// notification published from now on is offered to it.
    pub(crate) fn live(&self) -> LiveReceiver {
        let (sender, receiver) = mpsc::channel(self.hub.buffer);
        let overflowed = Arc::new(AtomicBool::new(false));
        let id = self.hub.next_id.fetch_add(1, Ordering::Relaxed);
        self.hub.lock().entry(self.agent_id.clone()).or_default().push(Subscriber {
            id,
            sender,
            overflowed: Arc::clone(&overflowed),
            unsent: Arc::clone(&self.unsent),
        });
        LiveReceiver {
            receiver,
            overflowed,
            agent_id: self.agent_id.clone(),
            id,
            hub: Arc::clone(&self.hub),
            unsent: Arc::clone(&self.unsent),
            holding: false,
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.hub.streams.lock().unwrap_or_else(PoisonError::into_inner).remove(&self.id);
    }
}

/// One live registration's end: live notifications in cursor order. Unregisters on drop.
pub(crate) struct LiveReceiver {
    receiver: mpsc::Receiver<Arc<LiveNotification>>,
    overflowed: Arc<AtomicBool>,
    agent_id: String,
    id: u64,
    hub: Arc<Hub>,
    unsent: Arc<AtomicU64>,
    /// Whether the subscription holds the last notification received: it
    /// counts as unsent until the next call to [`Self::recv`].
    holding: bool,
}

impl LiveReceiver {
    /// The next live notification; `None` once cut off (see [`Self::overflowed`]).
    ///
    /// Calling it again says the previous one was written (or skipped as
    /// already sent), which takes it out of the subscription's lag.
    pub(crate) async fn recv(&mut self) -> Option<Arc<LiveNotification>> {
        if std::mem::take(&mut self.holding) {
            self.unsent.fetch_sub(1, Ordering::Relaxed);
        }
        let next = self.receiver.recv().await;
        self.holding = next.is_some();
        next
    }

    /// Whether the buffer overflowed, so notifications after the buffered ones were missed.
    pub(crate) fn overflowed(&self) -> bool {
        self.overflowed.load(Ordering::Acquire)
    }
}

impl Drop for LiveReceiver {
    fn drop(&mut self) {
        // Unregistered first, so nothing more is handed over; what is still
        // buffered is dropped unsent, and no longer this subscription's lag
        // (a new registration replays it from the inbox).
        self.hub.remove(&self.agent_id, self.id);
        let dropped = self.receiver.len() + usize::from(self.holding);
        self.unsent.fetch_sub(dropped as u64, Ordering::Relaxed);
    }
}

impl Hub {
    /// A hub whose subscribers buffer up to `buffer` notifications each. It
    /// reports its gauges at every scrape of `/metrics` for as long as it lives
    /// (several hubs in one process, as in-process tests make, overwrite each
    /// other's).
    pub(crate) fn new(buffer: usize) -> Arc<Self> {
        let hub = Arc::new(Self {
            subscribers: Mutex::new(HashMap::new()),
            streams: Mutex::new(HashMap::new()),
            lag_series: Mutex::new(BTreeSet::new()),
            buffer: buffer.max(1),
            next_id: AtomicU64::new(1),
        });
        let measured = Arc::downgrade(&hub);
        muster_runtime::metrics::collect_on_render(move || {
            let Some(hub) = measured.upgrade() else { return false };
            hub.report();
            true
        });
        hub
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Subscriber>>> {
        // A panic while holding the lock leaves the map consistent: recover it.
        self.subscribers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Opens a Subscribe stream for `agent_id`; it counts in the metrics until dropped.
    pub(crate) fn open(self: &Arc<Self>, agent_id: &str) -> Subscription {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let unsent = Arc::new(AtomicU64::new(0));
        self.streams
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, OpenStream { agent_id: agent_id.to_owned(), unsent: Arc::clone(&unsent) });
        Subscription { hub: Arc::clone(self), id, agent_id: agent_id.to_owned(), unsent }
    }

    /// The open streams and their lag, as `/metrics` reports them.
    ///
    /// A subscription's lag is the number of notifications created for its
    /// agent since it registered with the hub that it has not yet written to
    /// its response stream: those waiting in its live buffer, plus the one
    /// being written. Every new notification of a subscribed agent is handed
    /// to each of the agent's live buffers as it is stored, so for a
    /// subscription that has caught up this is exactly "created but not yet
    /// sent", and it is the number that cuts the subscriber off when it
    /// reaches the buffer size (`MUSTER_SUBSCRIBER_BUFFER`). It is counted
    /// with one atomic per subscription and read only when scraped, so it
    /// costs the delivery path no shared lock.
    ///
    /// What it leaves out, because the design does not hold it in memory:
    /// the backlog a stream replays from the inbox when it starts after an
    /// older cursor (or catches up after an overflow); counting that would
    /// take a database count per stream. While that replay runs, a
    /// notification that also arrived live counts until the stream reaches
    /// its live copy, even if the replay sent it already. "Written" means
    /// handed to the gRPC response stream, whose own buffer (64 messages) and
    /// HTTP/2 flow control still lie between it and the client.
    ///
    /// An agent with several open streams reports its most lagging one.
    pub(crate) fn gauges(&self) -> Gauges {
        let streams = self.streams.lock().unwrap_or_else(PoisonError::into_inner);
        let mut gauges = Gauges { subscriptions: streams.len(), lag: BTreeMap::new() };
        for stream in streams.values() {
            let lag = gauges.lag.entry(stream.agent_id.clone()).or_default();
            *lag = (*lag).max(stream.unsent.load(Ordering::Relaxed));
        }
        gauges
    }

    /// Sets the gauges in the metrics registry; an agent whose last stream
    /// closed gets 0, so its series does not keep its last lag.
    fn report(&self) {
        let gauges = self.gauges();
        let mut lag_series = self.lag_series.lock().unwrap_or_else(PoisonError::into_inner);
        let closed: Vec<String> = lag_series.iter().filter(|agent| !gauges.lag.contains_key(*agent)).cloned().collect();
        let open = gauges.lag.iter().map(|(agent, unsent)| (agent, *unsent));
        for (agent_id, lag) in closed.iter().map(|agent| (agent, 0)).chain(open) {
            muster_runtime::metrics::set(
                "muster_notifier_subscriber_lag",
                "Per agent, notifications created for it that its most lagging live subscription has not yet \
                 written to its stream (0 once it has none)",
                &[("agent_id", agent_id.as_str())],
                lag as f64,
            );
        }
        *lag_series = gauges.lag.keys().cloned().collect();
        muster_runtime::metrics::set(
            "muster_notifier_subscribers",
            "Open Subscribe streams",
            &[],
            gauges.subscriptions as f64,
        );
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

    /// Whether any live buffer is registered.
    pub(crate) fn has_subscribers(&self) -> bool {
        !self.lock().is_empty()
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
            list.retain(|subscriber| {
                // Counted before it can be received, so the count never drops below zero.
                subscriber.unsent.fetch_add(1, Ordering::Relaxed);
                let offered = subscriber.sender.try_send(Arc::clone(&notification));
                if offered.is_err() {
                    subscriber.unsent.fetch_sub(1, Ordering::Relaxed);
                }
                match offered {
                    Ok(()) => true,
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        subscriber.overflowed.store(true, Ordering::Release);
                        tracing::info!(agent_id = %agent_id, "subscriber fell behind; cutting it off");
                        false
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => false,
                }
            });
            if list.is_empty() {
                subscribers.remove(*agent_id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Publishes `count` notifications for `agent_id`, with cursors from `first`.
    fn publish(hub: &Hub, agent_id: &str, first: u64, count: usize) {
        let deliveries = vec![agent_id; count];
        hub.publish(&deliveries, |index| LiveNotification {
            cursor: first + index as u64,
            agent_id: Arc::from(agent_id),
            reason: Reason::Monitor,
            event: Bytes::new(),
            output_summary: Arc::from(""),
            created_at: 0,
        });
    }

    fn lag(hub: &Hub, agent_id: &str) -> Option<u64> {
        hub.gauges().lag.get(agent_id).copied()
    }

    /// Receives without waiting for more: says the previous one was written.
    async fn written(live: &mut LiveReceiver) {
        let _ = tokio::time::timeout(Duration::from_millis(10), live.recv()).await;
    }

    #[tokio::test]
    async fn lag_counts_notifications_handed_over_until_the_next_is_asked_for() {
        let hub = Hub::new(8);
        let subscription = hub.open("lagging");
        assert_eq!(hub.gauges(), Gauges { subscriptions: 1, lag: BTreeMap::from([("lagging".to_owned(), 0)]) });
        let mut live = subscription.live();
        publish(&hub, "lagging", 1, 3);
        publish(&hub, "someone-else", 4, 2);
        assert_eq!(lag(&hub, "lagging"), Some(3));
        assert_eq!(live.recv().await.unwrap().cursor, 1);
        assert_eq!(lag(&hub, "lagging"), Some(3), "the one being written still counts");
        assert_eq!(live.recv().await.unwrap().cursor, 2);
        assert_eq!(lag(&hub, "lagging"), Some(2));
        assert_eq!(live.recv().await.unwrap().cursor, 3);
        written(&mut live).await;
        assert_eq!(lag(&hub, "lagging"), Some(0));

        // The most lagging of an agent's streams is reported.
        let second = hub.open("lagging");
        let second_live = second.live();
        publish(&hub, "lagging", 6, 2);
        assert_eq!(live.recv().await.unwrap().cursor, 6);
        assert_eq!(live.recv().await.unwrap().cursor, 7);
        written(&mut live).await;
        assert_eq!(hub.gauges().subscriptions, 2);
        assert_eq!(lag(&hub, "lagging"), Some(2));

        drop((second_live, second));
        assert_eq!(lag(&hub, "lagging"), Some(0));
        drop((live, subscription));
        assert_eq!(hub.gauges(), Gauges::default());
    }

    #[tokio::test]
    async fn an_overflowed_registration_leaves_no_lag_behind() {
        let hub = Hub::new(2);
        let subscription = hub.open("slow");
        let live = subscription.live();
        publish(&hub, "slow", 1, 3);
        assert!(live.overflowed());
        assert_eq!(lag(&hub, "slow"), Some(2), "the third was refused, not handed over");
        drop(live);
        assert_eq!(lag(&hub, "slow"), Some(0), "what was buffered is replayed from the inbox");
        let mut again = subscription.live();
        publish(&hub, "slow", 4, 1);
        assert_eq!(lag(&hub, "slow"), Some(1));
        assert_eq!(again.recv().await.unwrap().cursor, 4);
        written(&mut again).await;
        assert_eq!(lag(&hub, "slow"), Some(0));
    }

    #[tokio::test]
    async fn scrapes_report_the_gauges_and_zero_for_agents_gone() {
        let hub = Hub::new(8);
        let subscription = hub.open("scraped-agent");
        let live = subscription.live();
        publish(&hub, "scraped-agent", 1, 2);
        let text = muster_runtime::metrics::render();
        assert!(text.contains("# TYPE muster_notifier_subscribers gauge\n"), "{text}");
        assert!(text.contains("# TYPE muster_notifier_subscriber_lag gauge\n"), "{text}");
        assert!(text.contains("muster_notifier_subscriber_lag{agent_id=\"scraped-agent\"} 2.0\n"), "{text}");
        drop((live, subscription));
        let text = muster_runtime::metrics::render();
        assert!(text.contains("muster_notifier_subscriber_lag{agent_id=\"scraped-agent\"} 0.0\n"), "{text}");
    }
}
