//! The notifier's publisher: streams the event log to the notifier in log
//! order, from the notifier's cursor on, and moves the cursor forward as the
//! notifier acknowledges (written at most every 100 ms, off the engine's
//! way: after a restart, what the notifier acknowledged since is sent again
//! and deduplicated). When the notifier is down, events wait in the log;
//! after a reconnect everything past the cursor is sent again (the notifier
//! deduplicates by event id). Reads are at least [`LINGER`] apart, so a
//! busy engine's commits travel a few at a time. Each event goes as it is
//! stored, read only for its id, not decoded and encoded again.
//!
//! With several replicas, only the one that leads ([`Store::leads`])
//! publishes; it reads the log when its own commits wake it and every
//! [`POLL`] for the other replicas' events. When the leader changes, the
//! new one starts from the stored cursor.

use std::{collections::VecDeque, sync::Arc, time::Duration};

use muster_proto::{
    frame::{IngestFrame, event_id},
    notifier::v1::framed_client::notifier_service_client::NotifierServiceClient,
};
use muster_runtime::auth::client::AuthChannel;
use tokio::sync::{Notify, mpsc};
use tokio_stream::wrappers::ReceiverStream;

use crate::store::{NOTIFIER_CURSOR, Store};

/// The notifier over gRPC; events go as they are stored.
pub(crate) type NotifierClient = NotifierServiceClient<AuthChannel>;

/// Most events sent and not yet acknowledged.
const MAX_IN_FLIGHT: usize = 4096;
/// Log entries read at once.
const BATCH: u32 = 1024;
/// How often, at most, the cursor is written while acknowledgements flow:
/// after a restart, what was acknowledged since is sent again, once.
const CURSOR_EVERY: Duration = Duration::from_millis(100);

/// Least time between two reads of the log: the commits of a busy engine
/// reach the notifier a few at a time, in one read and one send, instead of
/// one read and one send each; a commit after a quiet spell goes at once.
const LINGER: Duration = Duration::from_millis(2);

/// How often the log is read for events other replicas committed.
const POLL: Duration = Duration::from_millis(100);
/// How often a replica checks whether it leads.
const LEAD_CHECK: Duration = Duration::from_secs(1);

/// Runs until the task is cancelled.
pub(crate) async fn publish(store: Arc<dyn Store>, notifier: NotifierClient, wake: Arc<Notify>) {
    let mut backoff = Duration::from_millis(50);
    loop {
        match store.leads().await {
            Ok(true) => {}
            Ok(false) => {
                tokio::time::sleep(LEAD_CHECK).await;
                continue;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot tell whether this replica streams the log to the notifier");
                tokio::time::sleep(LEAD_CHECK).await;
                continue;
            }
        }
        match session(store.as_ref(), notifier.clone(), &wake).await {
            Ok(()) => backoff = Duration::from_millis(50),
            Err(error) => {
                tracing::warn!(%error, retry_in_ms = backoff.as_millis() as u64, "event stream to the notifier interrupted");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
    }
}

async fn session(store: &dyn Store, mut client: NotifierClient, wake: &Notify) -> anyhow::Result<()> {
    let (sender, receiver) = mpsc::channel::<IngestFrame>(BATCH as usize);
    let mut acknowledgements = client.ingest_events(ReceiverStream::new(receiver)).await?.into_inner();
    tracing::info!("event stream to the notifier open");

    let mut in_flight: VecDeque<(i64, String)> = VecDeque::new();
    let mut last_sent = store.cursor(NOTIFIER_CURSOR).await?;
    let mut acknowledged = last_sent;
    let mut written = last_sent;
    let mut write_cursor = tokio::time::interval(CURSOR_EVERY);
    write_cursor.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut poll = tokio::time::interval(POLL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut lead_check = tokio::time::interval(LEAD_CHECK);
    lead_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_read = tokio::time::Instant::now();
    loop {
        let woken = wake.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        if in_flight.len() < MAX_IN_FLIGHT {
            last_read = tokio::time::Instant::now();
            for (position, bytes) in store.log_after(last_sent, BATCH).await? {
                let event_id = event_id(&bytes)
                    .map_err(|error| anyhow::anyhow!("event {position} of the log is corrupt: {error}"))?;
                sender.send(IngestFrame { event: bytes.into() }).await?;
                in_flight.push_back((position, event_id));
                last_sent = position;
            }
        }
        tokio::select! {
            acknowledgement = acknowledgements.message() => {
                let mut next = acknowledgement?;
                loop {
                    let Some(acknowledgement) = next else {
                        anyhow::bail!("the notifier closed the stream");
                    };
                    let Some((position, event_id)) = in_flight.pop_front() else {
                        anyhow::bail!("acknowledgement for {} with nothing in flight", acknowledgement.event_id);
                    };
                    if event_id != acknowledgement.event_id {
                        anyhow::bail!("acknowledgement out of order: expected {event_id}, got {}", acknowledgement.event_id);
                    }
                    acknowledged = position;
                    match message_now(&mut acknowledgements).await {
                        Some(more) => next = more?,
                        None => break,
                    }
                }
            }
            _ = write_cursor.tick(), if acknowledged > written => {
                store.advance_cursor(NOTIFIER_CURSOR, acknowledged).await?;
                written = acknowledged;
            }
            () = &mut woken, if in_flight.len() < MAX_IN_FLIGHT => tokio::time::sleep_until(last_read + LINGER).await,
            _ = poll.tick(), if in_flight.len() < MAX_IN_FLIGHT => {}
            _ = lead_check.tick() => {
                if !store.leads().await? {
                    tracing::info!("another replica streams the log to the notifier now");
                    if acknowledged > written {
                        store.advance_cursor(NOTIFIER_CURSOR, acknowledged).await?;
                    }
                    return Ok(());
                }
            }
        }
    }
}

/// Sets the `muster_execution_outbox_events` gauge every second: the events
/// of the log past the notifier's stored cursor, that is not yet delivered
/// (or delivered within the last 100 ms). It grows while the notifier is out
/// of reach. Runs until the task is cancelled.
pub(crate) async fn measure_outbox(store: Arc<dyn Store>) {
    let mut every = tokio::time::interval(Duration::from_secs(1));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        if let (Ok(end), Ok(cursor)) = (store.log_end().await, store.cursor(NOTIFIER_CURSOR).await) {
            muster_runtime::metrics::set(
                "muster_execution_outbox_events",
                "Events of the log the notifier has not acknowledged yet",
                &[],
                (end - cursor).max(0) as f64,
            );
        }
    }
}

/// The next message if one is already waiting, without waiting for it.
async fn message_now(
    stream: &mut tonic::Streaming<muster_proto::notifier::v1::IngestEventsResponse>,
) -> Option<Result<Option<muster_proto::notifier::v1::IngestEventsResponse>, tonic::Status>> {
    tokio::select! {
        biased;
        message = stream.message() => Some(message),
        () = std::future::ready(()) => None,
    }
}
