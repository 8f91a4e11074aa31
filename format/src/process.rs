//! Process rules: the document's schema, each step's fields by type, the EMI
//! roles, delegation requests, triggers, dependencies and, with a context,
//! references. Builds the typed [`ProcessDefinition`] when nothing is wrong.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use super::budget::{check_budget, check_throttle};
use super::diagnostic::{Diagnostics, Position, child_path, index_path};
use super::emi::check_step_roles;
use super::fields::{bool_field, check_keys, integer_field, string_field, string_list_field};
use super::formats::{check_rfc3339, is_identifier, suggestion};
use super::graph::{Dependency, GraphStep, check_dependencies};
use super::model::{Context, DelegationRequest, ProcessDefinition, ProcessReport, StepDefinition, Triggers};
use super::references::{StepReferences, WrittenNames, check_references};
use super::schedule::{MissedRuns, Schedule, check_time_zone};
use super::yaml::{Limits, Node, parse};

const PROCESS_FIELDS: [&str; 9] =
    ["name", "description", "lead", "max_parallel", "triggers", "budget", "throttle", "steps", "version"];
const STEP_FIELDS: [&str; 19] = [
    "id",
    "name",
    "title",
    "description",
    "type",
    "agent",
    "message",
    "depends_on",
    "inputs",
    "timeout_seconds",
    "retries",
    "continue_on_failure",
    "tool",
    "action",
    "delegate",
    "roles",
    "approvers",
    "schedule_to_start_seconds",
    "post_to_inbox",
];
/// The step types the execution service runs.
pub const STEP_TYPES: [&str; 3] = ["agent_task", "human_approval", "tool_call"];
const TRIGGER_FIELDS: [&str; 4] = ["schedule", "time_zone", "missed", "inbox"];
const DELEGATE_FIELDS: [&str; 5] = ["role", "expertise", "team", "urgency", "deadline"];
const URGENCIES: [&str; 4] = ["low", "normal", "high", "critical"];
/// Most retries a step may ask for.
pub const MAX_RETRIES: i64 = 10;

/// Validates a process YAML document with the given limits.
pub(crate) fn check_process(source: &str, context: &Context, limits: &Limits) -> ProcessReport {
    let parsed = parse(source, limits);
    let mut diagnostics = Diagnostics::default();
    for diagnostic in parsed.diagnostics {
        diagnostics.push_diagnostic(diagnostic);
    }
    let Some(document) = parsed.document else {
        return ProcessReport {
            diagnostics: diagnostics.into_sorted(),
            process: None,
            triggers: None,
            budget: None,
            name: None,
            step_count: 0,
        };
    };
    let root = document.root();
    let name = root.get("name").and_then(|name| name.as_str()).map(str::to_owned);
    let step_count = root.get("steps").and_then(|steps| steps.sequence()).map_or(0, |steps| steps.len());
    let budget = root.get("budget").filter(|_| root.is_mapping()).and_then(|node| check_budget(node, &mut diagnostics));
    let throttle =
        root.get("throttle").filter(|_| root.is_mapping()).and_then(|node| check_throttle(node, &mut diagnostics));
    let (process, triggers) = check_root(root, context, limits, &mut diagnostics);
    let valid = !diagnostics.has_errors();
    let process = process.map(|process| ProcessDefinition { budget: budget.clone(), throttle, ..process });
    ProcessReport {
        diagnostics: diagnostics.into_sorted(),
        process: process.filter(|_| valid),
        triggers: triggers.filter(|_| valid),
        budget: budget.filter(|_| valid),
        name,
        step_count,
    }
}

