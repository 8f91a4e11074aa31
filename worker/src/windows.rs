//! The windows the worker keeps ([`Behaviour::kept_windows`]): the shared
//! memory and history of the latest assignment of each of the executions it
//! was most recently assigned a step of, counting every assignment in the
//! order it came. An assignment that reuses some of its execution's window
//! (`shared_memory_reused`, `history_reused`) is made whole from it before
//! the behaviour sees it.
//!
//! [`Behaviour::kept_windows`]: crate::Behaviour::kept_windows

use std::collections::{BTreeMap, HashMap};

use muster_proto::execution::v1::{Assignment, HistoryEntry};

use crate::SharedMemory;

/// What the worker keeps.
#[derive(Debug, Default)]
pub(crate) struct Windows {
    /// How many executions' windows (0: none).
    capacity: usize,
    /// Assignments received, to order the executions by their latest.
    received: u64,
    latest: HashMap<String, Kept>,
    /// The executions kept, by when their latest assignment came, so the
    /// one to leave behind is found without looking at every other.
    order: BTreeMap<u64, String>,
}

#[derive(Debug)]
struct Kept {
    received: u64,
    memory: SharedMemory,
    history: Vec<HistoryEntry>,
}

impl Windows {
    pub(crate) fn new(capacity: u32) -> Self {
        Self { capacity: capacity as usize, ..Self::default() }
    }

    /// `assignment`'s shared memory and history whole (the history in the
    /// assignment, the memory returned), from what it carries, `memory`,
    /// and its execution's kept window; kept in turn. An error when it
    /// reuses more than is kept: the service and the worker no longer agree
    /// on what it keeps, which a new connection starts again from.
    pub(crate) fn whole(&mut self, assignment: &mut Assignment, memory: SharedMemory) -> anyhow::Result<SharedMemory> {
        let (memory_reused, history_reused) =
            (assignment.shared_memory_reused as usize, assignment.history_reused as usize);
        let kept = self.latest.get_mut(&assignment.execution_id);
        let unknown = |what: &str| {
            anyhow::anyhow!(
                "assignment {} reuses {what} of execution {}'s last window, which this worker does not keep",
                assignment.assignment_id,
                assignment.execution_id
            )
        };
        let memory = match (memory_reused, kept.as_deref()) {
            (0, _) => memory,
            (_, None) => return Err(unknown("shared memory")),
            (reused, Some(kept)) => {
                let Some(first) = kept.memory.first(reused)? else {
                    return Err(unknown(&format!("{reused} outputs")));
                };
                memory.followed_by(first)?
            }
        };
        if history_reused > 0 {
            let Some(kept) = kept.filter(|kept| kept.history.len() >= history_reused) else {
                return Err(unknown(&format!("{history_reused} history entries")));
            };
            // The kept entries move into the assignment (the window kept
            // next is made from it): copied once an assignment, not twice.
            let mut history = std::mem::take(&mut kept.history);
            history.drain(..history.len() - history_reused);
            history.append(&mut assignment.history);
            assignment.history = history;
        }
        (assignment.shared_memory_reused, assignment.history_reused) = (0, 0);
        if self.capacity > 0 {
            self.received += 1;
            let kept = Kept { received: self.received, memory: memory.clone(), history: assignment.history.clone() };
            if let Some(earlier) = self.latest.insert(assignment.execution_id.clone(), kept) {
                self.order.remove(&earlier.received);
            }
            self.order.insert(self.received, assignment.execution_id.clone());
            if self.latest.len() > self.capacity
                && let Some((_, oldest)) = self.order.pop_first()
            {
                self.latest.remove(&oldest);
            }
        }
        Ok(memory)
    }
}

#[cfg(test)]
mod tests {
    use prost::Message as _;
    use prost_types::{Struct, Value, value::Kind};

    use super::*;

    /// The shared memory of outputs `steps`, the first first.
    fn memory(steps: &[&str]) -> SharedMemory {
        let mut encoded = Vec::new();
        for step in steps {
            let value = Value { kind: Some(Kind::StringValue(format!("output of {step}"))) };
            encoded.extend(Struct { fields: [((*step).to_owned(), value)].into() }.encode_to_vec());
        }
        SharedMemory::new(encoded.into())
    }

    fn history(steps: &[&str]) -> Vec<HistoryEntry> {
        steps
            .iter()
            .map(|step| HistoryEntry {
                step_id: (*step).to_owned(),
                action: "completed".to_owned(),
                ..HistoryEntry::default()
            })
            .collect()
    }

