//! The windows a worker keeps (`WorkerHello.keeps_windows`): for each of
//! the latest executions a worker's stream sent a step of, the shared memory
//! and history of that execution's latest assignment on it. The next
//! assignment of the execution carries only what changed: in a chain, one
//! output and one history entry instead of a hundred of each.
//!
//! Both sides follow the same rule, over the same assignments in the same
//! order: the worker keeps the windows of the `N` executions it was most
//! recently assigned a step of, this side counts the `min(N, 1024)` it most
//! recently sent one of, so what it counts the worker still keeps. A message
//! relayed from another replica goes on the stream without this side
//! knowing what it carries: from then on, the stream's assignments carry
//! their windows whole.
//!
//! What the stream counts does not keep outputs alive: an execution that
//! ended and is still counted holds its outputs' places, not their text.

use std::{
    collections::HashMap,
    sync::{Arc, Weak},
};

use crate::domain::model::{Assignment, HistoryEntry, MemoryOutput};

/// Most executions whose windows a stream counts on a worker keeping.
const MOST_WINDOWS: usize = 1024;

/// What a worker's stream counts on it keeping.
#[derive(Debug, Default)]
pub(super) struct Windows {
    /// How many executions' windows it counts (0: none).
    capacity: usize,
    /// Assignments sent, to order the executions by their latest.
    sent: u64,
    latest: HashMap<String, Latest>,
}

/// An execution's latest assignment on the stream: when it went, and its
/// window (its outputs by reference: a place is never reused while a
/// `Weak` holds it, so the same place is the same output).
#[derive(Debug)]
struct Latest {
    sent: u64,
    memory: Vec<Weak<MemoryOutput>>,
    history: Arc<[HistoryEntry]>,
}

/// How much of an assignment's window the worker has from the one before.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Reuse {
    /// The shared memory's last entries, the first of the one before's.
    pub(crate) memory: usize,
    /// The history's first entries, the last of the one before's.
    pub(crate) history: usize,
}

impl Windows {
    /// For a worker that keeps `kept` executions' windows.
    pub(super) fn new(kept: u32) -> Self {
        Self { capacity: (kept as usize).min(MOST_WINDOWS), ..Self::default() }
    }

    /// How much of `assignment`'s window the worker has.
    pub(super) fn reuse(&self, assignment: &Assignment) -> Reuse {
        let Some(latest) = self.latest.get(&assignment.execution_id) else { return Reuse::default() };
        Reuse {
            memory: memory_reused(&assignment.shared_memory.outputs, &latest.memory),
            history: history_reused(&assignment.history, &latest.history),
        }
    }

    /// `assignment` went on the stream.
    pub(super) fn sent(&mut self, assignment: &Assignment) {
        if self.capacity == 0 {
            return;
        }
        self.sent += 1;
        let latest = Latest {
            sent: self.sent,
            memory: assignment.shared_memory.outputs.iter().map(Arc::downgrade).collect(),
            history: assignment.history.clone(),
        };
        self.latest.insert(assignment.execution_id.clone(), latest);
        if self.latest.len() > self.capacity {
            let oldest = self.latest.iter().min_by_key(|(_, latest)| latest.sent).map(|(id, _)| id.clone());
            if let Some(oldest) = oldest {
                self.latest.remove(&oldest);
            }
        }
    }

    /// A message from another replica went on the stream, unread here.
    pub(super) fn relayed(&mut self) {
        self.capacity = 0;
        self.latest = HashMap::new();
    }
}

/// How many of `memory`'s last entries are the first of `before`'s (newest
/// first both): in a chain, all but the output of the step just ended.
fn memory_reused(memory: &[Arc<MemoryOutput>], before: &[Weak<MemoryOutput>]) -> usize {
    let same = |output: &Arc<MemoryOutput>, kept: &Weak<MemoryOutput>| std::ptr::eq(Arc::as_ptr(output), kept.as_ptr());
    let Some(first) = before.first() else { return 0 };
    let Some(start) = memory.iter().position(|output| same(output, first)) else { return 0 };
    let reused = &memory[start..];
    let continues = reused.len() <= before.len() && reused.iter().zip(before).all(|(one, kept)| same(one, kept));
    if continues { reused.len() } else { 0 }
}

/// How many of `history`'s first entries are the last of `before`'s
/// (oldest first both): in a chain, all but the step just ended.
fn history_reused(history: &[HistoryEntry], before: &[HistoryEntry]) -> usize {
    let Some(first) = history.first() else { return 0 };
    let Some(start) = before.iter().position(|entry| entry == first) else { return 0 };
    let reused = &before[start..];
    if reused.len() <= history.len() && history[..reused.len()] == *reused { reused.len() } else { 0 }
}

#[cfg(test)]
mod tests {
    use std::sync::OnceLock;

    use super::*;
    use crate::domain::model::{AgentContext, SharedMemory};