fn check_root(
    root: Node<'_>,
    context: &Context,
    limits: &Limits,
    diagnostics: &mut Diagnostics,
) -> (Option<ProcessDefinition>, Option<Triggers>) {
    if !root.is_mapping() {
        diagnostics.error(
            "PRC001",
            "",
            root.position(),
            format!("a process must be a mapping with 'name' and 'steps', found {}", root.type_name()),
        );
        return (None, None);
    }
    check_keys(root, "", &PROCESS_FIELDS, "PRC005", "PRC003", "the process", diagnostics);

    let name = match string_field(root, "name", "", "PRC003", diagnostics) {
        Some((node, name)) => {
            if !is_identifier(name) {
                diagnostics.error(
                    "PRC004",
                    "name",
                    node.position(),
                    format!("process name '{name}' must match [a-z0-9][a-z0-9_-]* and be at most 64 characters"),
                );
            }
            Some(name.to_owned())
        }
        None => {
            if root.get("name").is_none() {
                diagnostics.error("PRC002", "", root.position(), "the process has no 'name'");
            }
            None
        }
    };
    let description = string_field(root, "description", "", "PRC003", diagnostics).map(|(_, text)| text.to_owned());
    let lead = string_field(root, "lead", "", "PRC003", diagnostics).map(|(node, text)| (node.position(), text));
    let max_parallel = integer_field(root, "max_parallel", "", ("PRC003", "PRC008"), (1, 100_000), diagnostics);
    let triggers = root.get("triggers").and_then(|node| check_triggers(node, diagnostics));

    let steps_node = root.get("steps");
    let Some(steps_node) = steps_node else {
        diagnostics.error("PRC002", "", root.position(), "the process has no 'steps'");
        return (None, triggers);
    };
    let Some(step_nodes) = steps_node.sequence() else {
        diagnostics.error(
            "PRC003",
            "steps",
            steps_node.position(),
            format!("field 'steps' must be a list of steps, found {}", steps_node.type_name()),
        );
        return (None, triggers);
    };
    if step_nodes.len() == 0 {
        diagnostics.error("PRC006", "steps", steps_node.position(), "a process needs at least one step");
    }
    if step_nodes.len() > limits.max_steps {
        diagnostics.error(
            "PRC007",
            "steps",
            steps_node.position(),
            format!("the process has {} steps, more than the limit of {}", step_nodes.len(), limits.max_steps),
        );
        return (None, triggers);
    }

    let mut steps = Vec::with_capacity(step_nodes.len());
    let mut graph: Vec<GraphStep<'_>> = Vec::with_capacity(step_nodes.len());
    let collect_references = context.agents.is_some() || context.roles.is_some() || context.tools.is_some();
    let mut references = Vec::new();
    // Each id's first step, by its place in `graph`.
    let mut first_seen: HashMap<&str, usize> = HashMap::with_capacity(step_nodes.len());
    let mut path = String::new();
    for (index, step_node) in step_nodes.enumerate() {
        path.clear();
        let _ = write!(path, "steps[{index}]");
        let Some(checked) = check_step(step_node, &path, collect_references, diagnostics) else { continue };
        if let Some((id_node, id)) = checked.id {
            match first_seen.entry(id) {
                Entry::Occupied(first) => diagnostics.error(
                    "STP004",
                    &child_path(&path, "id"),
                    id_node.position(),
                    format!("step id '{id}' is already used by steps[{}]", graph[*first.get()].index),
                ),
                Entry::Vacant(first) => {
                    first.insert(graph.len());
                }
            }
            graph.push(GraphStep { id, index, at: step_node.position(), depends_on: checked.dependencies });
        }
        references.extend(checked.references);
        steps.push(checked.definition);
    }
    check_dependencies(&graph, &first_seen, diagnostics);
    check_references(context, lead, &references, diagnostics);

    let process = name.map(|name| ProcessDefinition {
        name,
        description: description.unwrap_or_default(),
        lead: lead.map(|(_, lead)| lead.to_owned()),
        max_parallel: max_parallel.and_then(|value| u32::try_from(value).ok()),
        steps: steps.into_iter().flatten().collect(),
        triggers: triggers.clone(),
        budget: None,
        throttle: None,
    });
    (process, triggers)
}

