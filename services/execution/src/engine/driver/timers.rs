//! Timers: a retry's backoff, a step's time limit, and a wait for a worker
//! that ran out; each due one takes effect in the turn that finds it.

use std::{cmp::Reverse, time::Duration};

use super::{Driver, Timer, seconds_or_milliseconds};
use crate::domain::{
    StepStatus,
    model::{EventKind, Outcome},
};

impl Driver {
    /// Due timers take effect.
    pub(super) fn fire_timers(&mut self) {
        let now = muster_runtime::time::now_millis();
        while let Some(Reverse((due, timer, position, attempt))) = self.timers.peek().copied() {
            if due > now {
                return;
            }
            self.timers.pop();
            if self.steps[position].attempt != attempt {
                continue;
            }
            match timer {
                Timer::Timeout if self.active[position] && self.steps[position].status == StepStatus::Running => {
                    self.engine.workers.withdraw(&self.assignment_id(position), "timed out");
                    let seconds = self.definition(position).timeout_seconds.unwrap_or_default();
                    self.settle(
                        position,
                        Outcome::Failed {
                            error_code: "TIMEOUT".to_owned(),
                            message: format!("no result within {seconds} s"),
                            retryable: true,
                        },
                    );
                }
                Timer::ScheduleToStart
                    if self.active[position] && self.steps[position].status == StepStatus::WaitingForWorker =>
                {
                    self.no_worker_in_time(position);
                }
                Timer::ToolProvider
                    if self.active[position] && self.steps[position].status == StepStatus::WaitingForWorker =>
                {
                    self.look_for_provider(position);
                }
                Timer::Retry if !self.active[position] && self.steps[position].status == StepStatus::Ready => {
                    self.steps[position].retry_at = None;
                    self.stage(position);
                    self.ready.push_back(position);
                }
                _ => {}
            }
        }
    }

    /// No worker took the step in time: a step the roster chose an agent for
    /// goes back to the roster without that agent; one whose executor is
    /// named fails.
    pub(super) fn no_worker_in_time(&mut self, position: usize) {
        let agent_id = self.steps[position].executor.clone();
        self.engine.workers.stop_waiting(&agent_id, &self.route(position));
        self.end_attempt(position);
        let limit = self
            .definition(position)
            .schedule_to_start_seconds
            .map(Duration::from_secs)
            .or(self.engine.settings.schedule_to_start)
            .unwrap_or_default();
        if self.is_tool_step(position) {
            let tool = self.definition(position).tool.clone().unwrap_or_default();
            let why = format!("no connected worker provided tool '{tool}' within {}", seconds_or_milliseconds(limit));
            return self.fail(position, "NO_WORKER", why);
        }
        let why = format!("no worker serving '{agent_id}' took the step within {}", seconds_or_milliseconds(limit));
        let chosen_by_roster =
            self.steps[position].assigned_to.is_none() && self.definition(position).executor().is_none();
        if chosen_by_roster {
            self.steps[position].delegation_chain.push(agent_id);
            let mut event = self.step_event(EventKind::StepDelegated, position);
            event.detail = format!("{why}; the roster is asked again, without that agent");
            self.record(event);
            self.set_status(position, StepStatus::Ready);
            self.ready.push_front(position);
        } else {
            self.fail(position, "NO_WORKER", why);
        }
    }
}
