//! The durable inbox: accepted events (deduplicated by id), one notification
//! per recipient agent with its cursor, acknowledgements, and the bookkeeping
//! that makes the NDJSON memory exactly-once. [`Store`] is the repository
//! trait; [`SqlStore`] implements it on SQLite and PostgreSQL.

mod sql;

use std::future::Future;

use bytes::Bytes;

pub use sql::{SqlStore, WriterTurn};

use crate::{Result, domain::Reason};

/// Where a notification's NDJSON line stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryState {
    /// To be appended after the commit.
    Pending,
    /// Appended (recorded for lines recovered after a failure).
    Written,
    /// The agent id cannot name a directory under the memory root: no line.
    Refused,
    /// Memory files are turned off: no line.
    Disabled,
    /// The append failed; retried when the notifier starts.
    Failed,
}

impl MemoryState {
    pub(crate) fn to_i64(self) -> i64 {
        match self {
            Self::Pending => 0,
            Self::Written => 1,
            Self::Refused => 2,
            Self::Disabled => 3,
            Self::Failed => 4,
        }
    }

    pub(crate) fn from_i64(value: i64) -> Option<Self> {
        Some(match value {
            0 => Self::Pending,
            1 => Self::Written,
            2 => Self::Refused,
            3 => Self::Disabled,
            4 => Self::Failed,
            _ => return None,
        })
    }
}

/// One recipient of a new event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewRecipient {
    /// The agent.
    pub agent_id: String,
    /// Its strongest reason.
    pub reason: Reason,
    /// Whether a memory line is to be written.
    pub memory: MemoryState,
    /// The memory file, relative to the memory root, when a line is pending.
    pub memory_path: Option<String>,
}

/// An event to store with its recipients.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    /// The event's id, the deduplication key.
    pub event_id: String,
    /// The encoded wire event, returned as is to readers.
    pub encoded: Bytes,
    /// The summary shown in notifications and memory lines.
    pub output_summary: String,
    /// When the notifier accepted it, ms since the epoch.
    pub received_at: i64,
    /// Who hears of it.
    pub recipients: Vec<NewRecipient>,
}

/// What storing one event did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IngestOutcome {
    /// The event was stored before (or earlier in the same batch): nothing new.
    Duplicate,
    /// Stored; its recipients got the cursors `first_cursor..first_cursor + n`,
    /// in the order given.
    Stored {
        /// The cursor of the first recipient's notification.
        first_cursor: u64,
    },
}

/// A notification read back from the inbox.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredNotification {
    /// Position in the agent's inbox (global and increasing).
    pub cursor: u64,
    /// The agent.
    pub agent_id: String,
    /// Why it hears of the event.
    pub reason: Reason,
    /// The event's id.
    pub event_id: String,
    /// The encoded wire event.
    pub encoded: Bytes,
    /// The summary.
    pub output_summary: String,
    /// When the notifier accepted the event, ms since the epoch.
    pub created_at: i64,
    /// Where its memory line stands.
    pub memory: MemoryState,
}

/// What the memory writer records after appending a batch of lines.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryProgress {
    /// Every pending notification up to this cursor has its line, except the
    /// `failed` ones.
    pub written_through: u64,
    /// Notifications whose append failed, to be retried at start.
    pub failed: Vec<u64>,
    /// Previously failed notifications whose lines are now written.
    pub recovered: Vec<u64>,
    /// The length of each file appended to without a failure, after the
    /// append: where the next batch's lines begin.
    pub lengths: Vec<(String, u64)>,
}

/// The repository of the notifier.
pub trait Store: Send + Sync + 'static {
    /// Stores a batch of events in one transaction: events already stored, or
    /// repeated within the batch, are duplicates and create nothing. For every
    /// memory file that receives a pending line, `memory_file_lengths` gives
    /// its length before the append, recorded in the same transaction, or
    /// `None` when it is unknown (the recorded length is forgotten). A file
    /// it leaves out keeps the length recorded for it: the length before the
    /// append of an earlier batch still unconfirmed.
    fn ingest(
        &self,
        events: &[NewEvent],
        memory_file_lengths: &[(String, Option<u64>)],
    ) -> impl Future<Output = Result<Vec<IngestOutcome>>> + Send;

    /// An agent's notifications with a cursor above `after_cursor`, in cursor
    /// order, at most `limit`.
    fn list(
        &self,
        agent_id: &str,
        after_cursor: u64,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<StoredNotification>>> + Send;

    /// The cursor of an agent's newest notification (0 when it has none).
    fn newest_cursor(&self, agent_id: &str) -> impl Future<Output = Result<u64>> + Send;

    /// The cursor an agent acknowledged last (0 when never).
    fn acknowledged_cursor(&self, agent_id: &str) -> impl Future<Output = Result<u64>> + Send;

    /// Records that an agent has read up to `cursor`; a lower value than the
    /// stored one changes nothing. Returns the acknowledged cursor after.
    fn acknowledge(&self, agent_id: &str, cursor: u64) -> impl Future<Output = Result<u64>> + Send;

    /// Records the outcome of appending memory lines.
    fn record_memory_progress(&self, progress: &MemoryProgress) -> impl Future<Output = Result<()>> + Send;

    /// Notifications whose memory line may be missing: pending ones above the
    /// written-through mark and failed ones, with a cursor above
    /// `after_cursor`, in cursor order, at most `limit`.
    fn unwritten_memory(
        &self,
        after_cursor: u64,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<StoredNotification>>> + Send;

    /// The recorded length of a memory file before its latest append.
    fn memory_file_length(&self, path: &str) -> impl Future<Output = Result<Option<u64>>> + Send;

    /// Whether other processes (replicas) may write the same database: on
    /// PostgreSQL. They then take turns with [`Store::writer_turn`], and each
    /// learns of the others' notifications with [`Store::list_all`].
    fn shared(&self) -> bool;

    /// Waits for this process's turn to write (store a batch, append its
    /// memory lines and record that); the turn lasts until the guard ends
    /// or is dropped, or the process dies. Nothing to wait for unless
    /// [`Store::shared`].
    fn writer_turn(&self) -> impl Future<Output = Result<WriterTurn>> + Send;

    /// Every agent's notifications with a cursor above `after_cursor`, in
    /// cursor order, at most `limit`.
    fn list_all(&self, after_cursor: u64, limit: u32) -> impl Future<Output = Result<Vec<StoredNotification>>> + Send;

    /// The cursor of the newest notification of any agent (0 when none).
    fn newest_cursor_of_all(&self) -> impl Future<Output = Result<u64>> + Send;
}