fn check_triggers(node: Node<'_>, diagnostics: &mut Diagnostics) -> Option<Triggers> {
    if !node.is_mapping() {
        diagnostics.error(
            "TRG001",
            "triggers",
            node.position(),
            format!("field 'triggers' must be a mapping, found {}", node.type_name()),
        );
        return None;
    }
    check_keys(node, "triggers", &TRIGGER_FIELDS, "TRG004", "TRG001", "triggers", diagnostics);
    let time_zone = string_field(node, "time_zone", "triggers", "TRG001", diagnostics).and_then(|(value, text)| {
        match check_time_zone(text) {
            Ok(_) => Some(text.to_owned()),
            Err(reason) => {
                diagnostics.error("TRG005", "triggers.time_zone", value.position(), reason);
                None
            }
        }
    });
    let missed = string_field(node, "missed", "triggers", "TRG001", diagnostics).and_then(|(value, text)| {
        let policy = MissedRuns::parse(text);
        if policy.is_none() {
            diagnostics.error(
                "TRG006",
                "triggers.missed",
                value.position(),
                format!("missed runs policy '{text}' must be skip or run_once"),
            );
        }
        policy
    });
    let schedule =
        string_field(node, "schedule", "triggers", "TRG001", diagnostics).and_then(
            |(value, text)| match Schedule::parse(text, time_zone.as_deref().unwrap_or_default()) {
                Ok(_) => Some(text.to_owned()),
                Err(reason) if reason.starts_with("unknown time zone") => None,
                Err(reason) => {
                    diagnostics.error(
                        "TRG002",
                        "triggers.schedule",
                        value.position(),
                        format!("invalid schedule: {reason}"),
                    );
                    None
                }
            },
        );
    if schedule.is_none() && (time_zone.is_some() || missed.is_some()) && node.get("schedule").is_none() {
        diagnostics.warning(
            "TRG007",
            "triggers",
            node.position(),
            "'time_zone' and 'missed' apply to a schedule, and there is none",
        );
    }
    let inbox = string_field(node, "inbox", "triggers", "TRG001", diagnostics).and_then(|(value, text)| {
        if is_identifier(text) {
            Some(text.to_owned())
        } else {
            diagnostics.error(
                "TRG003",
                "triggers.inbox",
                value.position(),
                format!("inbox name '{text}' must match [a-z0-9][a-z0-9_-]* and be at most 64 characters"),
            );
            None
        }
    });
    Some(Triggers { schedule, time_zone: time_zone.unwrap_or_default(), missed: missed.unwrap_or_default(), inbox })
}

struct CheckedStep<'a> {
    id: Option<(Node<'a>, &'a str)>,
    dependencies: Vec<Dependency<'a>>,
    /// None when the context has nothing to check references against.
    references: Option<StepReferences<'a>>,
    /// None when the step has an error.
    definition: Option<StepDefinition>,
}

