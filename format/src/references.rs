//! References against the caller's context: unknown or offline agents,
//! unknown roles, actions a role may not perform and tools a role may not use
//! or that are not registered. A rule whose list the context lacks is skipped.

use std::collections::HashMap;

use super::diagnostic::{Diagnostics, Position, child_path, index_path};
use super::formats::Suggester;
use super::model::{Context, DelegationRequest, KnownAgent, KnownRole, StepRoles};
use super::yaml::Node;

/// A named thing in the document, with where it was written.
#[derive(Clone)]
pub(crate) struct Reference<'a> {
    pub(crate) name: &'a str,
    pub(crate) path: String,
    pub(crate) at: Position,
}

/// The fields of a step that name something: `agent`, `tool`, `action`, `approvers`.
pub(crate) struct WrittenNames<'a, 'b> {
    pub(crate) agent: Option<(Node<'a>, &'a str)>,
    pub(crate) tool: Option<(Node<'a>, &'a str)>,
    pub(crate) action: Option<(Node<'a>, &'a str)>,
    pub(crate) approvers: &'b [(Node<'a>, &'a str)],
}

/// What one step refers to.
pub(crate) struct StepReferences<'a> {
    /// (reference, whether the agent executes the step).
    agents: Vec<(Reference<'a>, bool)>,
    executor: Option<Reference<'a>>,
    tool: Option<Reference<'a>>,
    action: Option<Reference<'a>>,
    delegate_role: Option<Reference<'a>>,
}

impl<'a> StepReferences<'a> {
    pub(crate) fn collect(
        step: Node<'a>,
        path: &str,
        written: WrittenNames<'a, '_>,
        roles: &Option<StepRoles>,
        delegate: &Option<(DelegationRequest, Option<Position>)>,
        step_type: &str,
    ) -> Self {
        let WrittenNames { agent, tool, action, approvers } = written;
        // A human approval's executor may be a person or a system, not a roster
        // agent.
        let executor_is_agent = step_type != "human_approval";
        let reference = |field: &str, (node, name): (Node<'a>, &'a str)| Reference {
            name,
            path: child_path(path, field),
            at: node.position(),
        };
        let mut agents = Vec::new();
        let agent_reference = agent.map(|value| reference("agent", value));
        if let Some(agent) = &agent_reference
            && executor_is_agent
        {
            agents.push((agent.clone(), true));
        }
        let mut executor = agent_reference;
        if let (Some(_), Some(roles_node)) = (roles, step.get("roles")) {
            let roles_path = child_path(path, "roles");
            if let Some(node) = roles_node.get("executor")
                && let Some(name) = node.as_str()
            {
                let found = Reference { name, path: child_path(&roles_path, "executor"), at: node.position() };
                if executor_is_agent {
                    agents.push((found.clone(), true));
                }
                executor = Some(found);
            }
            for field in ["monitors", "informed"] {
                let list_path = child_path(&roles_path, field);
                let items = roles_node.get(field).and_then(|node| node.sequence());
                for (index, item) in items.into_iter().flatten().enumerate() {
                    if let Some(name) = item.as_str() {
                        let found = Reference { name, path: index_path(&list_path, index), at: item.position() };
                        agents.push((found, false));
                    }
                }
            }
        }
        // Approvers decide with their own agent token: they are roster agents.
        for (index, (node, name)) in approvers.iter().enumerate() {
            let found =
                Reference { name, path: index_path(&child_path(path, "approvers"), index), at: node.position() };
            agents.push((found, false));
        }
        let delegate_role = match (delegate, step.get("delegate").and_then(|node| node.get("role"))) {
            (Some((request, Some(at))), Some(node)) => request.role.as_ref().and(node.as_str()).map(|name| Reference {
                name,
                path: child_path(&child_path(path, "delegate"), "role"),
                at: *at,
            }),
            _ => None,
        };
        Self {
            agents,
            executor,
            tool: tool.map(|value| reference("tool", value)),
            action: action.map(|value| reference("action", value)),
            delegate_role,
        }
    }
}

