//! The state of an execution and its steps, the events it records, and what
//! flows between the engine and the workers — as the engine and the store
//! see them. Their wire forms live in `grpc/convert.rs`.

use std::sync::{Arc, OnceLock};

use muster_format::StepRoles;

use super::{ExecutionStatus, StepStatus, authority::Session};

/// An execution: which process version it runs, where it is, who leads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Execution {
    pub id: String,
    pub process_name: String,
    pub process_version: u32,
    pub status: ExecutionStatus,
    /// Why it ended (failed, cancelled); empty otherwise.
    pub reason: String,
    pub lead_agent_id: String,
    /// The execution's inputs, a JSON object as text.
    pub inputs_json: String,
    pub idempotency_key: Option<String>,
    pub started_at: i64,
    pub ended_at: Option<i64>,
    /// Events numbered so far: the next event is `last_sequence + 1`.
    pub last_sequence: u64,
    /// W3C traceparent of the span that started it; empty when untraced.
    pub trace_parent: String,
    /// Set when it runs as a team session.
    pub session: Option<Session>,
}

/// The state of one step of an execution; steps are kept in definition
/// order, so a step's position is its index in the process definition.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub status: StepStatus,
    /// The agent executing (or chosen to execute) it; for a decided
    /// approval, who decided.
    pub executor: String,
    /// Attempts started, from 1.
    pub attempt: u32,
    /// The output, JSON text, once completed.
    pub output_json: Option<Arc<str>>,
    pub error_code: String,
    pub error_message: String,
    pub started_at: Option<i64>,
    pub ended_at: Option<i64>,
    pub cost: f64,
    pub tokens_used: u64,
    /// The agent a REASSIGN intervention or a hand-off gave the step to: it
    /// takes the place of the named executor or the roster's choice.
    pub assigned_to: Option<String>,
    /// Agents the step passed through by hand-offs, oldest first.
    pub delegation_chain: Vec<String>,
    /// The estimated wait of a queued step, in seconds.
    pub wait_seconds: u64,
    /// When a failed attempt's retry may start (milliseconds since the epoch).
    pub retry_at: Option<i64>,
    /// The roster holds a slot of the executor for this step (it chose the
    /// executor): released when the step ends or leaves that agent.
    pub roster_reserved: bool,
    /// The roster task whose slot the step holds, when it took over the slot
    /// of the step before it in a chain (same named executor); empty when
    /// the slot, if any, is the step's own task's.
    pub slot_task: String,
}

impl Default for Step {
    fn default() -> Self {
        Self::new()
    }
}

impl Step {
    /// A step that has not started.
    pub fn new() -> Self {
        Self {
            status: StepStatus::Pending,
            executor: String::new(),
            attempt: 0,
            output_json: None,
            error_code: String::new(),
            error_message: String::new(),
            started_at: None,
            ended_at: None,
            cost: 0.0,
            tokens_used: 0,
            assigned_to: None,
            delegation_chain: Vec::new(),
            wait_seconds: 0,
            retry_at: None,
            roster_reserved: false,
            slot_task: String::new(),
        }
    }

    /// Records why and when the step ended without its output (the caller
    /// sets its status).
    pub fn ended_with_error(&mut self, code: &str, message: String, now: i64) {
        self.error_code = code.to_owned();
        self.error_message = message;
        self.ended_at = Some(now);
    }
}

/// What kind of thing happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    ExecutionStarted,
    StepStarted,
    StepCompleted,
    StepFailed,
    StepQueued,
    StepDelegated,
    StepEscalated,
    ApprovalRequested,
    StepIntervened,
    ExecutionFinished,
    SessionStarted,
    RoleAssigned,
    LeadChanged,
    BudgetExceeded,
    /// A model call of a running attempt, for audit.
    StepProgress,
    SubtaskRequested,
    SubtaskDecided,
}

