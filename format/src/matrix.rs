//! The permission matrix: which actions each role can and cannot perform.
//! Format (see `docs/process-format.md`):
//!
//! ```yaml
//! roles:
//!   lead:
//!     description: Runs the session
//!     can: [create_task, assign_role, reassign, unblock, close_task]
//!     includes: [architect, developer, reviewer, analyst]   # "all below"
//!   developer:
//!     can: [code, test, commit, report_done, request_review]
//!     cannot: [create_task, assign_role, reassign]
//! ```

use std::collections::HashMap;

use super::diagnostic::{Diagnostic, Diagnostics, Position, child_path, index_path};
use super::fields::{check_keys, string_field, string_list_field};
use super::formats::suggestion;
use super::yaml::{Limits, Node, parse};

/// One role of a permission matrix, with its inherited actions resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatrixRole {
    /// The role's name.
    pub name: String,
    /// Every action the role may perform, its own and its included roles',
    /// minus those it `cannot` perform.
    pub permitted_actions: Vec<String>,
    /// Actions the role may not perform.
    pub forbidden_actions: Vec<String>,
}

/// The outcome of [`crate::validate_permission_matrix`].
#[derive(Debug, Clone, PartialEq)]
pub struct MatrixReport {
    /// Every finding, in source order.
    pub diagnostics: Vec<Diagnostic>,
    /// The roles, when no diagnostic is an error.
    pub roles: Vec<MatrixRole>,
}

impl MatrixReport {
    /// True when no diagnostic is an error.
    pub fn is_valid(&self) -> bool {
        !self.diagnostics.iter().any(Diagnostic::is_error)
    }
}

/// Most roles a permission matrix may define.
const MAX_MATRIX_ROLES: usize = 1_000;
const MATRIX_FIELDS: [&str; 1] = ["roles"];
const ROLE_FIELDS: [&str; 4] = ["description", "can", "cannot", "includes"];

struct Entry<'a> {
    name: &'a str,
    at: Position,
    can: Vec<(Node<'a>, &'a str)>,
    cannot: Vec<(Node<'a>, &'a str)>,
    includes: Vec<(Node<'a>, &'a str)>,
}

/// Validates a permission matrix YAML document.
pub(crate) fn check_matrix(source: &str, limits: &Limits) -> MatrixReport {
    let parsed = parse(source, limits);
    let mut diagnostics = Diagnostics::default();
    for diagnostic in parsed.diagnostics {
        diagnostics.push_diagnostic(diagnostic);
    }
    let roles =
        parsed.document.as_ref().map(|document| check_root(document.root(), &mut diagnostics)).unwrap_or_default();
    let valid = !diagnostics.has_errors();
    MatrixReport { diagnostics: diagnostics.into_sorted(), roles: if valid { roles } else { Vec::new() } }
}

