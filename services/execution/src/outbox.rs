//! The outbox publisher: streams stored events to the notifier in outbox
//! order and deletes each one only once the notifier acknowledged it. When
//! the notifier is down, events wait in the outbox; after a reconnect every
//! unacknowledged event is sent again (the notifier deduplicates by id).

use std::{collections::VecDeque, sync::Arc, time::Duration};

use muster_proto::notifier::v1::{IngestEventsRequest, notifier_service_client::NotifierServiceClient};
use muster_runtime::auth::client::AuthChannel;
use tokio::sync::{Notify, mpsc};
use tokio_stream::wrappers::ReceiverStream;

use crate::store::Store;

type NotifierClient = NotifierServiceClient<AuthChannel>;

/// Most events sent and not yet acknowledged.
const MAX_IN_FLIGHT: usize = 2048;
/// Outbox rows read at once.
const BATCH: u32 = 512;

/// Runs until the task is aborted.
pub(crate) async fn publish(store: Store, notifier: NotifierClient, wake: Arc<Notify>) {
    let mut backoff = Duration::from_millis(50);
    loop {
        match session(&store, notifier.clone(), &wake).await {
            Ok(()) => backoff = Duration::from_millis(50),
            Err(error) => {
                tracing::warn!(%error, retry_in_ms = backoff.as_millis() as u64, "event stream to the notifier interrupted");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
    }
}

async fn session(store: &Store, mut client: NotifierClient, wake: &Notify) -> anyhow::Result<()> {
    let (sender, receiver) = mpsc::channel::<IngestEventsRequest>(BATCH as usize);
    let mut acknowledgements = client.ingest_events(ReceiverStream::new(receiver)).await?.into_inner();
    tracing::info!("event stream to the notifier open");

    let mut in_flight: VecDeque<(i64, String)> = VecDeque::new();
    let mut last_sent_id = 0_i64;
    loop {
        let woken = wake.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        if in_flight.len() < MAX_IN_FLIGHT {
            for entry in store.outbox_after(last_sent_id, BATCH).await? {
                let event_id = entry.event.event_id.clone();
                sender.send(IngestEventsRequest { event: Some(entry.event) }).await?;
                in_flight.push_back((entry.id, event_id));
                last_sent_id = entry.id;
            }
        }
        tokio::select! {
            acknowledgement = acknowledgements.message() => {
                let Some(acknowledgement) = acknowledgement? else {
                    anyhow::bail!("the notifier closed the stream");
                };
                let Some((outbox_id, event_id)) = in_flight.pop_front() else {
                    anyhow::bail!("acknowledgement for {} with nothing in flight", acknowledgement.event_id);
                };
                if event_id != acknowledgement.event_id {
                    anyhow::bail!("acknowledgement out of order: expected {event_id}, got {}", acknowledgement.event_id);
                }
                store.delete_outbox_through(outbox_id).await?;
            }
            () = &mut woken, if in_flight.len() < MAX_IN_FLIGHT => {}
        }
    }
}
