//! Role definitions: YAML with the `RoleDefinition` fields (one mapping or a
//! list of them) and Markdown role files (a `# Title` and `##` sections).

mod markdown;

use std::collections::HashMap;

use super::budget::{check_budget, check_throttle};
use super::diagnostic::{Diagnostic, Diagnostics, Position, child_path, index_path};
use super::fields::{check_keys, string_field, string_list_field};
use super::formats::{is_identifier, suggestion};
use super::model::{Context, ProcessBudget, ProcessThrottle};
use super::plain_schedule::role_schedule;
use super::roster::model::{RoleBudget, RoleDefinition, RoleThrottle};
use super::schedule::Schedule;
use super::yaml::{Limits, Node, parse};

/// The syntax a role definition is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoleFormat {
    /// YAML with the `RoleDefinition` fields, one mapping or a list of them.
    Yaml,
    /// A Markdown role file: a `# Title` heading and `##` sections.
    Markdown,
}

/// The outcome of [`crate::validate_role_definition`].
#[derive(Debug, Clone, PartialEq)]
pub struct RoleReport {
    /// Every finding, in source order.
    pub diagnostics: Vec<Diagnostic>,
    /// The roles read from the document; empty when it could not be read.
    pub roles: Vec<RoleDefinition>,
}

impl RoleReport {
    /// True when no diagnostic is an error.
    pub fn is_valid(&self) -> bool {
        !self.diagnostics.iter().any(Diagnostic::is_error)
    }
}

const ROLE_FIELDS: [&str; 18] = [
    "name",
    "description",
    "goals",
    "responsibilities",
    "tools",
    "input_schema",
    "output_schema",
    "mission",
    "context_files",
    "schedule",
    "inbox",
    "user_preferences",
    "permitted_actions",
    "post_to_inbox",
    "budget",
    "throttle",
    "read_paths",
    "write_paths",
];
/// Most entries of a role's `read_paths` or `write_paths`.
pub const MAX_WORKSPACE_PATHS: usize = 64;
/// Longest entry of a role's `read_paths` or `write_paths`, in characters.
pub const MAX_WORKSPACE_PATH_CHARS: usize = 256;

/// What is wrong with an entry of a role's `read_paths` or `write_paths`,
/// if anything: it must be a workspace-relative path (not empty, no leading
/// `/`, no `..` segment, at most [`MAX_WORKSPACE_PATH_CHARS`] characters). A
/// folder ends in `/` and covers everything under it; a file covers itself.
pub fn workspace_path_problem(path: &str) -> Option<String> {
    let trimmed = path.trim();
    if trimmed.is_empty() {
        Some("is empty; write a workspace-relative path such as 'notes/' or 'report.md'".to_owned())
    } else if trimmed.starts_with('/') {
        Some(format!("'{trimmed}' is absolute; write a path relative to the workspace"))
    } else if trimmed.split(['/', '\\']).any(|segment| segment == "..") {
        Some(format!("'{trimmed}' leaves the workspace ('..')"))
    } else if trimmed.chars().count() > MAX_WORKSPACE_PATH_CHARS {
        Some(format!("is longer than {MAX_WORKSPACE_PATH_CHARS} characters"))
    } else if trimmed.chars().any(char::is_control) {
        Some("has control characters".to_owned())
    } else {
        None
    }
}

/// The workspace file tools the model-driven agent (`muster agent`) serves
/// itself, inside its worker, on the files of its workspace: never
/// registered with the cluster, so a role may list them whatever tools are
/// registered (no `CTX006`). A `tool_call` step cannot call them: the
/// execution service only calls tools that a worker registered.
pub const BUILTIN_TOOLS: [&str; 5] = ["read_file", "write_file", "append_file", "list_files", "move_file"];

/// Whether `tool` is one of the [`BUILTIN_TOOLS`].
pub fn is_builtin_tool(tool: &str) -> bool {
    BUILTIN_TOOLS.contains(&tool)
}