fn check_root(root: Node<'_>, diagnostics: &mut Diagnostics) -> Vec<MatrixRole> {
    let Some(roles) = root.get("roles").filter(|_| root.is_mapping()) else {
        diagnostics.error("MTX001", "", root.position(), "a permission matrix is a mapping with a 'roles' mapping");
        return Vec::new();
    };
    check_keys(root, "", &MATRIX_FIELDS, "MTX007", "MTX001", "the permission matrix", diagnostics);
    let Some(role_entries) = roles.mapping() else {
        diagnostics.error(
            "MTX001",
            "roles",
            roles.position(),
            format!("field 'roles' must be a mapping of role names, found {}", roles.type_name()),
        );
        return Vec::new();
    };
    if role_entries.len() > MAX_MATRIX_ROLES {
        diagnostics.error(
            "MTX012",
            "roles",
            roles.position(),
            format!("the matrix has {} roles, more than the limit of {MAX_MATRIX_ROLES}", role_entries.len()),
        );
        return Vec::new();
    }
    let mut entries: Vec<Entry<'_>> = Vec::new();
    for (key, value) in role_entries {
        let Some(name) = key.as_str() else {
            diagnostics.error("MTX001", "roles", key.position(), "role names must be strings");
            continue;
        };
        let path = child_path("roles", name);
        if !is_action_name(name) {
            diagnostics.error(
                "MTX010",
                &path,
                key.position(),
                format!("role name '{name}' must match [a-z][a-z0-9_]*"),
            );
        }
        if !value.is_mapping() {
            diagnostics.error(
                "MTX002",
                &path,
                value.position(),
                format!("role '{name}' must be a mapping with 'can' and 'cannot' lists, found {}", value.type_name()),
            );
            continue;
        }
        check_keys(value, &path, &ROLE_FIELDS, "MTX007", "MTX002", "a matrix role", diagnostics);
        string_field(value, "description", &path, "MTX003", diagnostics);
        let mut list = |field: &str| {
            let items = string_list_field(value, field, &path, "MTX003", diagnostics).unwrap_or_default();
            let field_path = child_path(&path, field);
            let mut listed = std::collections::HashSet::with_capacity(items.len());
            for (index, (item, action)) in items.iter().enumerate() {
                let item_path = index_path(&field_path, index);
                if !is_action_name(action) {
                    diagnostics.error(
                        "MTX009",
                        &item_path,
                        item.position(),
                        format!("'{action}' must match [a-z][a-z0-9_]*"),
                    );
                } else if !listed.insert(*action) {
                    diagnostics.warning("MTX008", &item_path, item.position(), format!("'{action}' is listed twice"));
                }
            }
            items
        };
        let can = list("can");
        let cannot = list("cannot");
        let includes = list("includes");
        if value.get("can").is_none() && value.get("includes").is_none() {
            diagnostics.warning("MTX011", &path, key.position(), format!("role '{name}' can do nothing"));
        }
        let allowed: std::collections::HashSet<&str> = can.iter().map(|(_, action)| *action).collect();
        for (index, (item, action)) in cannot.iter().enumerate() {
            if allowed.contains(action) {
                diagnostics.error(
                    "MTX004",
                    &index_path(&child_path(&path, "cannot"), index),
                    item.position(),
                    format!("role '{name}' both can and cannot '{action}'"),
                );
            }
        }
        entries.push(Entry { name, at: key.position(), can, cannot, includes });
    }
    resolve(&entries, diagnostics)
}

fn is_action_name(text: &str) -> bool {
    text.bytes().next().is_some_and(|first| first.is_ascii_lowercase())
        && text.bytes().all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'_')
}

/// Checks `includes` references and cycles; resolves each role's actions.
fn resolve(entries: &[Entry<'_>], diagnostics: &mut Diagnostics) -> Vec<MatrixRole> {
    let index_of: HashMap<&str, usize> = entries.iter().enumerate().map(|(index, entry)| (entry.name, index)).collect();
    let names: Vec<&str> = entries.iter().map(|entry| entry.name).collect();
    for entry in entries {
        for (item, included) in &entry.includes {
            if !index_of.contains_key(included) {
                diagnostics.error(
                    "MTX005",
                    &child_path(&child_path("roles", entry.name), "includes"),
                    item.position(),
                    format!("role '{}' includes unknown role '{included}'{}", entry.name, suggestion(included, &names)),
                );
            }
        }
    }
    let mut roles = Vec::with_capacity(entries.len());
    for (start, entry) in entries.iter().enumerate() {
        // Walk the includes from this role; meeting it again is a cycle.
        let mut visited = vec![false; entries.len()];
        let mut stack = vec![start];
        let mut permitted: Vec<String> = Vec::new();
        let mut seen_actions = std::collections::HashSet::new();
        let mut cyclic = false;
        while let Some(current) = stack.pop() {
            if visited[current] {
                continue;
            }
            visited[current] = true;
            for (_, action) in &entries[current].can {
                if seen_actions.insert(*action) {
                    permitted.push((*action).to_owned());
                }
            }
            for (_, included) in &entries[current].includes {
                if let Some(&next) = index_of.get(included) {
                    if next == start {
                        cyclic = true;
                    }
                    stack.push(next);
                }
            }
        }
        if cyclic {
            diagnostics.error(
                "MTX006",
                &child_path(&child_path("roles", entry.name), "includes"),
                entry.at,
                format!("role '{}' includes itself through its included roles", entry.name),
            );
        }
        let forbidden: Vec<String> = entry.cannot.iter().map(|(_, action)| (*action).to_owned()).collect();
        let forbidden_set: std::collections::HashSet<&str> = forbidden.iter().map(String::as_str).collect();
        permitted.retain(|action| !forbidden_set.contains(action.as_str()));
        roles.push(MatrixRole {
            name: entry.name.to_owned(),
            permitted_actions: permitted,
            forbidden_actions: forbidden,
        });
    }
    roles
}
