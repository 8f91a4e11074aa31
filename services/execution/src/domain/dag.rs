//! The order steps may run in: each step's dependencies and dependants by
//! position, and whether a waiting step may start, must fail because a
//! dependency failed, or waits on. The driver asks only about the
//! dependants of a step that just ended, so a run costs time in proportion
//! to its edges, not to its steps squared.

use muster_format::ProcessDefinition;

use super::{StepStatus, model::Step};

/// The dependency graph of a process, by step position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dag {
    dependencies: Vec<Vec<usize>>,
    dependants: Vec<Vec<usize>>,
    continue_on_failure: Vec<bool>,
}

/// What a pending step's dependencies allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// Every dependency is done: it may start.
    Ready,
    /// Some dependency has not ended yet.
    Waiting,
    /// This dependency failed (or was cancelled) and does not let its
    /// dependants go on.
    Blocked(usize),
}

impl Dag {
    /// The graph of a checked process (step ids unique, references known).
    pub fn new(definition: &ProcessDefinition) -> Self {
        let index: std::collections::HashMap<&str, usize> =
            definition.steps.iter().enumerate().map(|(position, step)| (step.id.as_str(), position)).collect();
        let mut dependencies = vec![Vec::new(); definition.steps.len()];
        let mut dependants = vec![Vec::new(); definition.steps.len()];
        for (position, step) in definition.steps.iter().enumerate() {
            for dependency in &step.depends_on {
                if let Some(&on) = index.get(dependency.as_str()) {
                    dependencies[position].push(on);
                    dependants[on].push(position);
                }
            }
        }
        let continue_on_failure = definition.steps.iter().map(|step| step.continue_on_failure).collect();
        Self { dependencies, dependants, continue_on_failure }
    }

    /// The positions of the steps the step at `position` depends on.
    pub fn dependencies(&self, position: usize) -> &[usize] {
        &self.dependencies[position]
    }

    /// The positions of the steps that depend on the step at `position`.
    pub fn dependants(&self, position: usize) -> &[usize] {
        &self.dependants[position]
    }

    /// Whether the step at `position` may start, given the steps' states.
    pub fn readiness(&self, position: usize, steps: &[Step]) -> Readiness {
        let mut waiting = false;
        for &dependency in &self.dependencies[position] {
            match steps[dependency].status {
                StepStatus::Completed => {}
                StepStatus::Failed | StepStatus::Cancelled if self.continue_on_failure[dependency] => {}
                StepStatus::Failed | StepStatus::Cancelled => return Readiness::Blocked(dependency),
                _ => waiting = true,
            }
        }
        if waiting { Readiness::Waiting } else { Readiness::Ready }
    }

    /// The steps reachable from `position` through dependants, each once, in
    /// breadth-first order (without `position` itself).
    pub fn downstream(&self, position: usize) -> Vec<usize> {
        walk(&self.dependants, position, usize::MAX)
    }

    /// The steps `position` builds on: its dependencies, theirs, and so on,
    /// each once, nearest first (breadth-first), at most `limit` of them.
    /// The walk stops at `limit`, so a step deep in a long chain costs as
    /// little as one near its start.
    pub fn upstream(&self, position: usize, limit: usize) -> Vec<usize> {
        walk(&self.dependencies, position, limit)
    }
}

/// The steps reachable from `position` along `edges`, each once, in
/// breadth-first order (without `position` itself), at most `limit` of
/// them. What it has seen is kept in a set, not a flag per step, so a
/// short walk costs nothing in proportion to the process's size; both are
/// sized for the whole walk at once (a chain's walk goes `limit` steps).
fn walk(edges: &[Vec<usize>], position: usize, limit: usize) -> Vec<usize> {
    let most = limit.min(edges.len());
    let mut order = Vec::with_capacity(most);
    let mut seen =
        std::collections::HashSet::with_capacity_and_hasher(most + 1, foldhash::fast::RandomState::default());
    seen.insert(position);
    let mut next = 0;
    let mut from = position;
    loop {
        for &to in &edges[from] {
            if order.len() == limit {
                return order;
            }
            if seen.insert(to) {
                order.push(to);
            }
        }
        let Some(&following) = order.get(next) else { return order };
        from = following;
        next += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn definition(yaml: &str) -> ProcessDefinition {
        let report = muster_format::validate_process(yaml, &muster_format::Context::default());
        report.process.unwrap_or_else(|| panic!("{:?}", report.diagnostics))
    }

    fn steps(statuses: &[StepStatus]) -> Vec<Step> {
        statuses.iter().map(|status| Step { status: *status, ..Step::new() }).collect()
    }

    const DIAMOND: &str = "name: d\nsteps:\n\
        \x20 - {id: a, type: agent_task, agent: x, message: m}\n\
        \x20 - {id: b, type: agent_task, agent: x, message: m, depends_on: [a]}\n\
        \x20 - {id: c, type: agent_task, agent: x, message: m, depends_on: [a], continue_on_failure: true}\n\
        \x20 - {id: d, type: agent_task, agent: x, message: m, depends_on: [b, c]}\n";

    #[test]
    fn a_step_waits_for_every_dependency() {
        use StepStatus::*;
        let dag = Dag::new(&definition(DIAMOND));
        assert_eq!(dag.dependants(0), &[1, 2]);
        assert_eq!(dag.dependencies(3), &[1, 2]);
        assert_eq!(dag.readiness(0, &steps(&[Pending, Pending, Pending, Pending])), Readiness::Ready);
        assert_eq!(dag.readiness(3, &steps(&[Completed, Completed, Running, Pending])), Readiness::Waiting);
        assert_eq!(dag.readiness(3, &steps(&[Completed, Completed, Completed, Pending])), Readiness::Ready);
    }

    #[test]
    fn a_failure_blocks_unless_the_step_lets_its_dependants_go_on() {
        use StepStatus::*;
        let dag = Dag::new(&definition(DIAMOND));
        assert_eq!(dag.readiness(3, &steps(&[Completed, Completed, Failed, Pending])), Readiness::Ready);
        assert_eq!(dag.readiness(3, &steps(&[Completed, Cancelled, Completed, Pending])), Readiness::Blocked(1));
    }

    #[test]
    fn downstream_lists_each_reachable_step_once() {
        let dag = Dag::new(&definition(DIAMOND));
        assert_eq!(dag.downstream(0), vec![1, 2, 3]);
        assert_eq!(dag.downstream(3), Vec::<usize>::new());
    }

    #[test]
    fn upstream_lists_what_a_step_builds_on_nearest_first_up_to_a_limit() {
        let dag = Dag::new(&definition(DIAMOND));
        assert_eq!(dag.upstream(3, 10), vec![1, 2, 0], "a, reached through b and through c, once");
        assert_eq!(dag.upstream(3, 2), vec![1, 2]);
        assert_eq!(dag.upstream(1, 10), vec![0]);
        assert_eq!(dag.upstream(0, 10), Vec::<usize>::new());
        let mut chain = String::from("name: c\nsteps:\n  - {id: s0, type: agent_task, agent: x, message: m}\n");
        for index in 1..500 {
            chain.push_str(&format!(
                "  - {{id: s{index}, type: agent_task, agent: x, message: m, depends_on: [s{}]}}\n",
                index - 1
            ));
        }
        let dag = Dag::new(&definition(&chain));
        assert_eq!(dag.upstream(499, 3), vec![498, 497, 496]);
        assert_eq!(dag.upstream(2, 100), vec![1, 0]);
    }
}