/// Something that happened in an execution: recorded with the state change,
/// told to the notifier, streamed to watchers.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub event_id: String,
    pub kind: EventKind,
    pub execution_id: String,
    /// Per execution, from 1, without gaps.
    pub sequence: u64,
    pub occurred_at: i64,
    pub process_name: String,
    pub process_version: u32,
    pub lead_agent_id: String,
    pub step_id: String,
    pub step_name: String,
    pub roles: Option<StepRoles>,
    /// The step's executor, or who acted (intervened, decided, was assigned).
    pub agent_id: String,
    pub output_json: Option<Arc<str>>,
    /// Code and message of a failure.
    pub error: Option<(String, String)>,
    pub retry_count: u32,
    pub cost: f64,
    pub tokens_used: u64,
    pub duration_ms: u64,
    pub wait_seconds: u64,
    pub detail: String,
    pub waiting_for: Vec<String>,
    pub execution_status: Option<ExecutionStatus>,
    pub trace_parent: String,
    /// Agents the event is addressed to beyond the step's roles.
    pub participants: Vec<String>,
    /// The permission matrix version that authorised the action (0: none).
    pub matrix_version: u32,
}

impl Event {
    /// An event of `execution`, numbered next.
    pub fn new(execution: &mut Execution, kind: EventKind, now: i64, trace_parent: String) -> Self {
        execution.last_sequence += 1;
        Self {
            event_id: uuid::Uuid::now_v7().to_string(),
            kind,
            execution_id: execution.id.clone(),
            sequence: execution.last_sequence,
            occurred_at: now,
            process_name: execution.process_name.clone(),
            process_version: execution.process_version,
            lead_agent_id: execution.lead_agent_id.clone(),
            step_id: String::new(),
            step_name: String::new(),
            roles: None,
            agent_id: String::new(),
            output_json: None,
            error: None,
            retry_count: 0,
            cost: 0.0,
            tokens_used: 0,
            duration_ms: 0,
            wait_seconds: 0,
            detail: String::new(),
            waiting_for: Vec::new(),
            execution_status: None,
            trace_parent,
            participants: Vec::new(),
            matrix_version: 0,
        }
    }
}

/// The shared memory an assignment carries: the outputs of the most
/// recently completed steps, newest first, an object of step id to output.
/// Its encoded form is made once, by the wire layer, for every assignment
/// that carries it; each output's part of it once for every memory the
/// output is in.
#[derive(Debug, Default)]
pub struct SharedMemory {
    pub outputs: Vec<Arc<MemoryOutput>>,
    pub encoded: OnceLock<bytes::Bytes>,
}

/// One completed step's output in the shared memory.
#[derive(Debug)]
pub struct MemoryOutput {
    pub step_id: String,
    /// JSON text.
    pub output: Arc<str>,
    pub encoded: OnceLock<bytes::Bytes>,
}

impl MemoryOutput {
    /// The output of `step_id`, `output` as text and `value` as an encoded
    /// `google.protobuf.Value` of the same output: its shared memory entry
    /// (the encoded field of a `google.protobuf.Struct`) is made from the
    /// value's bytes, without reading the text.
    pub fn with_value(step_id: String, output: Arc<str>, value: &[u8]) -> Self {
        use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len};
        let field = |len: usize| key_len(1) + encoded_len_varint(len as u64) + len;
        let entry_len = field(step_id.len()) + field(value.len());
        let mut entry = Vec::with_capacity(field(entry_len));
        encode_key(1, WireType::LengthDelimited, &mut entry);
        encode_varint(entry_len as u64, &mut entry);
        encode_key(1, WireType::LengthDelimited, &mut entry);
        encode_varint(step_id.len() as u64, &mut entry);
        entry.extend_from_slice(step_id.as_bytes());
        encode_key(2, WireType::LengthDelimited, &mut entry);
        encode_varint(value.len() as u64, &mut entry);
        entry.extend_from_slice(value);
        Self { step_id, output, encoded: OnceLock::from(bytes::Bytes::from(entry)) }
    }
}

/// The warnings found when a process was published: the first
/// [`Warnings::KEPT`] in source order, and how many there were. A process
/// with a warning on each of its thousands of steps is kept, read and
/// answered without them all.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Warnings {
    pub kept: Vec<Finding>,
    pub count: u32,
}

