//! Dependency rules: unknown references, cycles (named in full) and steps that
//! can never run because they wait on a cycle.

use std::collections::HashMap;

use super::diagnostic::{Diagnostics, Position, index_path};

/// One `depends_on` entry as written.
pub(crate) struct Dependency<'a> {
    pub(crate) target: &'a str,
    /// Its index in the step's `depends_on` (for the path of a finding).
    pub(crate) index: usize,
    pub(crate) at: Position,
}

/// A step as the graph rules see it.
pub(crate) struct GraphStep<'a> {
    pub(crate) id: &'a str,
    /// Its index in `steps`.
    pub(crate) index: usize,
    pub(crate) at: Position,
    pub(crate) depends_on: Vec<Dependency<'a>>,
}

impl GraphStep<'_> {
    fn path(&self) -> String {
        index_path("steps", self.index)
    }
}

/// Edges of a graph in one buffer: node `n`'s are
/// `targets[offsets[n]..offsets[n + 1]]`.
struct Adjacency {
    offsets: Vec<usize>,
    targets: Vec<usize>,
}

impl Adjacency {
    fn of(&self, node: usize) -> &[usize] {
        &self.targets[self.offsets[node]..self.offsets[node + 1]]
    }

    /// The same edges, reversed.
    fn reversed(&self) -> Adjacency {
        let nodes = self.offsets.len() - 1;
        let mut offsets = vec![0; nodes + 1];
        for target in &self.targets {
            offsets[target + 1] += 1;
        }
        for node in 0..nodes {
            offsets[node + 1] += offsets[node];
        }
        let mut next = offsets.clone();
        let mut targets = vec![0; self.targets.len()];
        for node in 0..nodes {
            for target in self.of(node) {
                targets[next[*target]] = node;
                next[*target] += 1;
            }
        }
        Adjacency { offsets, targets }
    }
}

/// Reports unknown references (DEP001), self references (DEP004), each cycle
/// once (DEP002) and steps downstream of a cycle (DEP003). `index_of` gives
/// each id's first step in `steps`.
pub(crate) fn check_dependencies(
    steps: &[GraphStep<'_>],
    index_of: &HashMap<&str, usize>,
    diagnostics: &mut Diagnostics,
) {
    let mut edges = Adjacency { offsets: Vec::with_capacity(steps.len() + 1), targets: Vec::new() };
    edges.offsets.push(0);
    let mut suggester = super::formats::Suggester::new();
    let mut ids: Option<Vec<&str>> = None;
    for (index, step) in steps.iter().enumerate() {
        for dependency in &step.depends_on {
            let path = || format!("{}.depends_on[{}]", step.path(), dependency.index);
            match index_of.get(dependency.target) {
                Some(&target) if target == index => {
                    diagnostics.error("DEP004", &path(), dependency.at, format!("step '{}' depends on itself", step.id))
                }
                Some(&target) => edges.targets.push(target),
                None => {
                    let ids = ids.get_or_insert_with(|| steps.iter().map(|step| step.id).collect());
                    diagnostics.error(
                        "DEP001",
                        &path(),
                        dependency.at,
                        format!(
                            "step '{}' depends on unknown step '{}'{}",
                            step.id,
                            dependency.target,
                            suggester.suggest(dependency.target, ids)
                        ),
                    );
                }
            }
        }
        edges.offsets.push(edges.targets.len());
    }

    // Iterative depth-first search; colours: 0 new, 1 on the path, 2 done.
    let mut colour = vec![0u8; steps.len()];
    let mut in_cycle = vec![false; steps.len()];
    for start in 0..steps.len() {
        if colour[start] != 0 {
            continue;
        }
        let mut path: Vec<(usize, usize)> = vec![(start, 0)];
        colour[start] = 1;
        while let Some(&mut (node, ref mut next)) = path.last_mut() {
            if let Some(&target) = edges.of(node).get(*next) {
                *next += 1;
                match colour[target] {
                    0 => {
                        colour[target] = 1;
                        path.push((target, 0));
                    }
                    1 => {
                        let from = path.iter().position(|(member, _)| *member == target).unwrap_or(0);
                        let members: Vec<usize> = path[from..].iter().map(|(member, _)| *member).collect();
                        report_cycle(steps, &members, diagnostics);
                        for member in members {
                            in_cycle[member] = true;
                        }
                    }
                    _ => {}
                }
            } else {
                colour[node] = 2;
                path.pop();
            }
        }
    }

    // Steps that wait, directly or not, on a step of a cycle never run.
    let mut queue: Vec<usize> = (0..steps.len()).filter(|index| in_cycle[*index]).collect();
    if queue.is_empty() {
        return;
    }
    let dependants = edges.reversed();
    let mut blocked = in_cycle.clone();
    while let Some(node) = queue.pop() {
        for dependant in dependants.of(node) {
            if !blocked[*dependant] {
                blocked[*dependant] = true;
                queue.push(*dependant);
            }
        }
    }
    for (index, step) in steps.iter().enumerate() {
        if blocked[index] && !in_cycle[index] {
            diagnostics.warning(
                "DEP003",
                &step.path(),
                step.at,
                format!("step '{}' can never run: it waits on a dependency cycle", step.id),
            );
        }
    }
}

/// Reports a cycle at the step of the cycle that comes first in the source,
/// as `a -> b -> c -> a` where `->` reads "depends on".
fn report_cycle(steps: &[GraphStep<'_>], members: &[usize], diagnostics: &mut Diagnostics) {
    let Some(first) = members.iter().enumerate().min_by_key(|(_, member)| **member).map(|(offset, _)| offset) else {
        return;
    };
    let mut names: Vec<&str> =
        members[first..].iter().chain(&members[..first]).map(|member| steps[*member].id).collect();
    names.push(steps[members[first]].id);
    let step = &steps[members[first]];
    diagnostics.error(
        "DEP002",
        &step.path(),
        step.at,
        format!("dependency cycle: {} (each step depends on the next)", names.join(" -> ")),
    );
}
