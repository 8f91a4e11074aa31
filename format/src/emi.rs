//! The EMI rules for a step's `roles` (executor, monitors, informed): `roles`
//! is a mapping with a non-empty string executor, and `monitors` and
//! `informed` are lists of strings; an agent named in two of them draws a
//! warning. The conditions are checked in a fixed order, with fixed messages;
//! each finding is positioned at the offending node.

use super::diagnostic::{Diagnostics, child_path, index_path};
use super::formats::suggestion;
use super::model::StepRoles;
use super::yaml::Node;

const ROLE_FIELDS: [&str; 3] = ["executor", "monitors", "informed"];

/// Checks a step's `roles` value; answers the typed roles when they are well formed.
pub(crate) fn check_step_roles(
    step: Node<'_>,
    roles: Node<'_>,
    step_path: &str,
    step_type: &str,
    diagnostics: &mut Diagnostics,
) -> Option<StepRoles> {
    // Paths are built only for findings: most roles are fine.
    let roles_path = || child_path(step_path, "roles");
    if !roles.is_mapping() {
        diagnostics.error("EMI001", &roles_path(), roles.position(), "Field 'roles' must be an object");
        return None;
    }
    for (key, _) in roles.mapping().into_iter().flatten() {
        let name = key.scalar_text().unwrap_or_default();
        if !ROLE_FIELDS.contains(&name) && name != super::yaml::MERGE_KEY {
            diagnostics.warning(
                "EMI008",
                &child_path(&roles_path(), name),
                key.position(),
                format!("unknown field '{name}' in roles{}", suggestion(name, &ROLE_FIELDS)),
            );
        }
    }
    let mut well_formed = true;

    // Executor is required if roles are specified.
    let executor_path = || child_path(&roles_path(), "executor");
    let executor_node = roles.get("executor");
    let executor: Option<&str> = match executor_node {
        Some(node) if node.is_truthy() => match node.as_str() {
            Some(name) => {
                // For agent_task, the executor should match the step's agent.
                if step_type == "agent_task"
                    && let Some(agent) = step.get("agent").filter(Node::is_truthy)
                    && agent.as_str() != Some(name)
                {
                    let shown = agent.scalar_text().unwrap_or("?");
                    diagnostics.warning(
                        "EMI104",
                        &executor_path(),
                        node.position(),
                        format!("Role executor '{name}' differs from step agent '{shown}'"),
                    );
                }
                Some(name)
            }
            None => {
                diagnostics.error("EMI003", &executor_path(), node.position(), "Field 'executor' must be a string");
                well_formed = false;
                None
            }
        },
        _ => {
            // Point at the `executor` value when one is written, else at the
            // `roles` key that lacks it.
            let roles_key = step.key_node("roles").map_or(roles.position(), |key| key.position());
            let at = executor_node.map_or(roles_key, |node| node.position());
            let path = if executor_node.is_some() { executor_path() } else { roles_path() };
            diagnostics.error("EMI002", &path, at, "Roles must include an 'executor' agent");
            well_formed = false;
            None
        }
    };

    let monitors = roles.get("monitors");
    let mut monitor_names: Vec<String> = Vec::new();
    let monitors_path = || child_path(&roles_path(), "monitors");
    if let Some(monitors) = monitors {
        match monitors.sequence() {
            None => {
                diagnostics.error("EMI004", &monitors_path(), monitors.position(), "Field 'monitors' must be a list");
                well_formed = false;
            }
            Some(items) => {
                for (index, monitor) in items.enumerate() {
                    let path = || index_path(&monitors_path(), index);
                    match monitor.as_str() {
                        None => {
                            diagnostics.error(
                                "EMI005",
                                &path(),
                                monitor.position(),
                                "Monitor must be a string (agent name)",
                            );
                            well_formed = false;
                        }
                        Some(name) => {
                            if executor == Some(name) {
                                diagnostics.warning(
                                    "EMI101",
                                    &path(),
                                    monitor.position(),
                                    format!("Agent '{name}' is both executor and monitor (redundant)"),
                                );
                            }
                            monitor_names.push(name.to_owned());
                        }
                    }
                }
            }
        }
    }

    let mut informed_names: Vec<String> = Vec::new();
    let informed_path = || child_path(&roles_path(), "informed");
    if let Some(informed) = roles.get("informed") {
        match informed.sequence() {
            None => {
                diagnostics.error("EMI006", &informed_path(), informed.position(), "Field 'informed' must be a list");
                well_formed = false;
            }
            Some(items) => {
                for (index, agent) in items.enumerate() {
                    let path = || index_path(&informed_path(), index);
                    match agent.as_str() {
                        None => {
                            diagnostics.error("EMI007", &path(), agent.position(), "Informed agent must be a string");
                            well_formed = false;
                        }
                        Some(name) => {
                            if executor == Some(name) {
                                diagnostics.warning(
                                    "EMI102",
                                    &path(),
                                    agent.position(),
                                    format!("Agent '{name}' is both executor and informed (redundant)"),
                                );
                            } else if monitor_names.iter().any(|monitor| monitor == name) {
                                diagnostics.warning(
                                    "EMI103",
                                    &path(),
                                    agent.position(),
                                    format!("Agent '{name}' is in both monitors and informed"),
                                );
                            }
                            informed_names.push(name.to_owned());
                        }
                    }
                }
            }
        }
    }

    match (well_formed, executor) {
        (true, Some(executor)) => {
            Some(StepRoles { executor: executor.to_owned(), monitors: monitor_names, informed: informed_names })
        }
        _ => None,
    }
}
