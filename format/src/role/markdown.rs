//! Markdown role files: a `# Title` heading names the role; `##` sections
//! Mission, Goals, Context Files, Tools, Read Paths, Write Paths, Schedule,
//! Inbox, Post To Inbox, Budget, Throttle and User Preferences describe it. Budget and Throttle
//! hold YAML mappings, as a process's `budget:` and `throttle:`. Lists are `-`, `*` or `+` bullets.

use super::{
    ReadRole, check_context_file, check_inbox, check_post_to_inbox, check_role_name, check_schedule,
    check_workspace_path_list, role_budget, role_throttle, warn_duplicates,
};
use crate::budget::{check_budget, check_throttle};
use crate::diagnostic::{Diagnostics, Position};
use crate::formats::suggestion;
use crate::roster::model::RoleDefinition;
use crate::yaml::{Limits, Node, parse};

const SECTIONS: [&str; 12] = [
    "Mission",
    "Goals",
    "Context Files",
    "Tools",
    "Read Paths",
    "Write Paths",
    "Schedule",
    "Inbox",
    "Post To Inbox",
    "Budget",
    "Throttle",
    "User Preferences",
];
const LIST_SECTIONS: [&str; 5] = ["Goals", "Context Files", "Tools", "Read Paths", "Write Paths"];

struct Line<'a> {
    number: u32,
    text: &'a str,
}

struct Section<'a> {
    name: &'a str,
    heading: Position,
    lines: Vec<Line<'a>>,
}

/// Reads a Markdown role file; `None` when it has no usable title.
pub(crate) fn check_markdown_role(
    source: &str,
    limits: &Limits,
    diagnostics: &mut Diagnostics,
) -> Option<(ReadRole, Position)> {
    let first = Position { line: 1, column: 1 };
    if source.len() > limits.max_document_bytes {
        diagnostics.error(
            "YAML002",
            "",
            first,
            format!(
                "the document is {} bytes, more than the limit of {} bytes",
                source.len(),
                limits.max_document_bytes
            ),
        );
        return None;
    }
    let (titles, sections) = split_sections(source);
    let (name, name_at) = role_title(&titles, first, diagnostics)?;
    check_role_name(name, "name", name_at, diagnostics);

    let mut role = RoleDefinition { name: name.to_owned(), ..RoleDefinition::default() };
    let mut tools: Vec<(String, String, Position)> = Vec::new();
    let mut seen: Vec<&str> = Vec::new();
    for section in &sections {
        let path = section.name.to_owned();
        let Some(&canonical) = SECTIONS.iter().find(|known| known.eq_ignore_ascii_case(section.name)) else {
            diagnostics.warning(
                "MD003",
                &path,
                section.heading,
                format!("unknown section '{}'{}", section.name, suggestion(section.name, &SECTIONS)),
            );
            continue;
        };
        if seen.contains(&canonical) {
            diagnostics.error("MD004", &path, section.heading, format!("section '{canonical}' appears twice"));
            continue;
        }
        seen.push(canonical);
        let content: Vec<&Line<'_>> = section.lines.iter().filter(|line| !line.text.trim().is_empty()).collect();
        if content.is_empty() {
            diagnostics.warning("MD006", &path, section.heading, format!("section '{canonical}' is empty"));
            continue;
        }
        if LIST_SECTIONS.contains(&canonical) {
            let items = list_items(canonical, &content, diagnostics);
            if canonical == "Tools" {
                tools = items
                    .into_iter()
                    .enumerate()
                    .map(|(index, (tool, at))| (tool.to_owned(), format!("Tools[{index}]"), at))
                    .collect();
                warn_duplicates(&tools, diagnostics);
            } else {
                read_list_section(&mut role, canonical, section.heading, items, diagnostics);
            }
        } else if canonical == "Budget" {
            role.budget = yaml_section(section, limits, diagnostics, check_budget).map(role_budget);
        } else if canonical == "Throttle" {
            role.throttle = yaml_section(section, limits, diagnostics, check_throttle).map(role_throttle);
        } else {
            read_text_section(&mut role, canonical, &path, &content, diagnostics);
        }
    }
    if !seen.contains(&"Mission") {
        diagnostics.error("MD005", "", name_at, format!("role '{name}' has no '## Mission' section"));
    }
    role.tools = tools.iter().map(|(tool, _, _)| tool.clone()).collect();
    Some(((role, tools), name_at))
}

/// The `# ` titles before the first section, and the `## ` sections with
/// their lines (headings inside fenced code are text).
fn split_sections(source: &str) -> (Vec<(&str, Position)>, Vec<Section<'_>>) {
    let mut titles: Vec<(&str, Position)> = Vec::new();
    let mut sections: Vec<Section<'_>> = Vec::new();
    let mut in_fence = false;
    for (index, text) in source.lines().enumerate() {
        let number = u32::try_from(index + 1).unwrap_or(u32::MAX);
        let trimmed = text.trim_start();
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            in_fence = !in_fence;
        }
        if !in_fence {
            if let Some(title) = text.strip_prefix("# ") {
                if sections.is_empty() {
                    titles.push((title.trim(), Position { line: number, column: 3 }));
                    continue;
                }
            } else if let Some(name) = text.strip_prefix("## ") {
                sections.push(Section {
                    name: name.trim(),
                    heading: Position { line: number, column: 4 },
                    lines: Vec::new(),
                });
                continue;
            }
        }
        if let Some(section) = sections.last_mut() {
            section.lines.push(Line { number, text });
        }
    }
    (titles, sections)
}