const JSON_SCHEMA_TYPES: [&str; 7] = ["object", "array", "string", "number", "integer", "boolean", "null"];

/// Validates a role definition document.
pub(crate) fn check_role_definition(
    source: &str,
    format: RoleFormat,
    context: &Context,
    limits: &Limits,
) -> RoleReport {
    let mut diagnostics = Diagnostics::default();
    let roles = match format {
        RoleFormat::Markdown => markdown::check_markdown_role(source, limits, &mut diagnostics).into_iter().collect(),
        RoleFormat::Yaml => check_yaml_roles(source, limits, &mut diagnostics),
    };
    let mut seen: HashMap<&str, ()> = HashMap::new();
    for ((role, _), at) in &roles {
        if seen.insert(role.name.as_str(), ()).is_some() {
            diagnostics.error("ROL005", "", *at, format!("role '{}' is defined twice", role.name));
        }
    }
    if let Some(tools) = &context.tools {
        // The built-in tools are known without being registered.
        let names: Vec<&str> = tools.iter().map(String::as_str).chain(BUILTIN_TOOLS).collect();
        for ((_, tools), _) in &roles {
            for (tool, path, at) in tools {
                if !names.contains(&tool.as_str()) {
                    diagnostics.error(
                        "CTX006",
                        path,
                        *at,
                        format!("unknown tool '{tool}'{}", suggestion(tool, &names)),
                    );
                }
            }
        }
    }
    RoleReport { diagnostics: diagnostics.into_sorted(), roles: roles.into_iter().map(|((role, _), _)| role).collect() }
}

/// A role and where its tools were written: (tool, path, position).
pub(crate) type ReadRole = (RoleDefinition, Vec<(String, String, Position)>);

fn check_yaml_roles(source: &str, limits: &Limits, diagnostics: &mut Diagnostics) -> Vec<(ReadRole, Position)> {
    let parsed = parse(source, limits);
    for diagnostic in parsed.diagnostics {
        diagnostics.push_diagnostic(diagnostic);
    }
    let Some(document) = parsed.document else { return Vec::new() };
    let root = document.root();
    if let Some(items) = root.sequence() {
        if items.len() == 0 {
            diagnostics.error("ROL001", "", root.position(), "the list of role definitions is empty");
        }
        return items
            .enumerate()
            .filter_map(|(index, item)| check_yaml_role(item, &index_path("", index), diagnostics))
            .collect();
    }
    check_yaml_role(root, "", diagnostics).into_iter().collect()
}

