//! The behaviour `muster agent` and `muster demo` serve agents with: an
//! agent whose `llm_config` names a provider is run by its model (the
//! `muster-agent` crate); the others keep the deterministic sample
//! behaviour, whose tools the worker provides.

use muster_agent::ModelAgent;
use muster_proto::execution::v1::{Assignment, ToolCall, ToolOutput, ToolSpec};

use crate::{
    sample::SampleBehaviour,
    worker::{Behaviour, Step, StepOutcome},
};

/// Model-driven agents beside sample ones.
#[derive(Debug)]
pub struct Agents {
    model: ModelAgent,
    max_concurrency: u32,
}

impl Agents {
    /// Agents run by `model` when they have a provider, by the sample
    /// behaviour otherwise, as many at once as the worker library's default.
    pub fn new(model: ModelAgent) -> Self {
        Self { model, max_concurrency: crate::worker::DEFAULT_MAX_CONCURRENCY }
    }

    /// At most `max_concurrency` assignments at once.
    pub fn with_max_concurrency(self, max_concurrency: u32) -> Self {
        Self { max_concurrency, ..self }
    }
}

impl Behaviour for Agents {
    async fn run(&self, assignment: Assignment, step: Step) -> StepOutcome {
        if ModelAgent::serves(&assignment) {
            self.model.run_step(assignment, step).await
        } else {
            SampleBehaviour.run(assignment, step).await
        }
    }

    fn tools(&self) -> Vec<ToolSpec> {
        SampleBehaviour.tools()
    }

    fn max_concurrency(&self) -> u32 {
        self.max_concurrency
    }

    async fn call_tool(&self, call: ToolCall) -> ToolOutput {
        SampleBehaviour.call_tool(call).await
    }
}
