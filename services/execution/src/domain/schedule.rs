//! Schedules: when a process with `triggers.schedule` runs next, and what a
//! scheduler does with a due time — fire it, or skip it when it was missed
//! (a later due time passed too) and the process says `missed: skip`.

use muster_format::{MissedRuns, Schedule};

/// A process's schedule as stored: its next due time and its last run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleState {
    pub process_name: String,
    pub cron: String,
    /// IANA name; empty for UTC.
    pub time_zone: String,
    pub missed: MissedRuns,
    /// Milliseconds since the epoch.
    pub next_fire_at: i64,
    pub last_fired_at: Option<i64>,
    pub last_execution_id: String,
}

/// What to do with a schedule due at `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Start a run for the due time `due`; the schedule moves on to `next`.
    Fire { due: i64, next: i64 },
    /// Start nothing; the schedule moves on to `next`.
    Skip { next: i64 },
}

impl ScheduleState {
    /// The schedule, parsed (it was checked when the process was published).
    pub fn schedule(&self) -> Result<Schedule, String> {
        Schedule::parse(&self.cron, &self.time_zone)
    }

    /// What to do at `now`, when `next_fire_at` has come: fire, unless a
    /// later due time has passed as well (the scheduler was not running)
    /// and missed runs are skipped. `None` when the schedule fires never
    /// again.
    pub fn decide(&self, schedule: &Schedule, now: i64) -> Option<Decision> {
        let next = schedule.next_after(now)?;
        let missed = schedule.next_after(self.next_fire_at).is_some_and(|later| later <= now);
        Some(if missed && self.missed == MissedRuns::Skip {
            Decision::Skip { next }
        } else {
            Decision::Fire { due: self.next_fire_at, next }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(missed: MissedRuns, next_fire_at: i64) -> ScheduleState {
        ScheduleState {
            process_name: "p".to_owned(),
            cron: "*/10 * * * * *".to_owned(),
            time_zone: String::new(),
            missed,
            next_fire_at,
            last_fired_at: None,
            last_execution_id: String::new(),
        }
    }

    #[test]
    fn a_due_time_fires_and_missed_ones_follow_the_policy() {
        let every_ten_seconds = Schedule::parse("*/10 * * * * *", "").unwrap();
        // On time, or late within the period: it fires.
        for missed in [MissedRuns::Skip, MissedRuns::RunOnce] {
            assert_eq!(
                state(missed, 100_000).decide(&every_ten_seconds, 103_000),
                Some(Decision::Fire { due: 100_000, next: 110_000 })
            );
        }
        // Two due times passed (100 s and 110 s): missed.
        assert_eq!(
            state(MissedRuns::Skip, 100_000).decide(&every_ten_seconds, 112_000),
            Some(Decision::Skip { next: 120_000 })
        );
        assert_eq!(
            state(MissedRuns::RunOnce, 100_000).decide(&every_ten_seconds, 145_000),
            Some(Decision::Fire { due: 100_000, next: 150_000 }),
            "once for all of them"
        );
    }
}
