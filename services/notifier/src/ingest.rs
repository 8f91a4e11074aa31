//! The single ingest writer. Every IngestEvents stream hands its batches to
//! one task, which merges whatever is queued (group commit; when the batch is
//! not full it waits up to the linger, a few milliseconds, for more) and, per
//! merged batch: stores it in one transaction, offers the new notifications
//! to live subscribers, appends the NDJSON lines (one write and fsync per
//! file), records that, and only then answers each stream. The next batch
//! is stored while the previous one's lines are appended.
//!
//! One writer keeps cursors increasing in commit order and the appends in
//! that order, so the memory files have at most two unconfirmed batches (see
//! [`crate::files`]). Several
//! replicas on one PostgreSQL take turns, a whole batch each
//! ([`Store::writer_turn`]): a turn first rewrites the lines a replica that
//! died mid-batch left unwritten, and the live subscribers are offered the
//! batch through [`crate::follow`], after what other replicas stored before it.

use std::{collections::HashSet, sync::Arc, time::Duration};

use muster_proto::common::v1::StepEvent;
use prost::Message as _;
use tokio::sync::{mpsc, oneshot, watch};

use crate::{
    Error, Result,
    domain::{
        Event, Reason,
        memory::{is_safe_agent_directory, ndjson_line, output_summary, relative_file_path, utc_day},
        recipients,
    },
    files::{MemoryFiles, group_by_file},
    follow::Follower,
    hub::{Hub, LiveNotification},
    store::{IngestOutcome, MemoryProgress, MemoryState, NewEvent, NewRecipient, Store, WriterTurn},
};

/// Most events merged into one transaction.
pub(crate) const MAX_BATCH_EVENTS: usize = 2048;

/// An event as received: the wire form (stored and re-sent as is) and the
/// validated domain view.
pub(crate) struct Incoming {
    pub(crate) wire: Arc<StepEvent>,
    pub(crate) event: Event,
}

/// Per event of a job, the number of notifications created (0 for a duplicate).
pub(crate) type JobReply = Result<Vec<u32>>;

struct Job {
    events: Vec<Incoming>,
    reply: oneshot::Sender<JobReply>,
}

/// A deliberate crash for the crash-consistency tests, chosen with the
/// environment variable `MUSTER_NOTIFIER_FAILPOINT` (never set in production):
/// the process aborts, like a kill -9, at that point of the first batch that
/// creates notifications.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failpoint {
    /// After the commit, before any line is appended.
    AfterCommit,
    /// After writing half of the first file's lines.
    TornAppend,
}

impl Failpoint {
    fn from_environment() -> Option<Self> {
        match std::env::var("MUSTER_NOTIFIER_FAILPOINT").ok()?.as_str() {
            "after-commit" => Some(Self::AfterCommit),
            "torn-append" => Some(Self::TornAppend),
            other => {
                tracing::warn!(failpoint = other, "unknown failpoint ignored");
                None
            }
        }
    }
}

/// Settings of the writer.
#[derive(Debug, Clone)]
pub(crate) struct IngestSettings {
    pub(crate) output_summary_chars: usize,
    /// `None` when memory files are turned off.
    pub(crate) memory: Option<MemoryFiles>,
    /// On a database replicas share: how far the live subscribers were
    /// offered the inbox ([`crate::follow`]).
    pub(crate) follower: Option<Arc<Follower>>,
    /// How long to wait for more events before writing a batch that is not full.
    pub(crate) linger: Duration,
}

/// The handle streams submit batches through.
#[derive(Clone)]
pub(crate) struct Ingestor {
    sender: mpsc::Sender<Job>,
}

impl Ingestor {
    /// Starts the writer; it waits until `ready` turns true (migrations and
    /// memory recovery done) before storing anything.
    pub(crate) fn spawn<S: Store>(
        store: Arc<S>,
        hub: Arc<Hub>,
        settings: IngestSettings,
        mut ready: watch::Receiver<bool>,
    ) -> Self {
        let (sender, mut receiver) = mpsc::channel::<Job>(64);
        tokio::spawn(async move {
            if ready.wait_for(|ready| *ready).await.is_err() {
                return;
            }
            let linger = settings.linger;
            let writer = Arc::new(Writer { store, hub, settings, failpoint: Failpoint::from_environment() });
            let mut appending = None;
            while let Some(job) = receiver.recv().await {
                let written_by = tokio::time::Instant::now() + linger;
                let mut jobs = vec![job];
                let mut queued = jobs[0].events.len();
                while queued < MAX_BATCH_EVENTS {
                    let job = match receiver.try_recv() {
                        Ok(job) => job,
                        Err(mpsc::error::TryRecvError::Empty) if !linger.is_zero() => {
                            match tokio::time::timeout_at(written_by, receiver.recv()).await {
                                Ok(Some(job)) => job,
                                _ => break,
                            }
                        }
                        Err(_) => break,
                    };
                    queued += job.events.len();
                    jobs.push(job);
                }
                appending = writer.process(jobs, appending).await;
            }
            if let Some(appending) = appending {
                appending.finish().await;
            }
        });
        Self { sender }
    }