/// Runs every reference rule the context allows.
pub(crate) fn check_references(
    context: &Context,
    lead: Option<(Position, &str)>,
    steps: &[StepReferences<'_>],
    diagnostics: &mut Diagnostics,
) {
    let agents: Option<HashMap<&str, &KnownAgent>> =
        context.agents.as_ref().map(|agents| agents.iter().map(|agent| (agent.id.as_str(), agent)).collect());
    let roles: Option<HashMap<&str, &KnownRole>> =
        context.roles.as_ref().map(|roles| roles.iter().map(|role| (role.name.as_str(), role)).collect());
    let tools: Option<Vec<&str>> = context.tools.as_ref().map(|tools| tools.iter().map(String::as_str).collect());
    let agent_ids: Vec<&str> = context.agents.iter().flatten().map(|agent| agent.id.as_str()).collect();
    let role_names: Vec<&str> = context.roles.iter().flatten().map(|role| role.name.as_str()).collect();
    let mut suggester = Suggester::new();

    if let (Some(agents), Some((at, name))) = (&agents, lead) {
        let lead = Reference { name, path: "lead".to_owned(), at };
        check_agent(agents, &agent_ids, &lead, true, &mut suggester, diagnostics);
    }
    for step in steps {
        if let Some(agents) = &agents {
            for (reference, executes) in &step.agents {
                check_agent(agents, &agent_ids, reference, *executes, &mut suggester, diagnostics);
            }
        }
        if let (Some(roles), Some(role)) = (&roles, &step.delegate_role)
            && !roles.contains_key(role.name)
        {
            diagnostics.error(
                "CTX003",
                &role.path,
                role.at,
                format!("unknown role '{}'{}", role.name, suggester.suggest(role.name, &role_names)),
            );
        }
        if let (Some(tools), Some(tool)) = (&tools, &step.tool)
            && !tools.contains(&tool.name)
        {
            // A built-in workspace tool is known, but only to the agent that
            // serves it: the execution service cannot call it for a step.
            let message = if crate::is_builtin_tool(tool.name) {
                format!(
                    "'{}' is a built-in workspace tool of the model-driven agent, not a registered tool: \
                     a tool_call step cannot call it; give the work to an agent_task step whose role lists it",
                    tool.name
                )
            } else {
                format!("unknown tool '{}'{}", tool.name, suggester.suggest(tool.name, tools))
            };
            diagnostics.error("CTX006", &tool.path, tool.at, message);
        }
        let Some(roles) = &roles else { continue };
        // The role whose permissions apply: the executor's, else the delegate role.
        let executor_role = match (&agents, &step.executor) {
            (Some(agents), Some(executor)) => agents
                .get(executor.name)
                .and_then(|agent| agent.role.as_deref())
                .map(|role| (role, format!("agent '{}' has role '{role}'", executor.name))),
            _ => None,
        };
        let applicable = executor_role.or_else(|| {
            step.delegate_role.as_ref().map(|role| (role.name, format!("the step delegates to role '{}'", role.name)))
        });
        let Some((role_name, why)) = applicable else { continue };
        let Some(role) = roles.get(role_name) else { continue };
        if let Some(action) = &step.action
            && !role.permitted_actions.iter().any(|permitted| permitted == action.name)
        {
            diagnostics.error(
                "CTX004",
                &action.path,
                action.at,
                format!("action '{}' is not permitted: {why}, which may not perform it", action.name),
            );
        }
        if let Some(tool) = &step.tool
            && !role.permitted_tools.iter().any(|permitted| permitted == tool.name)
        {
            diagnostics.error(
                "CTX005",
                &tool.path,
                tool.at,
                format!("tool '{}' is not permitted: {why}, which may not use it", tool.name),
            );
        }
    }
}

fn check_agent(
    agents: &HashMap<&str, &KnownAgent>,
    agent_ids: &[&str],
    reference: &Reference<'_>,
    executes: bool,
    suggester: &mut Suggester,
    diagnostics: &mut Diagnostics,
) {
    match agents.get(reference.name) {
        None => diagnostics.error(
            "CTX001",
            &reference.path,
            reference.at,
            format!("unknown agent '{}'{}", reference.name, suggester.suggest(reference.name, agent_ids)),
        ),
        Some(agent) if agent.offline && executes => diagnostics.warning(
            "CTX002",
            &reference.path,
            reference.at,
            format!("agent '{}' is offline", reference.name),
        ),
        Some(_) => {}
    }
}