impl Warnings {
    /// How many warnings are kept with a version.
    pub const KEPT: usize = 100;

    /// The first [`Warnings::KEPT`] of `found`, and their count.
    pub fn keep(mut found: Vec<Finding>) -> Self {
        let count = u32::try_from(found.len()).unwrap_or(u32::MAX);
        found.truncate(Self::KEPT);
        Self { kept: found, count }
    }
}

/// A published version of a process.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessVersion {
    pub name: String,
    pub version: u32,
    /// The YAML exactly as published.
    pub source: String,
    /// SHA-256 of the source, hex: publishing the same source again returns this version.
    pub content_hash: String,
    pub published_at: i64,
    pub step_count: u32,
    /// Warnings found when it was published.
    pub warnings: Warnings,
    /// The definition, parsed and checked once, when it was published.
    pub definition: Arc<muster_format::ProcessDefinition>,
}

impl ProcessVersion {
    /// Whether the definition names `agent_id` in a step (see [`named_agents`]).
    pub fn names(&self, agent_id: &str) -> bool {
        named_agents(&self.definition).any(|named| named == agent_id)
    }
}

/// The agents a definition names in its steps: as a step's agent, in its
/// roles (executor, monitors, informed) or among its approvers; an agent
/// named twice comes twice. The store keeps them per version, so that the
/// executions an agent takes part in are listed by the same rule.
pub fn named_agents(definition: &muster_format::ProcessDefinition) -> impl Iterator<Item = &str> {
    definition.steps.iter().flat_map(|step| {
        let roles = step
            .roles
            .iter()
            .flat_map(|roles| std::iter::once(&roles.executor).chain(&roles.monitors).chain(&roles.informed));
        step.agent.iter().chain(&step.approvers).chain(roles).map(String::as_str)
    })
}

/// A diagnostic about a document, as kept with what it was found in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub error: bool,
    pub code: String,
    pub message: String,
    pub path: String,
    pub line: u32,
    pub column: u32,
}

impl From<&muster_format::Diagnostic> for Finding {
    fn from(diagnostic: &muster_format::Diagnostic) -> Self {
        Self {
            error: diagnostic.is_error(),
            code: diagnostic.code.to_owned(),
            message: diagnostic.message.clone(),
            path: diagnostic.path.clone(),
            line: diagnostic.line,
            column: diagnostic.column,
        }
    }
}

/// What an agent is told about itself with each assignment (from the roster).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentContext {
    pub roster_role: String,
    pub role_definition: Option<RoleDefinition>,
    pub system_prompt: Arc<str>,
    pub max_iterations: u32,
    pub llm_config_json: String,
    pub allow_delegation: bool,
    /// The global memory's newest entries, then the agent's role's, as
    /// they are when the step is assigned to the agent.
    pub memory: Vec<super::memory::MemoryEntry>,
}

/// A role definition, as the roster holds it (the format library's model).
pub use muster_format::roster::model::RoleDefinition;

/// A past action, given to an executor as history.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryEntry {
    pub step_id: String,
    pub agent_id: String,
    pub action: &'static str,
    pub at: Option<i64>,
}

/// A step handed to a worker to run as one of its agents.
#[derive(Debug, Clone)]
pub struct Assignment {
    /// `<execution>/<step>/<attempt>`.
    pub assignment_id: String,
    /// `<execution>/<step>`: the same for every attempt.
    pub idempotency_key: String,
    pub attempt: u32,
    pub agent_id: String,
    pub execution_id: String,
    pub process_name: String,
    pub process_version: u32,
    pub step_id: String,
    pub step_name: String,
    pub step_type: String,
    pub message: String,
    pub inputs_json: String,
    /// Outputs of the steps it depends on that travel inline, by step id.
    pub upstream_outputs: Vec<(String, Arc<str>)>,
    /// The inputs and outputs that travel by reference.
    pub payload_refs: Vec<super::payload::PayloadRef>,
    /// Outputs of the most recently completed steps (bounded: see
    /// `shared_memory_left_out`); shared by the assignments made while no
    /// step ends.
    pub shared_memory: Arc<SharedMemory>,
    /// Completed steps whose outputs did not fit into `shared_memory`.
    pub shared_memory_left_out: u32,
    /// The most recent finished steps, oldest first; shared like the memory.
    pub history: Arc<[HistoryEntry]>,
    pub context: Arc<AgentContext>,
    pub roles: StepRoles,
    pub delegation_chain: Vec<String>,
    pub timeout_ms: u64,
    pub trace_parent: String,
    pub session_role: String,
    pub session_context: String,
}