fn check_yaml_role(node: Node<'_>, path: &str, diagnostics: &mut Diagnostics) -> Option<(ReadRole, Position)> {
    if !node.is_mapping() {
        diagnostics.error(
            "ROL001",
            path,
            node.position(),
            format!("a role definition must be a mapping (or a list of them), found {}", node.type_name()),
        );
        return None;
    }
    check_keys(node, path, &ROLE_FIELDS, "ROL004", "ROL003", "a role definition", diagnostics);
    let text = |key: &str, diagnostics: &mut Diagnostics| {
        string_field(node, key, path, "ROL003", diagnostics).map(|(_, text)| text.to_owned())
    };
    let list = |key: &str, diagnostics: &mut Diagnostics| {
        string_list_field(node, key, path, "ROL003", diagnostics).unwrap_or_default()
    };
    let name = match string_field(node, "name", path, "ROL003", diagnostics) {
        Some((value, name)) => {
            check_role_name(name, &child_path(path, "name"), value.position(), diagnostics);
            name.to_owned()
        }
        None => {
            if node.get("name").is_none() {
                diagnostics.error("ROL002", path, node.position(), "the role definition has no 'name'");
            }
            String::new()
        }
    };
    let tools_written = list("tools", diagnostics);
    let tools: Vec<(String, String, Position)> = tools_written
        .iter()
        .enumerate()
        .map(|(index, (item, tool))| {
            ((*tool).to_owned(), index_path(&child_path(path, "tools"), index), item.position())
        })
        .collect();
    warn_duplicates(&tools, diagnostics);
    let schedule = string_field(node, "schedule", path, "ROL003", diagnostics).map(|(value, text)| {
        check_schedule(text, &child_path(path, "schedule"), &[value.position()], diagnostics);
        text.to_owned()
    });
    let inbox = string_field(node, "inbox", path, "ROL003", diagnostics).map(|(value, text)| {
        check_inbox(text, &child_path(path, "inbox"), value.position(), diagnostics);
        text.to_owned()
    });
    let post_to_inbox = string_field(node, "post_to_inbox", path, "ROL003", diagnostics).map(|(value, text)| {
        check_post_to_inbox(text, &child_path(path, "post_to_inbox"), value.position(), diagnostics);
        text.trim().to_owned()
    });
    let context_files = list("context_files", diagnostics);
    for (index, (item, file)) in context_files.iter().enumerate() {
        check_context_file(file, &index_path(&child_path(path, "context_files"), index), item.position(), diagnostics);
    }
    let read_paths = list("read_paths", diagnostics);
    check_workspace_paths(&read_paths, &child_path(path, "read_paths"), node, diagnostics);
    let write_paths = list("write_paths", diagnostics);
    check_workspace_paths(&write_paths, &child_path(path, "write_paths"), node, diagnostics);
    let actions = list("permitted_actions", diagnostics);
    for (index, (item, action)) in actions.iter().enumerate() {
        let well_formed = action.bytes().next().is_some_and(|first| first.is_ascii_lowercase())
            && action.bytes().all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'_');
        if !well_formed {
            diagnostics.error(
                "ROL013",
                &index_path(&child_path(path, "permitted_actions"), index),
                item.position(),
                format!("action '{action}' must match [a-z][a-z0-9_]* (such as 'code' or 'request_review')"),
            );
        }
    }
    let role = RoleDefinition {
        description: text("description", diagnostics).unwrap_or_default(),
        goals: list("goals", diagnostics).into_iter().map(|(_, goal)| goal.to_owned()).collect(),
        responsibilities: list("responsibilities", diagnostics).into_iter().map(|(_, item)| item.to_owned()).collect(),
        tools: tools.iter().map(|(tool, _, _)| tool.clone()).collect(),
        permitted_actions: actions.iter().map(|(_, item)| (*item).to_owned()).collect(),
        mission: text("mission", diagnostics).unwrap_or_default(),
        context_files: context_files.iter().map(|(_, file)| (*file).to_owned()).collect(),
        read_paths: read_paths.iter().map(|(_, entry)| entry.trim().to_owned()).collect(),
        write_paths: write_paths.iter().map(|(_, entry)| entry.trim().to_owned()).collect(),
        schedule: schedule.unwrap_or_default(),
        inbox: inbox.unwrap_or_default(),
        user_preferences: text("user_preferences", diagnostics).unwrap_or_default(),
        post_to_inbox: post_to_inbox.unwrap_or_default(),
        budget: node
            .get("budget")
            .filter(|value| !value.is_null())
            .and_then(|value| check_budget(value, diagnostics))
            .map(role_budget),
        throttle: node
            .get("throttle")
            .filter(|value| !value.is_null())
            .and_then(|value| check_throttle(value, diagnostics))
            .map(role_throttle),
        input_schema_json: schema_field(node, "input_schema", path, diagnostics).unwrap_or_default(),
        output_schema_json: schema_field(node, "output_schema", path, diagnostics).unwrap_or_default(),
        name,
    };
    Some(((role, tools), node.position()))
}

/// A role's budget, from the `budget:` it writes as a process does.
pub(crate) fn role_budget(budget: ProcessBudget) -> RoleBudget {
    RoleBudget {
        period_seconds: budget.period_seconds,
        max_runs: budget.max_runs,
        max_cost: budget.max_cost,
        max_tokens: budget.max_tokens,
        run_max_cost: budget.run_max_cost,
        run_max_tokens: budget.run_max_tokens,
        on_exceed: budget.on_exceed.as_str().to_owned(),
    }
}

