//! Durable state of the execution service, behind the [`Store`] trait:
//! process versions, executions and their steps, the event log, session
//! assignments and the permission matrix. [`SqlStore`] implements it on
//! SQLite and PostgreSQL; `tests/store_conformance/` holds both to the
//! same behaviour.
//!
//! Every change of an execution is written with its events in one
//! transaction ([`Store::commit`]), so the log never misses an event and
//! never holds one for a change that did not happen. Commits from every
//! execution are grouped: what arrives while a transaction runs goes into
//! the next one.

mod sql;

use std::{future::Future, pin::Pin, sync::Arc, time::Duration};

pub use sql::SqlStore;

use crate::{
    Result,
    domain::{
        ExecutionStatus,
        authority::{Matrix, RoleAssignment, SubtaskRequest},
        budget::{Budget, Usage},
        inbox::{InboxMessage, MessageState},
        memory::MemoryEntry,
        model::{Event, Execution, ProcessVersion, Step, Warnings},
        schedule::ScheduleState,
    },
};

/// A boxed future, so the trait can be used as `dyn Store`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A version to publish.
#[derive(Debug, Clone)]
pub struct NewProcess {
    pub name: String,
    pub source: String,
    pub content_hash: String,
    pub published_at: i64,
    pub warnings: Warnings,
    pub definition: Arc<muster_format::ProcessDefinition>,
}

impl NewProcess {
    /// The schedule it declares, due first after it is published.
    pub fn schedule(&self) -> Option<ScheduleState> {
        let triggers = self.definition.triggers.as_ref()?;
        let cron = triggers.schedule.clone()?;
        let schedule = muster_format::Schedule::parse(&cron, &triggers.time_zone).ok()?;
        Some(ScheduleState {
            process_name: self.name.clone(),
            cron,
            time_zone: triggers.time_zone.clone(),
            missed: triggers.missed,
            next_fire_at: schedule.next_after(self.published_at)?,
            last_fired_at: None,
            last_execution_id: String::new(),
        })
    }
}

/// What publishing did.
#[derive(Debug, Clone)]
pub enum Published {
    /// A new version.
    New(ProcessVersion),
    /// The latest version has the same source: it is returned, nothing is stored.
    Unchanged(ProcessVersion),
}

/// One step's state to write.
#[derive(Debug, Clone, PartialEq)]
pub struct StepWrite {
    pub execution_id: String,
    pub position: u32,
    pub step_id: String,
    pub step: Step,
}

/// One change, written with the others of its commit in one transaction.
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    /// A new execution (its steps follow as [`Write::Steps`]).
    CreateExecution(Execution),
    /// An execution's row: status, reason, lead, end, event count.
    UpdateExecution(Execution),
    /// Steps' states, created or replaced.
    Steps(Vec<StepWrite>),
    /// A session assignment, created or replaced.
    Assignment { execution_id: String, assignment: RoleAssignment },
    /// A session's subtask request, created or replaced (decided).
    Subtask { execution_id: String, subtask: SubtaskRequest },
    /// Events, appended to the log.
    Events(Vec<Event>),
    /// A new run takes these unprocessed inbox messages. When one of them
    /// is no longer unprocessed and unclaimed (another run, of another
    /// replica, took it first), the whole commit fails with
    /// [`crate::Error::Superseded`]: the run is not created. (An execution
    /// that ends settles the messages it took: processed when it
    /// completed, given back with a note otherwise.)
    ClaimMessages { execution_id: String, message_ids: Vec<String> },
    /// Messages posted by completed steps.
    PostMessages(Vec<InboxMessage>),
    /// Memory entries: from completed steps, or an operator.
    Remember(Vec<MemoryEntry>),
    /// A schedule fired for its due time `due` with the execution created in
    /// the same commit, and moves on to `next`. When the schedule is no
    /// longer due at `due` (another replica fired it), the whole commit
    /// fails with [`crate::Error::Superseded`].
    FireSchedule { process_name: String, due: i64, next: i64, execution_id: String, fired_at: i64 },
}

/// Filters of `inbox_messages`; they combine with AND.
#[derive(Debug, Clone, Default)]
pub struct InboxFilter {
    pub inbox: String,
    /// Only this state; `None` means every state but archived.
    pub state: Option<MessageState>,
    /// Only messages no run has.
    pub unclaimed: bool,
    /// Only messages listed after this one (post time and id), for the next page.
    pub after: Option<(i64, String)>,
    pub limit: u32,
}