    /// Queues a batch; the answer arrives once it is stored and written.
    pub(crate) async fn submit(&self, events: Vec<Incoming>) -> Result<oneshot::Receiver<JobReply>> {
        let (reply, answer) = oneshot::channel();
        self.sender.send(Job { events, reply }).await.map_err(|_| Error::ShuttingDown)?;
        Ok(answer)
    }
}

/// The span of an event that carries its execution's trace context: it
/// covers the batch that stores and delivers the event, in that trace.
fn traced_event_span(event: &StepEvent) -> Option<tracing::Span> {
    if event.trace_parent.is_empty() {
        return None;
    }
    let span = tracing::info_span!(
        parent: None,
        "notify",
        event_id = %event.event_id,
        execution_id = %event.execution_id,
        step_id = %event.step_id,
        sequence = event.sequence,
    );
    muster_runtime::telemetry::continue_from(&span, &event.trace_parent);
    Some(span)
}

/// Answers every stream of a batch that could not be stored: the store is
/// unavailable, and the events are to be sent again.
fn refuse(jobs: Vec<Job>, error: &Error) {
    let message = error.to_string();
    for job in jobs {
        let _ = job.reply.send(Err(Error::StoreUnavailable(message.clone())));
    }
}

struct Writer<S> {
    store: Arc<S>,
    hub: Arc<Hub>,
    settings: IngestSettings,
    failpoint: Option<Failpoint>,
}

/// A batch stored in the inbox, its memory lines not yet written.
struct Stored {
    new_events: Vec<NewEvent>,
    outcomes: Vec<IngestOutcome>,
    /// The spans of its events that carry a trace: open until the batch is done.
    _spans: Vec<tracing::Span>,
}

impl Stored {
    /// The memory files its lines go to.
    fn memory_files(&self) -> HashSet<String> {
        self.new_events
            .iter()
            .zip(&self.outcomes)
            .filter(|(_, outcome)| matches!(outcome, IngestOutcome::Stored { .. }))
            .flat_map(|(event, _)| event.recipients.iter().filter_map(|recipient| recipient.memory_path.clone()))
            .collect()
    }
}

/// A stored batch whose memory lines are being written; its streams are
/// answered once they are.
struct Appending {
    /// The memory files it appends to.
    files: HashSet<String>,
    done: tokio::task::JoinHandle<()>,
}

impl Appending {
    async fn finish(self) {
        if let Err(error) = self.done.await {
            // Its lines stay pending, rewritten at start; its streams send again.
            tracing::error!(%error, "memory append task failed");
        }
    }
}

impl<S: Store> Writer<S> {
    /// Stores a batch, offers it to the live subscribers, writes its memory
    /// lines and answers its streams.
    ///
    /// Alone on its database, the writer stores a batch while the previous
    /// one's lines are still being appended (its answer waits for them):
    /// the appends stay one after the other, in cursor order, and a file the
    /// previous batch appends to keeps the length recorded before that
    /// append, so a crash cuts it back to there and rewrites both batches'
    /// lines (see [`crate::files`]). Replicas sharing a database take turns
    /// a whole batch each, lines included.
    async fn process(self: &Arc<Self>, jobs: Vec<Job>, previous: Option<Appending>) -> Option<Appending> {
        if self.store.shared() {
            if let Some(previous) = previous {
                previous.finish().await;
            }
            let turn = match self.take_turn().await {
                Ok(turn) => turn,
                Err(error) => {
                    tracing::error!(%error, "taking the turn to write failed");
                    refuse(jobs, &error);
                    return None;
                }
            };
            match self.store_batch(&jobs, &HashSet::new()).await {
                Ok(stored) => self.finish(jobs, stored).await,
                Err(error) => refuse(jobs, &error),
            }
            if let Err(error) = turn.end().await {
                tracing::warn!(%error, "ending the turn to write failed (it ends with its connection)");
            }
            return None;
        }
        let in_flight = previous.as_ref().map(|previous| &previous.files);
        let stored = self.store_batch(&jobs, in_flight.unwrap_or(&HashSet::new())).await;
        if let Some(previous) = previous {
            previous.finish().await;
        }
        match stored {
            Ok(stored) => {
                let files = stored.memory_files();
                let writer = Arc::clone(self);
                Some(Appending { files, done: tokio::spawn(async move { writer.finish(jobs, stored).await }) })
            }
            Err(error) => {
                refuse(jobs, &error);
                None
            }
        }
    }

