//! Live delivery when replicas share the database (PostgreSQL): each
//! replica offers its subscribers every notification, whichever replica
//! stored it, by reading the inbox in cursor order — right after each batch
//! of its own, and every [`FOLLOW_EVERY`] for the others'. Replicas store
//! one batch at a time (see [`crate::ingest`]), so cursors become visible in
//! increasing order and reading on from the last one seen misses none.

use std::{sync::Arc, time::Duration};

use tokio::sync::{Notify, watch};

use crate::{
    hub::{Hub, LiveNotification},
    store::Store,
};

/// How often the inbox is read for the notifications other replicas stored.
pub(crate) const FOLLOW_EVERY: Duration = Duration::from_millis(100);
/// Most notifications read at once.
const PAGE: u32 = 2048;

/// Starts following the inbox once `ready` turns true; `wake` makes it read at once.
pub(crate) fn spawn<S: Store>(store: Arc<S>, hub: Arc<Hub>, wake: Arc<Notify>, mut ready: watch::Receiver<bool>) {
    tokio::spawn(async move {
        if ready.wait_for(|ready| *ready).await.is_err() {
            return;
        }
        let mut seen = None;
        loop {
            tokio::select! {
                () = wake.notified() => {}
                () = tokio::time::sleep(FOLLOW_EVERY) => {}
            }
            if let Err(error) = follow(store.as_ref(), &hub, &mut seen).await {
                tracing::warn!(%error, "reading the inbox for live subscribers failed");
            }
        }
    });
}

/// Offers the subscribers what was stored after `seen`. With nobody
/// subscribed, only notes how far the inbox goes: a subscriber reads what
/// was stored before it subscribed from the inbox itself.
async fn follow<S: Store>(store: &S, hub: &Hub, seen: &mut Option<u64>) -> crate::Result<()> {
    let Some(after) = *seen else {
        *seen = Some(store.newest_cursor_of_all().await?);
        return Ok(());
    };
    if !hub.has_subscribers() {
        *seen = Some(store.newest_cursor_of_all().await?.max(after));
        return Ok(());
    }
    let mut after = after;
    loop {
        let page = store.list_all(after, PAGE).await?;
        let Some(last) = page.last() else { break };
        after = last.cursor;
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
        *seen = Some(after);
        if page.len() < PAGE as usize {
            break;
        }
    }
    Ok(())
}
