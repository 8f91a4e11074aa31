//! Markdown role files: the file name is the role's name, `##` sections are its
//! fields. The validator's rules (`crate::validate_role_definition`)
//! give the diagnostics, so a role file is judged the same by `muster validate`
//! and by an import.

use std::collections::HashSet;

use crate::{Context, RoleFormat};

use super::{FileDiagnostic, ImportFile, ParsedRoster, Severity, file_diagnostic, invalid_message};
use crate::roster::model::RoleDefinition;

/// Sections the roster reads beyond the validator's (Mission, Goals, Context
/// Files, Tools, Read Paths, Write Paths, Schedule, Inbox, Post To Inbox,
/// User Preferences).
const EXTRA_SECTIONS: [&str; 4] = ["Description", "Responsibilities", "Actions", "Permitted Actions"];

/// Parses a Markdown role file: the file name (without `.md`) is the role's
/// name, the last `#` title before the sections its description, and the `##`
/// sections its fields.
pub(super) fn parse_markdown_role(file: &ImportFile, parsed: &mut ParsedRoster) {
    let name = file.name.as_str();
    let report = crate::validate_role_definition(&file.content, RoleFormat::Markdown, &Context::default());
    let findings_before = parsed.diagnostics.len();
    for diagnostic in report.diagnostics {
        // The roster reads these sections too (the validator does not know them).
        if diagnostic.code == "MD003"
            && EXTRA_SECTIONS.iter().any(|section| diagnostic.path.eq_ignore_ascii_case(section))
        {
            continue;
        }
        parsed.diagnostics.push(FileDiagnostic {
            file_name: name.to_owned(),
            severity: match diagnostic.severity {
                crate::Severity::Error => Severity::Error,
                crate::Severity::Warning => Severity::Warning,
            },
            code: diagnostic.code,
            message: diagnostic.message,
            path: diagnostic.path,
            line: diagnostic.line,
            column: diagnostic.column,
        });
    }
    if parsed.diagnostics[findings_before..].iter().any(|diagnostic| diagnostic.severity == Severity::Error) {
        return;
    }
    let stem = std::path::Path::new(name).file_stem().and_then(|stem| stem.to_str()).unwrap_or_default().to_owned();
    let mut role = RoleDefinition { name: stem, ..RoleDefinition::default() };
    let mut title = String::new();
    let mut sections: Vec<(String, u32, Vec<String>)> = Vec::new();
    let mut in_fence = false;
    for (index, line) in file.content.lines().enumerate() {
        let line_number = u32::try_from(index + 1).unwrap_or(0);
        let trimmed = line.trim();
        if trimmed.starts_with("```") {
            in_fence = !in_fence;
        }
        if !in_fence {
            if let Some(heading) = trimmed.strip_prefix("## ") {
                sections.push((heading.trim().to_owned(), line_number, Vec::new()));
                continue;
            }
            if let Some(heading) = trimmed.strip_prefix("# ")
                && sections.is_empty()
            {
                title = heading.trim().to_owned();
                continue;
            }
        }
        if let Some((_, _, lines)) = sections.last_mut() {
            lines.push(line.to_owned());
        }
    }
    let mut seen = HashSet::new();
    for (heading, _, lines) in &sections {
        let key = heading.to_lowercase();
        if !seen.insert(key.clone()) {
            continue;
        }
        let text = || lines.join("\n").trim().to_owned();
        let items = || list_items(lines);
        match key.as_str() {
            "mission" => role.mission = text(),
            "description" => role.description = text(),
            "goals" => role.goals = items(),
            "responsibilities" => role.responsibilities = items(),
            "context files" => role.context_files = items(),
            "read paths" => role.read_paths = items(),
            "write paths" => role.write_paths = items(),
            "tools" => role.tools = items(),
            "actions" | "permitted actions" => role.permitted_actions = items(),
            "schedule" => role.schedule = text(),
            "inbox" => role.inbox = text(),
            "user preferences" => role.user_preferences = text(),
            "post to inbox" => role.post_to_inbox = text(),
            // Read by the validator's rules, which reported any mistake.
            "budget" | "throttle" => {}
            // Unknown sections were reported by the validator (MD003).
            _ => {}
        }
    }
    if role.description.is_empty() {
        role.description = title;
    }
    if let Some(checked) = report.roles.first() {
        role.budget.clone_from(&checked.budget);
        role.throttle = checked.throttle;
    }
    match role.normalize() {
        Ok(role) => parsed.roles.push(role),
        Err(error) => {
            let message = invalid_message(error);
            let section = if message.starts_with("role.name") {
                ""
            } else if message.starts_with("role.tools") {
                "Tools"
            } else {
                "Actions"
            };
            let line = sections
                .iter()
                .find(|(heading, _, _)| heading.eq_ignore_ascii_case(section))
                .map(|(_, line, _)| *line)
                .unwrap_or(1);
            parsed.diagnostics.push(file_diagnostic(name, Severity::Error, "ROS005", message, section, line, 1));
        }
    }
}

fn list_items(lines: &[String]) -> Vec<String> {
    lines
        .iter()
        .filter_map(|line| {
            let trimmed = line.trim();
            let item = trimmed.strip_prefix("- ").or_else(|| trimmed.strip_prefix("* ")).or_else(|| {
                trimmed
                    .split_once(". ")
                    .filter(|(number, _)| number.chars().all(|c| c.is_ascii_digit()) && !number.is_empty())
                    .map(|(_, rest)| rest)
            })?;
            let item = item.trim().trim_matches('`').trim();
            (!item.is_empty()).then(|| item.to_owned())
        })
        .collect()
}