    /// Waits for this replica's turn; once it has it, rewrites what a
    /// replica that died during its turn left unwritten.
    async fn take_turn(&self) -> Result<WriterTurn> {
        let turn = self.store.writer_turn().await?;
        if self.store.shared()
            && let Some(files) = &self.settings.memory
        {
            crate::files::recover(self.store.as_ref(), files).await?;
        }
        Ok(turn)
    }

    /// Stores a batch and offers it to the live subscribers (with replicas,
    /// through [`crate::follow`]). The files in `in_flight` are being
    /// appended to: their recorded lengths stay.
    async fn store_batch(&self, jobs: &[Job], in_flight: &HashSet<String>) -> Result<Stored> {
        let received_at = muster_runtime::time::now_millis();
        let incoming = jobs.iter().flat_map(|job| job.events.iter());
        let spans: Vec<tracing::Span> = incoming.clone().filter_map(|item| traced_event_span(&item.wire)).collect();
        let new_events: Vec<NewEvent> = incoming.map(|item| self.prepare(item, received_at)).collect();

        let mut memory_paths: Vec<String> = new_events
            .iter()
            .flat_map(|event| event.recipients.iter().filter_map(|recipient| recipient.memory_path.clone()))
            .filter(|path| !in_flight.contains(path))
            .collect();
        memory_paths.sort();
        memory_paths.dedup();
        let lengths = match &self.settings.memory {
            Some(files) if !memory_paths.is_empty() => {
                let files = files.clone();
                tokio::task::spawn_blocking(move || files.lengths(memory_paths)).await.unwrap_or_default()
            }
            _ => Vec::new(),
        };

        let outcomes = self.store.ingest(&new_events, &lengths).await.inspect_err(|error| {
            tracing::error!(%error, events = new_events.len(), "storing events failed");
        })?;

        // Live delivery, in cursor order.
        match &self.settings.follower {
            None => self.publish(&new_events, &outcomes, received_at, 0),
            Some(follower) => {
                let cursors = new_events.iter().zip(&outcomes).filter_map(|(event, outcome)| match outcome {
                    IngestOutcome::Stored { first_cursor } if !event.recipients.is_empty() => {
                        Some((*first_cursor, first_cursor + event.recipients.len() as u64 - 1))
                    }
                    _ => None,
                });
                if let Some((first, last)) = cursors.reduce(|(first, last), (from, to)| (first.min(from), last.max(to)))
                {
                    follower
                        .offer_own(self.store.as_ref(), &self.hub, first, last, |after| {
                            self.publish(&new_events, &outcomes, received_at, after)
                        })
                        .await;
                }
            }
        }
        Ok(Stored { new_events, outcomes, _spans: spans })
    }

    /// Writes a stored batch's memory lines and answers its streams.
    async fn finish(&self, jobs: Vec<Job>, stored: Stored) {
        let Stored { new_events, outcomes, _spans } = stored;
        let incoming: Vec<&Incoming> = jobs.iter().flat_map(|job| job.events.iter()).collect();
        self.write_memory(&incoming, &new_events, &outcomes).await;

        let mut counts = new_events.iter().zip(&outcomes).map(|(event, outcome)| match outcome {
            IngestOutcome::Stored { .. } => event.recipients.len() as u32,
            IngestOutcome::Duplicate => 0,
        });
        let (stored, duplicates) = outcomes.iter().fold((0, 0), |(stored, duplicates), outcome| match outcome {
            IngestOutcome::Stored { .. } => (stored + 1, duplicates),
            IngestOutcome::Duplicate => (stored, duplicates + 1),
        });
        let notifications: u64 = counts.clone().map(u64::from).sum();
        muster_runtime::metrics::count("muster_events_ingested_total", "Events stored", &[], stored);
        muster_runtime::metrics::count(
            "muster_events_duplicate_total",
            "Resent events recognised and skipped",
            &[],
            duplicates,
        );
        muster_runtime::metrics::count(
            "muster_notifications_total",
            "Notifications stored in agents' inboxes",
            &[],
            notifications,
        );
        for job in jobs {
            let job_counts: Vec<u32> = counts.by_ref().take(job.events.len()).collect();
            let _ = job.reply.send(Ok(job_counts));
        }
    }