    fn output(step_id: &str) -> Arc<MemoryOutput> {
        Arc::new(MemoryOutput { step_id: step_id.to_owned(), output: "{}".into(), encoded: OnceLock::new() })
    }

    fn entry(step_id: &str) -> HistoryEntry {
        HistoryEntry { step_id: step_id.to_owned(), agent_id: "doer".to_owned(), action: "completed", at: Some(1) }
    }

    fn assignment(execution_id: &str, memory: &[Arc<MemoryOutput>], history: &[HistoryEntry]) -> Assignment {
        Assignment {
            assignment_id: format!("{execution_id}/s/1"),
            idempotency_key: String::new(),
            attempt: 1,
            agent_id: "doer".to_owned(),
            execution_id: execution_id.to_owned(),
            process_name: String::new(),
            process_version: 1,
            step_id: String::new(),
            step_name: String::new(),
            step_type: String::new(),
            message: String::new(),
            inputs_json: String::new(),
            upstream_outputs: Default::default(),
            payload_refs: Vec::new(),
            shared_memory: Arc::new(SharedMemory { outputs: memory.to_vec(), encoded: OnceLock::new() }),
            shared_memory_left_out: 0,
            history: history.into(),
            context: Arc::new(AgentContext::default()),
            roles: Default::default(),
            delegation_chain: Vec::new(),
            timeout_ms: 0,
            trace_parent: String::new(),
            session_role: String::new(),
            session_context: String::new(),
        }
    }

    #[test]
    fn a_chain_step_carries_only_the_output_and_the_history_entry_of_the_step_before() {
        let outputs: Vec<_> = (0..5).map(|index| output(&format!("s{index}"))).collect();
        let entries: Vec<_> = (0..5).map(|index| entry(&format!("s{index}"))).collect();
        let mut windows = Windows::new(4);
        // s2 sees s1 and s0 (the latest first); s3 sees s2, s1, s0; s4, at
        // most three, s3, s2, s1.
        let s2 = assignment("e", &[outputs[1].clone(), outputs[0].clone()], &entries[..2]);
        assert_eq!(windows.reuse(&s2), Reuse::default(), "nothing sent before");
        windows.sent(&s2);
        let s3 = assignment("e", &[outputs[2].clone(), outputs[1].clone(), outputs[0].clone()], &entries[..3]);
        assert_eq!(windows.reuse(&s3), Reuse { memory: 2, history: 2 });
        windows.sent(&s3);
        let s4 = assignment("e", &[outputs[3].clone(), outputs[2].clone(), outputs[1].clone()], &entries[1..4]);
        assert_eq!(windows.reuse(&s4), Reuse { memory: 2, history: 2 });
        // A retry of s4 sees what s4 saw: all of it.
        windows.sent(&s4);
        assert_eq!(windows.reuse(&s4), Reuse { memory: 3, history: 3 });
        // Another execution's window is its own.
        let other = assignment("other", &[outputs[3].clone()], &entries[3..4]);
        assert_eq!(windows.reuse(&other), Reuse::default());
        // A window that does not continue the one before is sent whole.
        let apart =
            assignment("e", &[outputs[4].clone(), outputs[2].clone()], &[entries[0].clone(), entries[4].clone()]);
        assert_eq!(windows.reuse(&apart), Reuse::default());
        let outputs_changed = [output("s3"), outputs[2].clone(), outputs[1].clone()];
        assert_eq!(windows.reuse(&assignment("e", &outputs_changed, &[])).memory, 0, "an output of another make");
        // What is counted keeps no output alive.
        drop((s2, s3, s4, other, apart, outputs_changed));
        assert!(outputs.iter().all(|output| Arc::strong_count(output) == 1));
    }

    #[test]
    fn the_windows_counted_are_the_latest_executions_and_none_after_a_relayed_message() {
        let outputs = [output("s0")];
        let window = |execution: &str| assignment(execution, &outputs, &[entry("s0")]);
        let mut windows = Windows::new(2);
        for execution in ["a", "b", "a", "c"] {
            windows.sent(&window(execution));
        }
        // b was the least recent of three: the worker no longer keeps it.
        assert_eq!(windows.reuse(&window("a")), Reuse { memory: 1, history: 1 });
        assert_eq!(windows.reuse(&window("b")), Reuse::default());
        assert_eq!(windows.reuse(&window("c")), Reuse { memory: 1, history: 1 });
        windows.relayed();
        windows.sent(&window("a"));
        assert_eq!(windows.reuse(&window("a")), Reuse::default());
        // A worker that keeps none is counted on for none.
        let mut none = Windows::new(0);
        none.sent(&window("a"));
        assert_eq!(none.reuse(&window("a")), Reuse::default());
        assert_eq!(Windows::new(u32::MAX).capacity, MOST_WINDOWS);
    }
}