/// A role's throttle, from the `throttle:` it writes as a process does.
pub(crate) fn role_throttle(throttle: ProcessThrottle) -> RoleThrottle {
    RoleThrottle { min_interval_seconds: throttle.min_interval_seconds, max_concurrent: throttle.max_concurrent }
}

/// The entries of `read_paths` or `write_paths` (YAML), each at its position.
fn check_workspace_paths(entries: &[(Node<'_>, &str)], path: &str, role: Node<'_>, diagnostics: &mut Diagnostics) {
    let key = path.rsplit('.').next().unwrap_or(path);
    let at = role.get(key).map_or(role.position(), |list| list.position());
    let written: Vec<(&str, String, Position)> = entries
        .iter()
        .enumerate()
        .map(|(index, (item, entry))| (*entry, index_path(path, index), item.position()))
        .collect();
    check_workspace_path_list(&written, path, at, diagnostics);
}

/// The rules of `read_paths` and `write_paths` (YAML and Markdown): at most
/// [`MAX_WORKSPACE_PATHS`] entries, each a workspace-relative path.
pub(crate) fn check_workspace_path_list(
    entries: &[(&str, String, Position)],
    path: &str,
    at: Position,
    diagnostics: &mut Diagnostics,
) {
    if entries.len() > MAX_WORKSPACE_PATHS {
        diagnostics.error("ROL015", path, at, format!("at most {MAX_WORKSPACE_PATHS} paths, found {}", entries.len()));
    }
    for (entry, entry_path, entry_at) in entries {
        if let Some(problem) = workspace_path_problem(entry) {
            diagnostics.error("ROL015", entry_path, *entry_at, format!("workspace path {problem}"));
        }
    }
}

fn schema_field(node: Node<'_>, key: &str, path: &str, diagnostics: &mut Diagnostics) -> Option<String> {
    let value = node.get(key)?;
    let field_path = child_path(path, key);
    if value.is_null() {
        return None;
    }
    if !value.is_mapping() {
        diagnostics.error(
            "ROL008",
            &field_path,
            value.position(),
            format!("field '{key}' must be a JSON schema mapping, found {}", value.type_name()),
        );
        return None;
    }
    if let Some(kind) = value.get("type") {
        let known = match kind.as_str() {
            Some(name) => JSON_SCHEMA_TYPES.contains(&name),
            None => kind.sequence().is_some_and(|mut items| {
                items.all(|item| item.as_str().is_some_and(|name| JSON_SCHEMA_TYPES.contains(&name)))
            }),
        };
        if !known {
            let shown = kind.scalar_text().unwrap_or("?");
            diagnostics.error(
                "ROL008",
                &child_path(&field_path, "type"),
                kind.position(),
                format!(
                    "'{shown}' is not a JSON schema type{}; use one of {}",
                    suggestion(shown, &JSON_SCHEMA_TYPES),
                    JSON_SCHEMA_TYPES.join(", ")
                ),
            );
        }
    }
    Some(value.to_json_text())
}

/// Role names: non-empty, at most 64 characters, no control characters.
pub(crate) fn check_role_name(name: &str, path: &str, at: Position, diagnostics: &mut Diagnostics) {
    if name.trim().is_empty() || name.chars().count() > 64 || name.chars().any(char::is_control) {
        diagnostics.error(
            "ROL010",
            path,
            at,
            format!("role name '{name}' must be 1 to 64 characters without control characters"),
        );
    }
}

pub(crate) fn warn_duplicates(tools: &[(String, String, Position)], diagnostics: &mut Diagnostics) {
    let mut listed = std::collections::HashSet::with_capacity(tools.len());
    for (tool, path, at) in tools {
        if !listed.insert(tool.as_str()) {
            diagnostics.warning("ROL009", path, *at, format!("tool '{tool}' is listed twice"));
        }
    }
}

/// The inbox a role's `inbox` names: the text itself, or the last segment of
/// a relative path (`agent/inbox/risk/` is the inbox `risk`), in lowercase;
/// `None` when that is not an inbox name (`[a-z0-9][a-z0-9_-]*`) or the path
/// is absolute or has `..`.
pub fn role_inbox_name(text: &str) -> Option<String> {
    let trimmed = text.trim();
    if trimmed.starts_with('/') || trimmed.split('/').any(|segment| segment == "..") {
        return None;
    }
    let name = trimmed.trim_end_matches('/').rsplit('/').next()?.to_lowercase();
    is_identifier(&name).then_some(name)
}

/// A schedule is a cron expression (checked), one in backticks within text
/// (checked), or plain English read into one (checked; a phrase that cannot
/// be read is a warning at that phrase: nothing can fire the role), with
/// perhaps a line `time_zone: NAME` (checked). `lines` is where each line
/// of `text` starts in the file; a line past them is taken to start below
/// the last, at its column.
pub(crate) fn check_schedule(text: &str, path: &str, lines: &[Position], diagnostics: &mut Diagnostics) {
    let first = lines.first().copied().unwrap_or(Position { line: 1, column: 1 });
    let line_start = |line: usize| {
        lines.get(line).copied().unwrap_or_else(|| Position {
            line: first.line + u32::try_from(line).unwrap_or(u32::MAX),
            column: first.column,
        })
    };
    match role_schedule(text) {
        Ok(None) => {}
        Ok(Some(schedule)) => {
            if let Err(reason) = Schedule::parse(&schedule.cron, &schedule.time_zone) {
                diagnostics.error("ROL006", path, first, format!("invalid schedule: {reason}"));
            }
        }
        Err(unreadable) => {
            let start = line_start(unreadable.line);
            let at = Position {
                line: start.line,
                column: start.column + u32::try_from(unreadable.column).unwrap_or(u32::MAX),
            };
            diagnostics.warning(
                "ROL011",
                path,
                at,
                format!(
                    "schedule: cannot read '{}': {}; nothing can fire this role until it reads — write times and \
                     days ('9am and 5pm, weekdays'), an interval ('every 30 minutes') or a cron expression \
                     (`0 9,17 * * 1-5`)",
                    unreadable.phrase, unreadable.reason
                ),
            );
        }
    }
}

/// An inbox is a name (`risk`) or a relative path whose last segment is one
/// (`agent/inbox/risk/`).
pub(crate) fn check_inbox(text: &str, path: &str, at: Position, diagnostics: &mut Diagnostics) {
    let trimmed = text.trim();
    if role_inbox_name(trimmed).is_none() {
        diagnostics.error(
            "ROL007",
            path,
            at,
            format!(
                "inbox '{trimmed}' must be an inbox name ([a-z0-9][a-z0-9_-]*) or a relative path ending in one, \
                 such as 'agent/inbox/risk/'"
            ),
        );
    }
}

/// The inbox a role's runs post to: an inbox name.
pub(crate) fn check_post_to_inbox(text: &str, path: &str, at: Position, diagnostics: &mut Diagnostics) {
    if !is_identifier(text.trim()) {
        diagnostics.error(
            "ROL014",
            path,
            at,
            format!(
                "post_to_inbox '{}' must be an inbox name ([a-z0-9][a-z0-9_-]*, at most 64 characters)",
                text.trim()
            ),
        );
    }
}

/// Context files are paths inside the vault: relative, without `..`.
pub(crate) fn check_context_file(file: &str, path: &str, at: Position, diagnostics: &mut Diagnostics) {
    let trimmed = file.trim();
    if trimmed.is_empty() || trimmed.starts_with('/') || trimmed.split('/').any(|segment| segment == "..") {
        diagnostics.error(
            "ROL012",
            path,
            at,
            format!("context file '{trimmed}' must be a relative path inside the vault, without '..'"),
        );
    }
}