/// What a worker reported of an assignment.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Completed {
        output_json: String,
        /// The output as the worker sent it, an encoded
        /// `google.protobuf.Value` (the shared memory's entry for it is made
        /// from these bytes instead of from the text); `None` when it came
        /// as text alone.
        output_value: Option<bytes::Bytes>,
        tokens_used: u64,
        cost: f64,
        duration_ms: u64,
        iterations: u32,
        /// An inbox the worker asked the output to be posted to; empty for none.
        post_to_inbox: String,
        /// Entries to remember: (global, or the role's when false; `None`
        /// when the worker named no memory), text.
        remember: Vec<(Option<bool>, String)>,
        /// The output is posted to no inbox (neither the step's nor
        /// `post_to_inbox`): the runs a post would start need not run.
        skip_triggers: bool,
    },
    Failed {
        error_code: String,
        message: String,
        retryable: bool,
    },
    /// The worker went away (or was made to) before reporting.
    WorkerLost,
}

/// A worker hands its step onward.
#[derive(Debug, Clone, PartialEq)]
pub struct HandOff {
    pub assignment_id: String,
    /// A named colleague; empty to let the roster choose by the criteria.
    pub to_agent_id: String,
    pub required_expertise: Vec<String>,
    pub required_role: String,
    pub reason: String,
}

/// The answer to a hand-off.
#[derive(Debug, Clone, PartialEq)]
pub struct HandOffAnswer {
    pub assignment_id: String,
    pub accepted: bool,
    pub decision: Option<Decision>,
    pub reason: String,
}

/// What the roster decided for a delegation, with its reasons.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Decision {
    pub kind: DecisionKind,
    /// The tier of the delegation priority order that decided, as the roster names it.
    pub tier: i32,
    /// The delegate, the expert queued for, or the senior.
    pub primary_agent_id: String,
    pub primary_reason: String,
    pub fallback_agent_id: String,
    pub fallback_reason: String,
    pub reasoning: String,
    /// For a queue: the estimated wait, in seconds.
    pub wait_seconds: u64,
    pub notes: String,
    /// The decision as text (the DELEGATION DECISION block).
    pub text: String,
    pub candidates: Vec<String>,
}

/// The roster's kinds of decision.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DecisionKind {
    #[default]
    Delegate,
    Queue,
    Escalate,
}

/// A tool a worker provides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tool {
    pub name: String,
    pub description: String,
    /// JSON schema of the input, JSON text; empty accepts any object.
    pub input_schema_json: String,
}

/// A tool call sent to a worker.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub call_id: String,
    pub tool: String,
    pub input_json: String,
    pub agent_id: String,
    pub trace_parent: String,
}

/// A tool's answer, with the tool protocol's status codes (200, 400, 403, 404, 500).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolOutput {
    pub output_json: String,
    pub error: String,
    pub status_code: u32,
}

impl ToolOutput {
    /// A tool call that failed with `status_code`.
    pub fn error(status_code: u32, error: String) -> Self {
        Self { output_json: String::new(), error, status_code }
    }

    /// The answer with a status code that agrees with its error: none given
    /// is 200 without an error and 500 with one; a 2xx with an error is 500.
    pub fn normalised(mut self) -> Self {
        if self.status_code == 0 {
            self.status_code = if self.error.is_empty() { 200 } else { 500 };
        }
        if !self.error.is_empty() && (200..300).contains(&self.status_code) {
            self.status_code = 500;
        }
        self
    }
}