    /// Offers a stored batch's notifications with a cursor above `after` to
    /// the live subscribers, in cursor order.
    fn publish(&self, new_events: &[NewEvent], outcomes: &[IngestOutcome], received_at: i64, after: u64) {
        let mut deliveries: Vec<(&str, usize, u64, Reason)> = Vec::new();
        let mut summaries: Vec<Arc<str>> = Vec::with_capacity(new_events.len());
        for (index, (event, outcome)) in new_events.iter().zip(outcomes).enumerate() {
            summaries.push(Arc::from(event.output_summary.as_str()));
            if let IngestOutcome::Stored { first_cursor } = outcome {
                for (offset, recipient) in event.recipients.iter().enumerate() {
                    let cursor = first_cursor + offset as u64;
                    if cursor > after {
                        deliveries.push((recipient.agent_id.as_str(), index, cursor, recipient.reason));
                    }
                }
            }
        }
        let agents: Vec<&str> = deliveries.iter().map(|(agent, ..)| *agent).collect();
        self.hub.publish(&agents, |delivery| {
            let (agent_id, index, cursor, reason) = deliveries[delivery];
            LiveNotification {
                cursor,
                agent_id: Arc::from(agent_id),
                reason,
                event: new_events[index].encoded.clone(),
                output_summary: Arc::clone(&summaries[index]),
                created_at: received_at,
            }
        });
    }

    fn prepare(&self, item: &Incoming, received_at: i64) -> NewEvent {
        let event = &item.event;
        let day = self.settings.memory.as_ref().map(|_| utc_day(event.occurred_at));
        let recipients = recipients(event)
            .into_iter()
            .map(|(agent_id, reason)| {
                let (memory, memory_path) = match &day {
                    None => (MemoryState::Disabled, None),
                    Some(day) if is_safe_agent_directory(&agent_id) => {
                        (MemoryState::Pending, Some(relative_file_path(&agent_id, day)))
                    }
                    Some(_) => {
                        tracing::warn!(agent_id = %agent_id.escape_debug(), event_id = %event.event_id,
                            "agent id cannot name a memory directory; notification stored without a memory line");
                        (MemoryState::Refused, None)
                    }
                };
                NewRecipient { agent_id, reason, memory, memory_path }
            })
            .collect();
        NewEvent {
            event_id: event.event_id.clone(),
            encoded: item.wire.encode_to_vec().into(),
            output_summary: output_summary(event, self.settings.output_summary_chars),
            received_at,
            recipients,
        }
    }

    async fn write_memory(&self, incoming: &[&Incoming], new_events: &[NewEvent], outcomes: &[IngestOutcome]) {
        let Some(files) = &self.settings.memory else { return };
        let mut progress = MemoryProgress::default();
        // The line says nothing about the agent: one per event serves all.
        let event_lines: Vec<Option<String>> = incoming
            .iter()
            .zip(new_events)
            .zip(outcomes)
            .map(|((item, event), outcome)| {
                let wanted = matches!(outcome, IngestOutcome::Stored { .. })
                    && event.recipients.iter().any(|recipient| recipient.memory_path.is_some());
                wanted.then(|| ndjson_line(&item.event, &event.output_summary))
            })
            .collect();
        let mut lines = Vec::new();
        for ((event, outcome), line) in new_events.iter().zip(outcomes).zip(&event_lines) {
            let IngestOutcome::Stored { first_cursor } = outcome else { continue };
            for (offset, recipient) in event.recipients.iter().enumerate() {
                let cursor = first_cursor + offset as u64;
                progress.written_through = progress.written_through.max(cursor);
                if let (Some(path), Some(line)) = (&recipient.memory_path, line) {
                    lines.push((path.as_str(), cursor, line.as_str()));
                }
            }
        }
        if progress.written_through == 0 {
            return;
        }
        let appends = group_by_file(lines);
        match (self.failpoint, appends.first()) {
            (Some(Failpoint::AfterCommit), _) => {
                tracing::error!("failpoint after-commit: aborting");
                std::process::abort();
            }
            (Some(Failpoint::TornAppend), Some(first)) => {
                tracing::error!("failpoint torn-append: aborting");
                files.append_torn(first);
                std::process::abort();
            }
            _ => {}
        }
        let files = files.clone();
        (progress.failed, progress.lengths) =
            match tokio::task::spawn_blocking(move || files.append_all(&appends)).await {
                Ok(appended) => (appended.failed, appended.lengths),
                Err(error) => {
                    // The append task panicked: leave the batch pending, rewritten at start.
                    tracing::error!(%error, "memory append task failed");
                    return;
                }
            };
        // The mark and the lengths after must be recorded before the next
        // batch appends, or a restart would cut back to this batch's lengths
        // and rewrite only the next batch's lines.
        let mut delay = Duration::from_millis(50);
        while let Err(error) = self.store.record_memory_progress(&progress).await {
            tracing::error!(%error, retry_in_ms = delay.as_millis() as u64, "recording memory progress failed");
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(5));
        }
    }
}
