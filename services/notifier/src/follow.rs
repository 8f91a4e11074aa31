//! Live delivery when replicas share the database (PostgreSQL): each
//! replica offers its subscribers every notification, whichever replica
//! stored it, in cursor order. Replicas store one batch at a time (see
//! [`crate::ingest`]), so cursors become visible in increasing order and
//! offering on from the last one offered misses none.
//!
//! A replica offers the batches it stores itself as it stores them (in its
//! turn, after what others stored before, read from the inbox if it was not
//! offered yet), and reads the others' from the inbox every
//! [`FOLLOW_EVERY`].

use std::{sync::Arc, time::Duration};

use tokio::sync::{Mutex, Notify, watch};

use crate::{
    Result,
    hub::{Hub, LiveNotification},
    store::{Store, StoredNotification},
};

/// How often the inbox is read for the notifications other replicas stored.
pub(crate) const FOLLOW_EVERY: Duration = Duration::from_millis(100);
/// Most notifications read at once.
const PAGE: u32 = 2048;

/// How far this replica's subscribers were offered the inbox.
#[derive(Debug, Default)]
pub(crate) struct Follower {
    /// The last cursor offered; `None` until the follower starts.
    seen: Mutex<Option<u64>>,
    /// Makes the follower read the inbox at once.
    wake: Notify,
}

impl Follower {
    /// Starts following the inbox once `ready` turns true.
    pub(crate) fn spawn<S: Store>(self: &Arc<Self>, store: Arc<S>, hub: Arc<Hub>, mut ready: watch::Receiver<bool>) {
        let follower = Arc::clone(self);
        tokio::spawn(async move {
            if ready.wait_for(|ready| *ready).await.is_err() {
                return;
            }
            loop {
                if let Err(error) = follower.follow(store.as_ref(), &hub).await {
                    tracing::warn!(%error, "reading the inbox for live subscribers failed");
                }
                tokio::select! {
                    () = follower.wake.notified() => {}
                    () = tokio::time::sleep(FOLLOW_EVERY) => {}
                }
            }
        });
    }

    /// Offers the subscribers what was stored after the last cursor offered.
    /// With nobody subscribed, only notes how far the inbox goes: a
    /// subscriber reads what was stored before it subscribed from the inbox.
    async fn follow<S: Store>(&self, store: &S, hub: &Hub) -> Result<()> {
        let mut seen = self.seen.lock().await;
        let newest = match *seen {
            Some(after) if hub.has_subscribers() => offer_stored(store, hub, after, u64::MAX).await?,
            _ => store.newest_cursor_of_all().await?.max(seen.unwrap_or(0)),
        };
        *seen = Some(newest);
        Ok(())
    }

    /// Offers a batch this replica stored, with the cursors `first..=last`,
    /// during its turn (so everything below `first` is committed): first
    /// what other replicas stored before it and was not offered yet, then
    /// the batch itself, by `offer(after)` (its notifications with a cursor
    /// above `after`). Before the follower started, or when the inbox
    /// cannot be read, the follower offers the batch from the inbox instead.
    pub(crate) async fn offer_own<S: Store>(
        &self,
        store: &S,
        hub: &Hub,
        first: u64,
        last: u64,
        offer: impl FnOnce(u64),
    ) {
        let mut seen = self.seen.lock().await;
        let Some(after) = *seen else {
            self.wake.notify_one();
            return;
        };
        let after = if after + 1 < first && hub.has_subscribers() {
            match offer_stored(store, hub, after, first - 1).await {
                Ok(offered) => offered,
                Err(error) => {
                    tracing::warn!(%error, "reading the inbox for live subscribers failed");
                    self.wake.notify_one();
                    return;
                }
            }
        } else {
            after
        };
        offer(after);
        *seen = Some(after.max(last));
    }
}

/// Offers the stored notifications with a cursor above `after` and at most
/// `until`; the last cursor offered (`after` when none).
async fn offer_stored<S: Store>(store: &S, hub: &Hub, mut after: u64, until: u64) -> Result<u64> {
    loop {
        let mut page = store.list_all(after, PAGE).await?;
        let full = page.len() == PAGE as usize;
        page.retain(|notification| notification.cursor <= until);
        let Some(last) = page.last() else { return Ok(after) };
        after = last.cursor;
        offer(hub, &page);
        if !full || after >= until {
            return Ok(after);
        }
    }
}

fn offer(hub: &Hub, page: &[StoredNotification]) {
    let agents: Vec<&str> = page.iter().map(|notification| notification.agent_id.as_str()).collect();
    hub.publish(&agents, |index| {
        let notification = &page[index];
        LiveNotification {
            cursor: notification.cursor,
            agent_id: Arc::from(notification.agent_id.as_str()),
            reason: notification.reason,
            event: notification.encoded.clone(),
            output_summary: Arc::from(notification.output_summary.as_str()),
            created_at: notification.created_at,
        }
    });
}
