//! What a running attempt reports as it goes ([`Progress`]): its use so far
//! becomes the step's cost and tokens until its result replaces them, counts
//! against the budget at once ([`Driver::check_spending`]: a runaway step is
//! stopped mid-way), and each model call it reports is recorded as a
//! `step_progress` event, up to [`MODEL_CALL_EVENTS`] per attempt (later
//! calls still count in its use).

use super::Driver;
use crate::{
    Result,
    domain::{
        budget::Usage,
        model::EventKind,
        progress::{AttemptUse, Progress},
    },
};

/// Most model calls of one attempt recorded as events.
pub(super) const MODEL_CALL_EVENTS: u32 = 200;

/// What a running attempt reported so far.
#[derive(Debug, Default)]
pub(super) struct Reported {
    used: AttemptUse,
    /// Model calls recorded as events.
    model_calls: u32,
}

impl Driver {
    /// A running attempt's report; the reason to cancel the execution when
    /// its use takes the run over a budget that says to stop.
    pub(super) async fn progressed(&mut self, position: usize, progress: Progress) -> Result<Option<String>> {
        let reported = self.reported.entry(position).or_default();
        let grew = reported.used.take(&progress);
        let used = reported.used;
        let model_call = progress.model_call.filter(|_| reported.model_calls < MODEL_CALL_EVENTS);
        if model_call.is_some() {
            reported.model_calls += 1;
        }
        let last_recorded = reported.model_calls == MODEL_CALL_EVENTS;
        if grew {
            let step = &mut self.steps[position];
            step.tokens_used = used.tokens;
            step.cost = used.cost;
            self.stage(position);
        }
        if let Some(call) = model_call {
            let mut event = self.step_event(EventKind::StepProgress, position);
            event.detail = call.summary();
            if last_recorded {
                event.detail.push_str(&format!(
                    "; the attempt's later model calls are not recorded (at most {MODEL_CALL_EVENTS} are)"
                ));
            }
            self.record(event);
        }
        if !grew {
            return Ok(None);
        }
        self.check_spending(position).await
    }

    /// What the attempts underway reported using so far, together.
    pub(super) fn in_flight_use(&self) -> Usage {
        self.reported.values().fold(Usage::default(), |total, reported| Usage {
            cost: total.cost + reported.used.cost,
            tokens: total.tokens.saturating_add(reported.used.tokens),
            runs: 0,
        })
    }

    /// An attempt ended: what it reported no longer counts as underway (a
    /// completed step's result counts instead).
    pub(super) fn forget_reported(&mut self, position: usize) {
        self.reported.remove(&position);
    }
}