/// What archiving a message did.
#[derive(Debug, Clone, PartialEq)]
pub enum Archived {
    Done(InboxMessage),
    /// A run has it: it cannot be archived now.
    Claimed(InboxMessage),
    NotFound,
}

/// Filters of `list_executions`; they combine with AND.
#[derive(Debug, Clone, Default)]
pub struct ExecutionFilter {
    pub process_name: Option<String>,
    pub status: Option<ExecutionStatus>,
    pub started_after: Option<i64>,
    pub started_before: Option<i64>,
    /// Only executions this agent takes part in: its lead, a participant of
    /// its session, the executor of a step, or named in a step of its
    /// process version (the rule of one execution in `grpc/access.rs`).
    pub agent_id: Option<String>,
    /// Only executions listed after this one (start time and id), for the next page.
    pub after: Option<(i64, String)>,
    pub limit: u32,
}

/// Held while a run of a process is checked against its budget, its
/// throttle and its agents' budgets and created, so that the replicas on
/// one database admit the runs under one limit one at a time: on
/// PostgreSQL, a transaction holding an advisory lock per limit (the
/// process, each agent), released when this is dropped.
pub struct AdmissionLock {
    _transaction: sqlx::Transaction<'static, sqlx::Any>,
}

impl AdmissionLock {
    /// Holds `transaction` open until dropped.
    pub fn new(transaction: sqlx::Transaction<'static, sqlx::Any>) -> Self {
        Self { _transaction: transaction }
    }
}

/// A process's executions as a throttle sees them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Activity {
    /// Executions that have not ended.
    pub underway: u64,
    /// When the latest one started.
    pub last_started_at: Option<i64>,
}

/// An event of the log: its position and its stored (wire) encoding.
pub type LogEntry = (i64, Vec<u8>);

/// The name of the notifier's cursor in the event log.
pub const NOTIFIER_CURSOR: &str = "notifier";

/// Separates a replica's stable identity from its incarnation in its name
/// (`execution-0@1a2b3c4d`): [`Store::join`] replaces the previous
/// incarnations of the identity.
pub const INCARNATION: char = '@';

/// A replica of the execution service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replica {
    pub id: String,
    /// Where the others reach it (empty: they cannot).
    pub url: String,
    /// The address to connect to for `url` when its host names a Service
    /// rather than this replica (empty: where the host leads).
    pub address: String,
}