fn check_step<'a>(
    step: Node<'a>,
    path: &str,
    collect_references: bool,
    diagnostics: &mut Diagnostics,
) -> Option<CheckedStep<'a>> {
    if !step.is_mapping() {
        diagnostics.error(
            "STP001",
            path,
            step.position(),
            format!("a step must be a mapping with 'id' and 'type', found {}", step.type_name()),
        );
        return None;
    }
    let errors_before = diagnostics.error_count();
    check_keys(step, path, &STEP_FIELDS, "STP008", "STP009", "a step", diagnostics);

    let id = check_step_id(step, path, diagnostics);
    let label = || id.map_or_else(|| path.to_owned(), |(_, text)| format!("step '{text}'"));
    let step_type = check_step_type(step, path, &label, diagnostics);

    let name = string_field(step, "name", path, "STP009", diagnostics)
        .or_else(|| string_field(step, "title", path, "STP009", diagnostics))
        .map(|(_, text)| text.to_owned());
    string_field(step, "description", path, "STP009", diagnostics);
    let agent = string_field(step, "agent", path, "STP009", diagnostics);
    let message = string_field(step, "message", path, "STP009", diagnostics);
    let tool = string_field(step, "tool", path, "STP009", diagnostics);
    let action = string_field(step, "action", path, "STP009", diagnostics);
    if let Some((node, text)) = action {
        check_action_name(node, text, path, diagnostics);
    }
    let post_to_inbox = string_field(step, "post_to_inbox", path, "STP009", diagnostics);
    if let Some((node, text)) = post_to_inbox
        && !is_identifier(text)
    {
        diagnostics.error(
            "STP015",
            &child_path(path, "post_to_inbox"),
            node.position(),
            format!("inbox name '{text}' must match [a-z0-9][a-z0-9_-]* and be at most 64 characters"),
        );
    }
    let timeout = integer_field(step, "timeout_seconds", path, ("STP009", "STP010"), (1, 31_536_000), diagnostics);
    let retries = integer_field(step, "retries", path, ("STP009", "STP011"), (0, MAX_RETRIES), diagnostics);
    let continue_on_failure = bool_field(step, "continue_on_failure", path, "STP009", diagnostics);
    let approvers = string_list_field(step, "approvers", path, "STP009", diagnostics).unwrap_or_default();
    let schedule_to_start =
        integer_field(step, "schedule_to_start_seconds", path, ("STP009", "STP010"), (1, 31_536_000), diagnostics);
    let inputs_json = step_inputs_json(step, path, diagnostics);
    let dependencies = check_depends_on(step, path, diagnostics);

    let roles_node = step.get("roles");
    let roles = roles_node.and_then(|roles| check_step_roles(step, roles, path, step_type, diagnostics));
    let delegate =
        step.get("delegate").and_then(|node| check_delegate(node, &child_path(path, "delegate"), diagnostics));
    check_required_fields(step, path, step_type, &label, diagnostics);
    let named_executor = roles.as_ref().map(|roles| roles.executor.as_str()).or(agent.map(|(_, text)| text));
    if let (Some(node), Some(executor)) = (step.key_node("delegate"), named_executor) {
        diagnostics.warning(
            "DLG007",
            &child_path(path, "delegate"),
            node.position(),
            format!("{} names its executor '{executor}', so 'delegate' is ignored", label()),
        );
    }

    let references = collect_references.then(|| {
        StepReferences::collect(
            step,
            path,
            WrittenNames { agent, tool, action, approvers: &approvers },
            &roles,
            &delegate,
            step_type,
        )
    });
    let definition = (diagnostics.error_count() == errors_before).then(|| StepDefinition {
        id: id.map(|(_, text)| text.to_owned()).unwrap_or_default(),
        name: name.unwrap_or_else(|| id.map(|(_, text)| text.to_owned()).unwrap_or_default()),
        step_type: step_type.to_owned(),
        agent: agent.map(|(_, text)| text.to_owned()),
        message: message.map(|(_, text)| text.to_owned()).unwrap_or_default(),
        depends_on: dependencies.iter().map(|dependency| dependency.target.to_owned()).collect(),
        roles,
        inputs_json,
        timeout_seconds: timeout.and_then(|value| u64::try_from(value).ok()),
        retries: retries.and_then(|value| u32::try_from(value).ok()).unwrap_or(0),
        continue_on_failure: continue_on_failure.unwrap_or(false),
        tool: tool.map(|(_, text)| text.to_owned()),
        delegate: delegate.map(|(request, _)| request),
        action: action.map(|(_, text)| text.to_owned()),
        approvers: approvers.iter().map(|(_, text)| (*text).to_owned()).collect(),
        schedule_to_start_seconds: schedule_to_start.and_then(|value| u64::try_from(value).ok()),
        post_to_inbox: post_to_inbox.map(|(_, text)| text.to_owned()),
    });
    Some(CheckedStep { id, dependencies, references, definition })
}

