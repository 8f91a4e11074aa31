//! The tools workers provide: listed by name, and a call sent to the least
//! busy worker providing it (one connected here first), its answer going
//! back to the caller.

use std::collections::HashMap;

use tokio::sync::oneshot;

use super::{ToWorker, Workers};
use crate::domain::model::{Tool, ToolCall, ToolOutput};

impl Workers {
    /// The tools connected workers provide, one entry per name, ordered by name.
    pub(crate) fn tools(&self) -> Vec<Tool> {
        let state = self.lock();
        let mut tools: HashMap<&str, &Tool> = HashMap::new();
        for worker in state.workers.values() {
            for tool in &worker.connection.tools {
                tools.entry(tool.name.as_str()).or_insert(tool);
            }
        }
        let mut tools: Vec<Tool> = tools.into_values().cloned().collect();
        tools.sort_by(|left, right| left.name.cmp(&right.name));
        tools
    }

    /// The tool a connected worker provides under `name`, if any.
    pub(crate) fn tool(&self, name: &str) -> Option<Tool> {
        let state = self.lock();
        state.workers.values().flat_map(|worker| &worker.connection.tools).find(|tool| tool.name == name).cloned()
    }

    /// Sends a tool call to a worker providing the tool (the least busy, one
    /// connected here first); `None` when no connected worker provides it.
    pub(crate) fn call_tool(&self, call: ToolCall) -> Option<oneshot::Receiver<ToolOutput>> {
        self.call_tool_on(call, false)
    }

    /// Like [`Workers::call_tool`], for a call another replica relayed: only
    /// a worker connected here takes it.
    pub(crate) fn call_local_tool(&self, call: ToolCall) -> Option<oneshot::Receiver<ToolOutput>> {
        self.call_tool_on(call, true)
    }

    fn call_tool_on(&self, call: ToolCall, local_only: bool) -> Option<oneshot::Receiver<ToolOutput>> {
        let mut state = self.lock();
        let (worker_id, sender) = state
            .workers
            .iter()
            .filter(|(_, worker)| {
                !(local_only && worker.is_relay()) && worker.connection.tools.iter().any(|tool| tool.name == call.tool)
            })
            .min_by_key(|(worker_id, worker)| (worker.is_relay(), worker.in_flight, **worker_id))
            .map(|(worker_id, worker)| (*worker_id, worker.connection.sender.clone()))?;
        let (reply, receiver) = oneshot::channel();
        let call_id = call.call_id.clone();
        state.tool_calls.insert(call_id.clone(), (worker_id, reply));
        if sender.send(ToWorker::ToolCall(call)).is_err() {
            state.tool_calls.remove(&call_id);
            return None;
        }
        Some(receiver)
    }

    /// Records a worker's answer to one of its tool calls; others are ignored.
    pub(crate) fn complete_tool_call(&self, worker_id: u64, call_id: &str, output: ToolOutput) {
        let mut state = self.lock();
        if state.tool_calls.get(call_id).is_some_and(|(owner, _)| *owner == worker_id)
            && let Some((_, reply)) = state.tool_calls.remove(call_id)
        {
            let _ = reply.send(output);
        }
    }

    /// Forgets a call that timed out.
    pub(crate) fn abandon_tool_call(&self, call_id: &str) {
        self.lock().tool_calls.remove(call_id);
    }
}
