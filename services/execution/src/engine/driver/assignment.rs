//! What an assignment carries: the step's inputs merged over the
//! execution's, and the history and shared memory of the steps it builds
//! on (the nearest that ended, bounded in steps and bytes), built once for
//! the steps that depend on the same steps.

use std::sync::{Arc, OnceLock};

use super::{
    Driver, HISTORY_ENTRIES, KEPT_MEMORY_OUTPUTS, Known, SHARED_MEMORY_BYTES, SHARED_MEMORY_STEPS, Upstream, step_roles,
};
use crate::domain::{
    StepStatus,
    model::{AgentContext, Assignment, HistoryEntry, MemoryOutput, SharedMemory},
    payload,
};

impl Driver {
    pub(in crate::engine) fn assignment_id(&self, position: usize) -> String {
        format!("{}/{}/{}", self.execution.id, self.definition(position).id, self.steps[position].attempt)
    }

    /// The assignment of a step's current attempt, with its task context.
    pub(super) fn assignment(&self, position: usize, upstream: Upstream) -> Assignment {
        let definition = self.definition(position);
        let step = &self.steps[position];
        let context = match self.contexts.get(&step.executor) {
            Some(Known::Ready(context)) => context.clone(),
            _ => Arc::new(AgentContext::default()),
        };
        let upstream_outputs = self
            .dag
            .dependencies(position)
            .iter()
            .filter(|dependency| self.steps[**dependency].status == StepStatus::Completed)
            .filter_map(|dependency| {
                let output = self.steps[*dependency].output_json.clone()?;
                Some((self.definition(*dependency).id.clone(), output))
            })
            .collect();
        let carried = payload::split(&definition.id, self.merged_inputs(&definition.inputs_json), upstream_outputs);
        let (session_role, session_context) = match &self.execution.session {
            Some(session) => (
                crate::engine::session::admit(
                    &self.engine.matrix(),
                    &self.execution.lead_agent_id,
                    session,
                    &step.executor,
                    definition.action.as_deref(),
                )
                .unwrap_or_default(),
                crate::domain::session::context_window(
                    &self.execution.id,
                    session,
                    &self.execution.lead_agent_id,
                    &crate::engine::step_views(&self.steps, &self.process.definition),
                ),
            ),
            None => (String::new(), String::new()),
        };
        let span = self.spans[position].as_ref().cloned().unwrap_or_else(tracing::Span::current);
        Assignment {
            assignment_id: self.assignment_id(position),
            idempotency_key: self.task_id(position),
            attempt: step.attempt,
            agent_id: step.executor.clone(),
            execution_id: self.execution.id.clone(),
            process_name: self.execution.process_name.clone(),
            process_version: self.execution.process_version,
            step_id: definition.id.clone(),
            step_name: definition.name.clone(),
            step_type: definition.step_type.clone(),
            message: definition.message.clone(),
            inputs_json: carried.inputs_json,
            upstream_outputs: carried.upstream_outputs,
            payload_refs: carried.payload_refs,
            shared_memory: upstream.shared_memory,
            shared_memory_left_out: upstream.left_out,
            history: upstream.history,
            context,
            roles: step_roles(definition),
            delegation_chain: step.delegation_chain.clone(),
            timeout_ms: definition.timeout_seconds.map_or(0, |seconds| seconds * 1000),
            trace_parent: muster_runtime::telemetry::traceparent(&span),
            session_role,
            session_context,
        }
    }

    /// The execution's inputs overlaid with the step's own, as JSON text.
    pub(super) fn merged_inputs(&self, step_inputs: &str) -> String {
        payload::merge_inputs(&self.execution_inputs, step_inputs)
    }

    /// The history and shared memory of the steps `position` builds on:
    /// the nearest of them ([`Dag::upstream`]) that ended, in the order
    /// they ended, and the outputs of the latest completed ones that fit.
    /// Nothing that runs beside the step, so an attempt sees the same
    /// whenever it starts.
    pub(super) fn upstream(&mut self, position: usize) -> Upstream {
        let dependencies = self.dag.dependencies(position);
        if let Some((built_for, upstream)) = &self.upstream
            && built_for.as_slice() == dependencies
        {
            return upstream.clone();
        }
        let dependencies = dependencies.to_vec();
        let mut ended = self.dag.upstream(position, HISTORY_ENTRIES.max(SHARED_MEMORY_STEPS));
        ended.retain(|&step| self.steps[step].status.is_final());
        ended.sort_by_key(|&step| (self.steps[step].ended_at, step));
        let (shared_memory, left_out) = self.shared_memory(&ended);
        let upstream =
            Upstream { history: self.history(&ended).into(), shared_memory: Arc::new(shared_memory), left_out };
        self.upstream = Some((dependencies, upstream.clone()));
        upstream
    }

    /// The outputs of the latest completed of `ended` that fit, newest
    /// first, and how many completed steps of the execution it leaves out.
    /// An output kept from an earlier memory comes with its encoded form.
    pub(super) fn shared_memory(&mut self, ended: &[usize]) -> (SharedMemory, u32) {
        let mut outputs = Vec::new();
        let mut bytes = 0;
        for &position in ended.iter().rev() {
            if outputs.len() >= SHARED_MEMORY_STEPS {
                break;
            }
            let step = &self.steps[position];
            let Some(output) = step.output_json.as_ref().filter(|_| step.status == StepStatus::Completed) else {
                continue;
            };
            if bytes + output.len() > SHARED_MEMORY_BYTES {
                break;
            }
            bytes += output.len();
            let entry = match self.memory_outputs.get(&position) {
                Some(entry) if Arc::ptr_eq(&entry.output, output) => entry.clone(),
                _ => {
                    let entry = Arc::new(MemoryOutput {
                        step_id: self.definition(position).id.clone(),
                        output: output.clone(),
                        encoded: OnceLock::new(),
                    });
                    self.memory_outputs.insert(position, entry.clone());
                    entry
                }
            };
            outputs.push(entry);
        }
        if self.memory_outputs.len() > KEPT_MEMORY_OUTPUTS {
            self.memory_outputs.retain(|_, kept| outputs.iter().any(|output| Arc::ptr_eq(output, kept)));
        }
        let left_out = self.completed.saturating_sub(outputs.len());
        (SharedMemory { outputs, encoded: OnceLock::new() }, u32::try_from(left_out).unwrap_or(u32::MAX))
    }

    /// The last of `ended`, oldest first.
    pub(super) fn history(&self, ended: &[usize]) -> Vec<HistoryEntry> {
        let start = ended.len().saturating_sub(HISTORY_ENTRIES);
        ended[start..]
            .iter()
            .map(|&position| {
                let step = &self.steps[position];
                HistoryEntry {
                    step_id: self.definition(position).id.clone(),
                    agent_id: step.executor.clone(),
                    action: step.status.as_str(),
                    at: step.ended_at,
                }
            })
            .collect()
    }
}