/// The role's name: the last `#` title before the first section. A leading
/// `# roles/x.md` line names the file (role files may start with one).
fn role_title<'a>(
    titles: &[(&'a str, Position)],
    first: Position,
    diagnostics: &mut Diagnostics,
) -> Option<(&'a str, Position)> {
    let real_titles: Vec<&(&str, Position)> =
        titles.iter().filter(|(title, _)| !(title.ends_with(".md") || title.contains('/'))).collect();
    let Some(&&(name, name_at)) = real_titles.last() else {
        diagnostics.error("MD001", "", first, "the role file has no '# Title' heading naming the role");
        return None;
    };
    if real_titles.len() > 1 {
        diagnostics.warning(
            "MD002",
            "",
            name_at,
            format!("several '# ' titles; the role is named by the last one, '{name}'"),
        );
    }
    Some((name, name_at))
}

/// A list section other than Tools: Goals, Context Files, Read Paths or
/// Write Paths, each item checked.
fn read_list_section(
    role: &mut RoleDefinition,
    canonical: &str,
    heading: Position,
    items: Vec<(&str, Position)>,
    diagnostics: &mut Diagnostics,
) {
    match canonical {
        "Goals" => role.goals = items.into_iter().map(|(item, _)| item.to_owned()).collect(),
        "Context Files" => {
            for (index, (file, at)) in items.iter().enumerate() {
                check_context_file(file, &format!("Context Files[{index}]"), *at, diagnostics);
            }
            role.context_files = items.into_iter().map(|(item, _)| item.to_owned()).collect();
        }
        _ => {
            let written: Vec<(&str, String, Position)> = items
                .iter()
                .enumerate()
                .map(|(index, (entry, at))| (*entry, format!("{canonical}[{index}]"), *at))
                .collect();
            check_workspace_path_list(&written, canonical, heading, diagnostics);
            let entries = items.into_iter().map(|(entry, _)| entry.to_owned()).collect();
            if canonical == "Read Paths" {
                role.read_paths = entries;
            } else {
                role.write_paths = entries;
            }
        }
    }
}

/// A text section: Mission, Schedule, Inbox, Post To Inbox or User
/// Preferences, its lines joined, each checked.
fn read_text_section(
    role: &mut RoleDefinition,
    canonical: &str,
    path: &str,
    content: &[&Line<'_>],
    diagnostics: &mut Diagnostics,
) {
    let text = content.iter().map(|line| line.text.trim()).collect::<Vec<_>>().join("\n");
    let at = Position { line: content[0].number, column: indented_column(content[0].text) };
    match canonical {
        "Mission" => role.mission = text,
        "Schedule" => {
            let lines: Vec<Position> =
                content.iter().map(|line| Position { line: line.number, column: indented_column(line.text) }).collect();
            check_schedule(&text, path, &lines, diagnostics);
            role.schedule = text;
        }
        "Inbox" => {
            check_inbox(&text, path, at, diagnostics);
            role.inbox = text;
        }
        "Post To Inbox" => {
            check_post_to_inbox(&text, path, at, diagnostics);
            role.post_to_inbox = text;
        }
        _ => role.user_preferences = text,
    }
}

/// The column where a line's text starts, after its indentation.
fn indented_column(text: &str) -> u32 {
    u32::try_from(text[..text.len() - text.trim_start().len()].chars().count() + 1).unwrap_or(1)
}

/// A section that holds a YAML mapping, read by `check` with positions in
/// the role file.
fn yaml_section<T>(
    section: &Section<'_>,
    limits: &Limits,
    diagnostics: &mut Diagnostics,
    check: fn(Node<'_>, &mut Diagnostics) -> Option<T>,
) -> Option<T> {
    let source = section.lines.iter().map(|line| line.text).collect::<Vec<_>>().join("\n");
    let mut found = Diagnostics::default();
    let parsed = parse(&source, limits);
    for diagnostic in parsed.diagnostics {
        found.push_diagnostic(diagnostic);
    }
    let checked = parsed.document.as_ref().and_then(|document| check(document.root(), &mut found));
    for mut diagnostic in found.into_sorted() {
        if diagnostic.line > 0 {
            diagnostic.line += section.heading.line;
        }
        diagnostics.push_diagnostic(diagnostic);
    }
    checked
}

/// The bullet items of a list section, with the position of each item's text;
/// other lines draw a warning.
fn list_items<'a>(section: &str, lines: &[&Line<'a>], diagnostics: &mut Diagnostics) -> Vec<(&'a str, Position)> {
    let mut items = Vec::with_capacity(lines.len());
    for line in lines {
        let indent = line.text.len() - line.text.trim_start().len();
        let rest = line.text.trim_start();
        let item = ["- ", "* ", "+ "].iter().find_map(|bullet| rest.strip_prefix(bullet));
        match item {
            Some(item) if !item.trim().is_empty() => {
                let offset = line.text.len() - item.trim_start().len();
                let column = u32::try_from(line.text[..offset].chars().count() + 1).unwrap_or(1);
                items.push((item.trim(), Position { line: line.number, column }));
            }
            _ => diagnostics.warning(
                "MD007",
                section,
                Position {
                    line: line.number,
                    column: u32::try_from(line.text[..indent].chars().count() + 1).unwrap_or(1),
                },
                format!("section '{section}' is a list: write each entry as '- entry'"),
            ),
        }
    }
    items
}
