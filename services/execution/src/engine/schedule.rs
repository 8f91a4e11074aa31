//! The scheduler: starts the runs of processes whose schedule is due. Every
//! replica of the service runs it; a run and the move of its schedule to the
//! next due time commit together, conditional on the due time it fired for,
//! so each due time fires once however many replicas see it. Due times
//! missed while no replica ran fire once, or are skipped, as the process
//! declares (`missed`). A run the budget or the throttle refuses is skipped
//! (and logged); the schedule moves on.

use std::{sync::Arc, time::Duration};

use super::{Engine, StartRequest};
use crate::{
    Error, Result,
    domain::schedule::{Decision, ScheduleState},
};

/// Longest sleep between two looks at the schedules: a schedule published
/// meanwhile is seen within it.
const MAX_SLEEP: Duration = Duration::from_secs(1);
/// Schedules handled per look.
const BATCH: u32 = 100;

impl Engine {
    /// Fires due schedules until the engine stops.
    pub(crate) async fn run_schedules(self: Arc<Self>) {
        loop {
            let sleep = match self.fire_due_schedules().await {
                Ok(sleep) => sleep,
                Err(error) => {
                    tracing::warn!(%error, "could not fire the due schedules");
                    MAX_SLEEP
                }
            };
            tokio::time::sleep(sleep).await;
        }
    }

    /// Fires every due schedule; how long to sleep until the next is due
    /// (after a failure, [`MAX_SLEEP`]: the failed one is still due).
    async fn fire_due_schedules(self: &Arc<Self>) -> Result<Duration> {
        loop {
            let now = muster_runtime::time::now_millis();
            let due = self.store.due_schedules(now, BATCH).await?;
            let full = due.len() == BATCH as usize;
            let mut failed = false;
            for state in due {
                if let Err(error) = self.fire(&state, now).await {
                    tracing::warn!(process = %state.process_name, %error, "could not fire the schedule");
                    failed = true;
                }
            }
            if failed {
                return Ok(MAX_SLEEP);
            }
            if !full {
                break;
            }
        }
        let now = muster_runtime::time::now_millis();
        Ok(match self.store.next_due_schedule().await? {
            Some(due) => Duration::from_millis(u64::try_from(due - now).unwrap_or(0)).min(MAX_SLEEP),
            None => MAX_SLEEP,
        })
    }

    async fn fire(self: &Arc<Self>, state: &ScheduleState, now: i64) -> Result<()> {
        let process_name = &state.process_name;
        let schedule = state.schedule().map_err(|reason| Error::Storage(format!("{process_name}: {reason}")))?;
        let Some(decision) = state.decide(&schedule, now) else {
            // It fires never again: out of the way, a year on.
            tracing::warn!(process = %process_name, "the schedule fires never again");
            self.store.skip_schedule(process_name, state.next_fire_at, now.saturating_add(31_536_000_000)).await?;
            return Ok(());
        };
        let (due, next) = match decision {
            Decision::Fire { due, next } => (due, next),
            Decision::Skip { next } => {
                if self.store.skip_schedule(process_name, state.next_fire_at, next).await? {
                    tracing::info!(process = %process_name, due = state.next_fire_at, next, "missed runs skipped");
                }
                return Ok(());
            }
        };
        let Some(process) = self.process(process_name, None).await? else {
            self.store.skip_schedule(process_name, due, next).await?;
            return Ok(());
        };
        let inputs = serde_json::json!({
            "schedule": state.cron,
            "scheduled_for_ms": due,
            "scheduled_for": muster_format::rfc3339(due),
        });
        let started = self
            .start(StartRequest {
                inputs_json: inputs.to_string(),
                lead_agent_id: process.definition.lead.clone().unwrap_or_default(),
                process,
                idempotency_key: None,
                session: None,
                claimed_messages: Vec::new(),
                fired_schedule: Some((due, next)),
            })
            .await;
        match started {
            Ok(execution) => {
                tracing::info!(process = %process_name, execution_id = %execution.id, due, "scheduled run started");
            }
            // Another replica fired it.
            Err(Error::Superseded(_)) => {}
            Err(error @ Error::Storage(_)) => return Err(error),
            // Refused (its budget, its throttle, its definition): this due
            // time is skipped, the next is tried.
            Err(refusal) => {
                tracing::warn!(process = %process_name, due, %refusal, "scheduled run skipped");
                self.store.skip_schedule(process_name, due, next).await?;
            }
        }
        Ok(())
    }
}