/// The execution service's repository.
pub trait Store: Send + Sync + 'static {
    /// Creates or upgrades the schema.
    fn migrate(&self) -> BoxFuture<'_, Result<()>>;

    /// Stores a new version of a process, unless its latest version has the
    /// same source.
    fn publish_process(&self, process: NewProcess) -> BoxFuture<'_, Result<Published>>;
    /// One version of a process.
    fn process<'a>(&'a self, name: &'a str, version: u32) -> BoxFuture<'a, Result<Option<ProcessVersion>>>;
    /// The number of a process's latest version, without reading the version.
    fn latest_version<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<u32>>>;
    /// The latest version of each process named after `after_name`, by name.
    fn list_processes<'a>(&'a self, after_name: &'a str, limit: u32) -> BoxFuture<'a, Result<Vec<ProcessVersion>>>;

    /// Writes the changes in one transaction: all or none.
    fn commit(&self, writes: Vec<Write>) -> BoxFuture<'_, Result<()>>;

    /// An execution (with its session's assignments, without its steps).
    fn execution<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Execution>>>;
    /// An execution's steps, in definition order, with their ids.
    fn steps<'a>(&'a self, execution_id: &'a str) -> BoxFuture<'a, Result<Vec<(String, Step)>>>;
    /// Whether `agent_id` executes (or executed) a step of the execution.
    fn executes_a_step<'a>(&'a self, execution_id: &'a str, agent_id: &'a str) -> BoxFuture<'a, Result<bool>>;
    /// A step's output; `None` when the step has none (yet), or no such step is stored.
    fn step_output<'a>(&'a self, execution_id: &'a str, step_id: &'a str) -> BoxFuture<'a, Result<Option<String>>>;
    /// The execution started with this idempotency key.
    fn find_by_idempotency_key<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<String>>>;
    /// Stores a posted message; when one with its id is stored already (a
    /// retried post with the same idempotency key), stores nothing and
    /// returns that one.
    fn post_message(&self, message: InboxMessage) -> BoxFuture<'_, Result<Option<InboxMessage>>>;
    /// An inbox's messages, oldest first.
    fn inbox_messages<'a>(&'a self, filter: &'a InboxFilter) -> BoxFuture<'a, Result<Vec<InboxMessage>>>;
    /// Archives a message, unless a run has it.
    fn archive_message<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Archived>>;
    /// Notes why unclaimed messages are still unprocessed.
    fn note_messages<'a>(&'a self, ids: &'a [String], note: &'a str) -> BoxFuture<'a, Result<()>>;
    /// Whether a run has messages of the inbox now.
    fn inbox_busy<'a>(&'a self, inbox: &'a str) -> BoxFuture<'a, Result<bool>>;
    /// The process whose latest version an inbox triggers.
    fn triggered_by<'a>(&'a self, inbox: &'a str) -> BoxFuture<'a, Result<Option<String>>>;
    /// Every inbox that triggers a process.
    fn trigger_inboxes(&self) -> BoxFuture<'_, Result<Vec<String>>>;
    /// Every agent's budget (keys `agent:<id>`), by key.
    fn agent_budgets(&self) -> BoxFuture<'_, Result<Vec<Budget>>>;
    /// What the steps an agent started at or after `since` used: their
    /// number, cost and tokens.
    fn agent_usage<'a>(&'a self, agent_id: &'a str, since: i64) -> BoxFuture<'a, Result<Usage>>;
    /// The budget an operator set on a process (or, keyed `agent:<id>`, on an agent).
    fn budget<'a>(&'a self, process_name: &'a str) -> BoxFuture<'a, Result<Option<Budget>>>;
    /// Sets an operator's budget on a process (`set_by` names the operator),
    /// or removes it when every limit is 0.
    fn put_budget<'a>(&'a self, budget: &'a Budget, set_by: &'a str) -> BoxFuture<'a, Result<()>>;
    /// Executions without their steps, newest first.
    fn list_executions<'a>(&'a self, filter: &'a ExecutionFilter) -> BoxFuture<'a, Result<Vec<Execution>>>;

    /// Joins the replicas of the execution service on this database, as
    /// `replica` reached at `url`, with a lease of `lease` on the executions
    /// it will drive. From then on, new executions are this replica's, and
    /// every commit fails with [`crate::Error::Superseded`] once the lease
    /// has lapsed. A replica named `IDENTITY@...` (see [`INCARNATION`])
    /// replaces the previous incarnations of its identity at once: their
    /// executions are given back (the next [`Store::adopt`] takes them), and
    /// they leave the replicas, so that one still alive can no longer write.
    fn join<'a>(&'a self, replica: &'a Replica, lease: Duration) -> BoxFuture<'a, Result<()>>;
    /// Extends the lease to `lease` from now; false when it had lapsed
    /// (another replica may have taken the executions over: the replica must
    /// stop driving them).
    fn renew(&self, lease: Duration) -> BoxFuture<'_, Result<bool>>;
    /// Takes over the unfinished executions that no replica with a live
    /// lease drives (those of replicas whose lease lapsed, which leave the
    /// replicas, and those given back); their ids, oldest first. Nothing
    /// while this replica's own lease has lapsed.
    fn adopt(&self) -> BoxFuture<'_, Result<Vec<String>>>;
    /// Gives this replica's unfinished executions back, for the others to
    /// take over at once, and leaves the replicas.
    fn leave(&self) -> BoxFuture<'_, Result<()>>;
    /// The live replica that drives an unfinished execution, if any.
    fn driver_of<'a>(&'a self, execution_id: &'a str) -> BoxFuture<'a, Result<Option<Replica>>>;
    /// The other live replicas that can be reached (their URL is known), by name.
    fn peers(&self) -> BoxFuture<'_, Result<Vec<Replica>>>;
    /// Whether this replica is the eldest with a live lease: the one that
    /// does the work done once for all (streaming the log to the notifier).
    fn leads(&self) -> BoxFuture<'_, Result<bool>>;

    /// The sequence of an execution's last event (0 for none).
    fn last_event_sequence<'a>(&'a self, execution_id: &'a str) -> BoxFuture<'a, Result<u64>>;
    /// An execution's events after a sequence, in order, at most `limit`,
    /// each in its stored (wire) encoding.
    fn events_after<'a>(
        &'a self,
        execution_id: &'a str,
        after_sequence: u64,
        limit: u32,
    ) -> BoxFuture<'a, Result<Vec<Vec<u8>>>>;
    /// The log after a position, in commit order: (position, encoded event).
    fn log_after(&self, after_position: i64, limit: u32) -> BoxFuture<'_, Result<Vec<LogEntry>>>;
    /// The position of the newest entry of the log (0 when it is empty).
    fn log_end(&self) -> BoxFuture<'_, Result<i64>>;
    /// A reader's position in the log (0 when it has none).
    fn cursor<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<i64>>;
    /// Moves a reader's position in the log forward (never back).
    fn advance_cursor<'a>(&'a self, name: &'a str, position: i64) -> BoxFuture<'a, Result<()>>;

    /// The newest version of the permission matrix, if any was stored.
    fn latest_matrix(&self) -> BoxFuture<'_, Result<Option<Matrix>>>;
    /// One version of the permission matrix.
    fn matrix(&self, version: u32) -> BoxFuture<'_, Result<Option<Matrix>>>;
    /// Versions below `before` (all with `None`), newest first, at most `limit`.
    fn matrices(&self, before: Option<u32>, limit: u32) -> BoxFuture<'_, Result<Vec<Matrix>>>;
    /// Stores `matrix` as the next version (its `version` is ignored) and
    /// returns it with its version.
    fn put_matrix(&self, matrix: Matrix) -> BoxFuture<'_, Result<Matrix>>;
    /// Stores `matrix` as version 1 unless a version is stored (another
    /// replica starting at the same time may have stored it); returns the
    /// newest version.
    fn first_matrix(&self, matrix: Matrix) -> BoxFuture<'_, Result<Matrix>>;

    /// Schedules due at or before `now`, the earliest first.
    fn due_schedules(&self, now: i64, limit: u32) -> BoxFuture<'_, Result<Vec<ScheduleState>>>;
    /// When the earliest schedule is due.
    fn next_due_schedule(&self) -> BoxFuture<'_, Result<Option<i64>>>;
    /// Schedules by process name, after `after`.
    fn schedules<'a>(&'a self, after: &'a str, limit: u32) -> BoxFuture<'a, Result<Vec<ScheduleState>>>;
    /// Moves a schedule due at `due` on to `next` without a run; false when
    /// it was no longer due at `due`.
    fn skip_schedule<'a>(&'a self, process_name: &'a str, due: i64, next: i64) -> BoxFuture<'a, Result<bool>>;
    /// Locks the admission of runs across replicas (see [`AdmissionLock`]),
    /// by the keys of what limits them, in the order given (every replica
    /// gives the same order): a process's name, an agent's budget key
    /// (`agent:ID`). `None` on SQLite, which one service uses alone, and
    /// for no keys.
    fn admission_lock<'a>(&'a self, keys: &'a [&'a str]) -> BoxFuture<'a, Result<Option<AdmissionLock>>>;
    /// How many executions of `process_name` are underway, and when the
    /// latest started.
    fn process_activity<'a>(&'a self, process_name: &'a str) -> BoxFuture<'a, Result<Activity>>;
    /// A memory's entries (`role` empty: the global memory), newest first,
    /// those written before `before` (time and id) when given.
    fn memory<'a>(
        &'a self,
        role: &'a str,
        before: Option<&'a (i64, String)>,
        limit: u32,
    ) -> BoxFuture<'a, Result<Vec<MemoryEntry>>>;
    /// Adds an entry to a memory; when one with its id is stored already (a
    /// retried append with the same idempotency key), adds nothing. Returns
    /// the entry stored.
    fn append_memory(&self, entry: MemoryEntry) -> BoxFuture<'_, Result<MemoryEntry>>;
    /// Removes a memory entry; whether it existed.
    fn forget_memory<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool>>;
    /// The version of the global memory and `role`'s (empty: the global
    /// memory's alone) together: it grows whenever an entry is added to or
    /// removed from either, and only then.
    fn memory_version<'a>(&'a self, role: &'a str) -> BoxFuture<'a, Result<i64>>;
    /// [`Store::memory_version`] read on the calling thread where that costs
    /// less than a wait (a SQLite file); `None` where it must be awaited.
    fn memory_version_at_hand(&self, role: &str) -> Option<Result<i64>>;
    /// What the executions of `process_name` started at or after `since` used,
    /// but `except_execution` (empty: none).
    fn process_usage<'a>(
        &'a self,
        process_name: &'a str,
        since: i64,
        except_execution: &'a str,
    ) -> BoxFuture<'a, Result<Usage>>;
}