/// A step's `id`: present, and an identifier.
fn check_step_id<'a>(step: Node<'a>, path: &str, diagnostics: &mut Diagnostics) -> Option<(Node<'a>, &'a str)> {
    let id = string_field(step, "id", path, "STP009", diagnostics);
    match id {
        Some((node, text)) if !is_identifier(text) => diagnostics.error(
            "STP003",
            &child_path(path, "id"),
            node.position(),
            format!("step id '{text}' must match [a-z0-9][a-z0-9_-]* and be at most 64 characters"),
        ),
        None if step.get("id").is_none() => diagnostics.error("STP002", path, step.position(), "the step has no 'id'"),
        _ => {}
    }
    id
}

/// A step's `type`: present, and one of [`STEP_TYPES`]; empty when it is
/// not given as text.
fn check_step_type<'a>(
    step: Node<'a>,
    path: &str,
    label: &impl Fn() -> String,
    diagnostics: &mut Diagnostics,
) -> &'a str {
    let step_type = string_field(step, "type", path, "STP009", diagnostics).map(|(node, text)| {
        if !STEP_TYPES.contains(&text) {
            diagnostics.error(
                "STP006",
                &child_path(path, "type"),
                node.position(),
                format!(
                    "unknown step type '{text}'{}; known types are {}",
                    suggestion(text, &STEP_TYPES),
                    STEP_TYPES.join(", ")
                ),
            );
        }
        text
    });
    if step.get("type").is_none() {
        diagnostics.error("STP005", path, step.position(), format!("{} has no 'type'", label()));
    }
    step_type.unwrap_or_default()
}

/// An `action` name: lowercase letters, digits and `_`, starting with a letter.
fn check_action_name(node: Node<'_>, text: &str, path: &str, diagnostics: &mut Diagnostics) {
    let well_formed = text.bytes().next().is_some_and(|first| first.is_ascii_lowercase())
        && text.bytes().all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'_');
    if !well_formed {
        diagnostics.error(
            "STP014",
            &child_path(path, "action"),
            node.position(),
            format!("action '{text}' must match [a-z][a-z0-9_]* (such as 'code' or 'request_review')"),
        );
    }
}

/// A step's `inputs` as JSON text: `{}` when not given (or not a mapping).
fn step_inputs_json(step: Node<'_>, path: &str, diagnostics: &mut Diagnostics) -> String {
    match step.get("inputs") {
        None => "{}".to_owned(),
        Some(inputs) if inputs.is_null() => "{}".to_owned(),
        Some(inputs) if inputs.is_mapping() => inputs.to_json_text(),
        Some(inputs) => {
            diagnostics.error(
                "STP009",
                &child_path(path, "inputs"),
                inputs.position(),
                format!("field 'inputs' must be a mapping, found {}", inputs.type_name()),
            );
            "{}".to_owned()
        }
    }
}

/// A step's `depends_on`, each step once (one listed twice is a warning).
fn check_depends_on<'a>(step: Node<'a>, path: &str, diagnostics: &mut Diagnostics) -> Vec<Dependency<'a>> {
    let depends_on = string_list_field(step, "depends_on", path, "STP009", diagnostics).unwrap_or_default();
    let mut dependencies: Vec<Dependency<'a>> = Vec::with_capacity(depends_on.len());
    // A short list is searched; a long one gets a set.
    let mut listed = (depends_on.len() > 16).then(|| HashSet::with_capacity(depends_on.len()));
    for (index, (node, target)) in depends_on.iter().enumerate() {
        let repeated = match &mut listed {
            Some(listed) => !listed.insert(*target),
            None => dependencies.iter().any(|dependency| dependency.target == *target),
        };
        if repeated {
            diagnostics.warning(
                "STP013",
                &index_path(&child_path(path, "depends_on"), index),
                node.position(),
                format!("'{target}' is listed twice in depends_on"),
            );
            continue;
        }
        dependencies.push(Dependency { target, index, at: node.position() });
    }
    dependencies
}

