//! Reading an agent's durable inbox at the notifier, page by page.

use std::time::{Duration, Instant};

use muster_proto::notifier::v1::{
    ListNotificationsRequest, Notification, notifier_service_client::NotifierServiceClient,
};
use muster_runtime::auth::client::AuthChannel;

use crate::credentials::Endpoint;

/// Most notifications the notifier returns per page.
const PAGE: u32 = 1000;

async fn page(
    notifier: &mut NotifierServiceClient<AuthChannel>,
    agent_id: &str,
    after_cursor: u64,
) -> anyhow::Result<Vec<Notification>> {
    let request = ListNotificationsRequest { agent_id: agent_id.to_owned(), after_cursor, limit: PAGE };
    Ok(notifier.list_notifications(request).await?.into_inner().notifications)
}

/// Every notification in an agent's inbox, in cursor order (read as the
/// agent itself, or as an operator).
pub async fn all(notifier: &Endpoint, agent_id: &str) -> anyhow::Result<Vec<Notification>> {
    let mut notifier = NotifierServiceClient::new(notifier.channel()?);
    let mut notifications: Vec<Notification> = Vec::new();
    loop {
        let after_cursor = notifications.last().map_or(0, |notification| notification.cursor);
        let next = page(&mut notifier, agent_id, after_cursor).await?;
        if next.is_empty() {
            return Ok(notifications);
        }
        notifications.extend(next);
    }
}

/// Waits until the event `event_id` is in the agent's inbox, reading each
/// notification once; fails after `limit`.
pub async fn wait_for_event(
    notifier: &Endpoint,
    agent_id: &str,
    event_id: &str,
    limit: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    let mut after_cursor = 0;
    let mut client = NotifierServiceClient::new(notifier.channel()?);
    loop {
        if let Ok(next) = page(&mut client, agent_id, after_cursor).await {
            if next
                .iter()
                .any(|notification| notification.event.as_ref().is_some_and(|event| event.event_id == event_id))
            {
                return Ok(());
            }
            after_cursor = next.last().map_or(after_cursor, |notification| notification.cursor);
            if next.len() == PAGE as usize {
                continue; // a full page: read on at once
            }
        }
        if Instant::now() > deadline {
            anyhow::bail!("event {event_id} did not reach {agent_id}'s inbox within {} s", limit.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}