    fn assignment(execution_id: &str, history: Vec<HistoryEntry>, reused: (u32, u32)) -> Assignment {
        Assignment {
            assignment_id: format!("{execution_id}/next/1"),
            execution_id: execution_id.to_owned(),
            history,
            shared_memory_reused: reused.0,
            history_reused: reused.1,
            ..Assignment::default()
        }
    }

    #[test]
    fn an_assignment_reusing_its_executions_window_is_made_whole() {
        let mut windows = Windows::new(2);
        let mut first = assignment("e", history(&["s0", "s1"]), (0, 0));
        let whole = windows.whole(&mut first, memory(&["s1", "s0"])).unwrap();
        assert_eq!(whole, memory(&["s1", "s0"]));
        // The next step: s2's output and history entry, the rest kept.
        let mut next = assignment("e", history(&["s2"]), (2, 2));
        let whole = windows.whole(&mut next, memory(&["s2"])).unwrap();
        assert_eq!(whole, memory(&["s2", "s1", "s0"]));
        assert_eq!(whole.step_ids().unwrap(), ["s2", "s1", "s0"]);
        assert_eq!(whole.get("s0").unwrap().unwrap().kind, Some(Kind::StringValue("output of s0".to_owned())));
        assert_eq!(next.history, history(&["s0", "s1", "s2"]));
        assert_eq!((next.shared_memory_reused, next.history_reused), (0, 0));
        // Bounded: the oldest output and entry left behind.
        let mut bounded = assignment("e", history(&["s3"]), (2, 2));
        assert_eq!(windows.whole(&mut bounded, memory(&["s3"])).unwrap(), memory(&["s3", "s2", "s1"]));
        assert_eq!(bounded.history, history(&["s1", "s2", "s3"]));
    }

    #[test]
    fn a_long_chain_keeps_its_latest_outputs_whole() {
        let mut windows = Windows::new(1);
        let steps: Vec<String> = (0..250).map(|step| format!("s{step}")).collect();
        for (step, id) in steps.iter().enumerate() {
            let reused = step.min(99);
            let mut next = assignment("e", history(&[id]), (reused as u32, 0));
            let whole = windows.whole(&mut next, memory(&[id])).unwrap();
            // The latest first: this step's, then the 99 before it at most.
            let latest: Vec<&str> = steps[step.saturating_sub(99)..=step].iter().rev().map(String::as_str).collect();
            assert_eq!(whole, memory(&latest), "step {step}");
            assert_eq!(whole.step_ids().unwrap(), latest);
            assert_eq!(whole.decode().unwrap().fields.len(), latest.len());
        }
    }

    #[test]
    fn the_window_left_behind_is_the_one_assigned_longest_ago() {
        let mut windows = Windows::new(2);
        for execution in ["a", "b", "a", "c"] {
            windows.whole(&mut assignment(execution, history(&["s0"]), (0, 0)), memory(&["s0"])).unwrap();
        }
        // b's came before a's latest: b's window went, a's and c's stay.
        let reuse = |windows: &mut Windows, execution: &str| {
            windows.whole(&mut assignment(execution, history(&["s1"]), (1, 1)), memory(&["s1"])).is_ok()
        };
        assert!(!reuse(&mut windows, "b"));
        assert!(reuse(&mut windows, "a"));
        assert!(reuse(&mut windows, "c"));
        assert_eq!((windows.latest.len(), windows.order.len()), (2, 2));
    }

    #[test]
    fn a_window_not_kept_is_an_error() {
        let mut windows = Windows::new(1);
        let mut unknown = assignment("e", Vec::new(), (1, 0));
        let error = windows.whole(&mut unknown, SharedMemory::default()).unwrap_err();
        assert!(error.to_string().contains("does not keep"), "{error}");
        let mut first = assignment("e", history(&["s0"]), (0, 0));
        windows.whole(&mut first, memory(&["s0"])).unwrap();
        // More than it holds.
        let too_many = windows.whole(&mut assignment("e", Vec::new(), (2, 0)), SharedMemory::default());
        assert!(too_many.is_err());
        let too_long = windows.whole(&mut assignment("e", Vec::new(), (0, 2)), SharedMemory::default());
        assert!(too_long.is_err());
        // Another execution's assignment pushes e's window out.
        windows.whole(&mut assignment("other", Vec::new(), (0, 0)), memory(&["x"])).unwrap();
        assert!(windows.whole(&mut assignment("e", Vec::new(), (1, 1)), SharedMemory::default()).is_err());
        // A worker that keeps none keeps nothing.
        let mut none = Windows::new(0);
        none.whole(&mut assignment("e", history(&["s0"]), (0, 0)), memory(&["s0"])).unwrap();
        assert!(none.whole(&mut assignment("e", Vec::new(), (1, 0)), SharedMemory::default()).is_err());
    }
}
