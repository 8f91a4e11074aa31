//! Rows as stored, and their decoding.

use muster_proto::common::v1::Diagnostic;
use prost::Message;
use sqlx::{Row, any::AnyRow};

use crate::{
    Error, Result,
    domain::{ExecutionStatus, StepStatus, authority::Session},
};

/// A stored process version.
#[derive(Debug, Clone)]
pub(crate) struct ProcessRow {
    pub(crate) name: String,
    pub(crate) version: u32,
    pub(crate) source: String,
    pub(crate) published_at: i64,
    pub(crate) step_count: u32,
    pub(crate) warnings: Vec<Diagnostic>,
}

impl ProcessRow {
    pub(super) fn from_row(row: &AnyRow) -> Result<Self> {
        let warnings: Vec<u8> = row.try_get("warnings")?;
        Ok(Self {
            name: row.try_get("name")?,
            version: row.try_get::<i64, _>("version")? as u32,
            source: row.try_get("source")?,
            published_at: row.try_get("published_at")?,
            step_count: row.try_get::<i64, _>("step_count")? as u32,
            warnings: decode_diagnostics(&warnings)?,
        })
    }
}

/// Diagnostics are stored as one encoded `ValidateProcessResponse`-like list.
#[derive(Clone, PartialEq, Message)]
struct StoredDiagnostics {
    #[prost(message, repeated, tag = "1")]
    diagnostics: Vec<Diagnostic>,
}

pub(super) fn encode_diagnostics(diagnostics: &[Diagnostic]) -> Vec<u8> {
    StoredDiagnostics { diagnostics: diagnostics.to_vec() }.encode_to_vec()
}

fn decode_diagnostics(bytes: &[u8]) -> Result<Vec<Diagnostic>> {
    StoredDiagnostics::decode(bytes)
        .map(|stored| stored.diagnostics)
        .map_err(|error| Error::Storage(format!("corrupt stored diagnostics: {error}")))
}

/// A stored execution; `steps` is empty when listed.
#[derive(Debug, Clone)]
pub(crate) struct ExecutionRow {
    pub(crate) id: String,
    pub(crate) process_name: String,
    pub(crate) process_version: u32,
    pub(crate) status: ExecutionStatus,
    pub(crate) reason: String,
    pub(crate) lead_agent_id: String,
    pub(crate) inputs_json: String,
    pub(crate) idempotency_key: Option<String>,
    pub(crate) started_at: i64,
    pub(crate) ended_at: Option<i64>,
    /// Events numbered so far. The stored column is written with status
    /// changes only; a resumed execution reads it from its history.
    pub(crate) last_sequence: u64,
    /// W3C traceparent of the span that started it; empty when untraced.
    pub(crate) trace_parent: String,
    /// Set when it runs as a team session (assignments are loaded with the steps).
    pub(crate) session: Option<Session>,
    pub(crate) steps: Vec<StepRow>,
}

impl ExecutionRow {
    pub(super) fn from_row(row: &AnyRow) -> Result<Self> {
        let status: String = row.try_get("status")?;
        Ok(Self {
            id: row.try_get("id")?,
            process_name: row.try_get("process_name")?,
            process_version: row.try_get::<i64, _>("process_version")? as u32,
            status: status.parse()?,
            reason: row.try_get("reason")?,
            lead_agent_id: row.try_get("lead_agent_id")?,
            inputs_json: row.try_get("inputs_json")?,
            idempotency_key: row.try_get("idempotency_key")?,
            started_at: row.try_get("started_at")?,
            ended_at: row.try_get("ended_at")?,
            last_sequence: row.try_get::<i64, _>("last_sequence")? as u64,
            trace_parent: row.try_get("trace_parent")?,
            session: (row.try_get::<i64, _>("is_session")? != 0)
                .then(|| {
                    Ok::<_, Error>(Session {
                        title: row.try_get("session_title")?,
                        description: row.try_get("session_description")?,
                        assignments: Default::default(),
                    })
                })
                .transpose()?,
            steps: Vec::new(),
        })
    }
}

/// The stored state of one step of an execution.
#[derive(Debug, Clone)]
pub(crate) struct StepRow {
    pub(crate) step_id: String,
    pub(crate) position: u32,
    pub(crate) status: StepStatus,
    pub(crate) executor: String,
    pub(crate) attempt: u32,
    pub(crate) output_json: String,
    pub(crate) error_code: String,
    pub(crate) error_message: String,
    pub(crate) started_at: Option<i64>,
    pub(crate) ended_at: Option<i64>,
    pub(crate) cost: f64,
    pub(crate) tokens_used: u64,
}

impl StepRow {
    pub(crate) fn new(step_id: String, position: u32) -> Self {
        Self {
            step_id,
            position,
            status: StepStatus::Pending,
            executor: String::new(),
            attempt: 0,
            output_json: String::new(),
            error_code: String::new(),
            error_message: String::new(),
            started_at: None,
            ended_at: None,
            cost: 0.0,
            tokens_used: 0,
        }
    }

    pub(super) fn from_row(row: &AnyRow) -> Result<Self> {
        let status: String = row.try_get("status")?;
        Ok(Self {
            step_id: row.try_get("step_id")?,
            position: row.try_get::<i64, _>("position")? as u32,
            status: status.parse()?,
            executor: row.try_get("executor")?,
            attempt: row.try_get::<i64, _>("attempt")? as u32,
            output_json: row.try_get("output_json")?,
            error_code: row.try_get("error_code")?,
            error_message: row.try_get("error_message")?,
            started_at: row.try_get("started_at")?,
            ended_at: row.try_get("ended_at")?,
            cost: row.try_get("cost")?,
            tokens_used: row.try_get::<i64, _>("tokens_used")? as u64,
        })
    }
}