/// The fields a step's type needs (an agent task's message and executor, a
/// tool call's tool), and a `tool` a step of another type would ignore.
fn check_required_fields(
    step: Node<'_>,
    path: &str,
    step_type: &str,
    label: &impl Fn() -> String,
    diagnostics: &mut Diagnostics,
) {
    match step_type {
        "agent_task" => {
            if step.get("message").is_none() {
                diagnostics.error("STP007", path, step.position(), format!("agent_task {} needs a 'message'", label()));
            }
            if step.get("roles").is_none() && step.get("delegate").is_none() && step.get("agent").is_none() {
                diagnostics.error(
                    "STP007",
                    path,
                    step.position(),
                    format!("agent_task {} needs an executor: set 'agent', 'roles.executor' or 'delegate'", label()),
                );
            }
        }
        "tool_call" if step.get("tool").is_none() => {
            diagnostics.error("STP007", path, step.position(), format!("tool_call {} needs a 'tool'", label()));
        }
        _ => {}
    }
    if let Some(node) = step.get("tool").filter(|_| !step_type.is_empty() && step_type != "tool_call") {
        diagnostics.warning(
            "STP012",
            &child_path(path, "tool"),
            node.position(),
            format!("'tool' is only used by tool_call steps; {} is {step_type}", label()),
        );
    }
}

/// The delegation request and the position of its `role` value, if any.
fn check_delegate<'a>(
    node: Node<'a>,
    path: &str,
    diagnostics: &mut Diagnostics,
) -> Option<(DelegationRequest, Option<Position>)> {
    if !node.is_mapping() {
        diagnostics.error(
            "DLG001",
            path,
            node.position(),
            format!("field 'delegate' must be a mapping, found {}", node.type_name()),
        );
        return None;
    }
    let errors_before = diagnostics.error_count();
    check_keys(node, path, &DELEGATE_FIELDS, "DLG005", "DLG001", "delegate", diagnostics);
    let role = string_field(node, "role", path, "DLG001", diagnostics);
    let expertise = string_list_field(node, "expertise", path, "DLG006", diagnostics).unwrap_or_default();
    for (index, (item, text)) in expertise.iter().enumerate() {
        if text.trim().is_empty() {
            diagnostics.error(
                "DLG006",
                &index_path(&child_path(path, "expertise"), index),
                item.position(),
                "an expertise entry must not be empty",
            );
        }
    }
    if let Some((value, text)) = role.filter(|(_, text)| text.trim().is_empty()) {
        diagnostics.error(
            "DLG002",
            &child_path(path, "role"),
            value.position(),
            format!("delegate role '{text}' is empty"),
        );
    }
    if role.is_none() && expertise.is_empty() && node.get("role").is_none() && node.get("expertise").is_none() {
        diagnostics.error(
            "DLG002",
            path,
            node.position(),
            "a delegation request needs a 'role' or a non-empty 'expertise' list",
        );
    }
    let team = string_field(node, "team", path, "DLG001", diagnostics);
    let urgency = string_field(node, "urgency", path, "DLG001", diagnostics);
    if let Some((value, text)) = urgency.filter(|(_, text)| !URGENCIES.contains(text)) {
        diagnostics.error(
            "DLG003",
            &child_path(path, "urgency"),
            value.position(),
            format!("urgency '{text}' must be one of {}{}", URGENCIES.join(", "), suggestion(text, &URGENCIES)),
        );
    }
    let deadline = string_field(node, "deadline", path, "DLG001", diagnostics);
    if let Some((value, text)) = deadline
        && let Err(reason) = check_rfc3339(text)
    {
        diagnostics.error(
            "DLG004",
            &child_path(path, "deadline"),
            value.position(),
            format!("deadline '{text}': {reason}"),
        );
    }
    if diagnostics.error_count() != errors_before {
        return None;
    }
    let request = DelegationRequest {
        role: role.map(|(_, text)| text.to_owned()),
        expertise: expertise.iter().map(|(_, text)| (*text).to_owned()).collect(),
        team: team.map(|(_, text)| text.to_owned()),
        urgency: urgency.map(|(_, text)| text.to_owned()),
        deadline: deadline.map(|(_, text)| text.to_owned()),
    };
    Some((request, role.map(|(value, _)| value.position())))
}
