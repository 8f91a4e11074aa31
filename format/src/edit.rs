//! Editing a process document's text where a person wrote it: the role
//! matrix of the console reads each step's roles ([`step_roles`]) and
//! rewrites one step's `roles` block ([`set_step_roles`]) without touching
//! any other line, so comments and unrelated YAML survive the edit.
//!
//! Both work on documents that do not validate yet: they need the YAML to
//! parse and `steps` to be a list of mappings, nothing more.

use crate::StepRoles;
use crate::yaml::{Limits, Node};

/// One row of the role matrix: a step and the roles its text gives it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StepRolesRow {
    /// The step's `id`.
    pub step_id: String,
    /// The step's `name`, or its id when it has none.
    pub name: String,
    /// `roles.executor`, else the step's `agent`; empty when neither is set.
    pub executor: String,
    /// `roles.monitors`.
    pub monitors: Vec<String>,
    /// `roles.informed`.
    pub informed: Vec<String>,
}

/// The role matrix of `source`: one row per step that has an `id`, in
/// document order. An error names why the document cannot be read as steps.
pub fn step_roles(source: &str) -> Result<Vec<StepRolesRow>, String> {
    let parsed = crate::yaml::parse(source, &Limits::default());
    let Some(document) = parsed.document else {
        return Err(first_problem(&parsed.diagnostics));
    };
    let steps = document.root().get("steps").and_then(Node::sequence).ok_or("the document has no list of steps")?;
    Ok(steps
        .filter_map(|step| {
            let step_id = step.get("id")?.scalar_text()?.to_owned();
            let roles = step.get("roles");
            let role = |key: &str| roles.and_then(|roles| roles.get(key));
            let names = |key: &str| -> Vec<String> {
                role(key)
                    .and_then(Node::sequence)
                    .map(|items| items.filter_map(|item| item.scalar_text().map(str::to_owned)).collect())
                    .unwrap_or_default()
            };
            let executor = role("executor")
                .or_else(|| step.get("agent"))
                .and_then(|node| node.as_str())
                .unwrap_or_default()
                .to_owned();
            Some(StepRolesRow {
                name: step.get("name").and_then(|name| name.as_str()).unwrap_or(&step_id).to_owned(),
                executor,
                monitors: names("monitors"),
                informed: names("informed"),
                step_id,
            })
        })
        .collect())
}

/// `source` with the `roles` block of step `step_id` replaced by `roles`
/// (removed when `roles` names nobody), every other line as it was. The
/// block is written in block style at the indentation of the step's keys.
pub fn set_step_roles(source: &str, step_id: &str, roles: &StepRoles) -> Result<String, String> {
    for name in std::iter::once(&roles.executor).chain(&roles.monitors).chain(&roles.informed) {
        if !name.is_empty() && !crate::is_identifier(name) {
            return Err(format!("'{name}' is not an agent id"));
        }
    }
    let parsed = crate::yaml::parse(source, &Limits::default());
    let Some(document) = parsed.document else {
        return Err(first_problem(&parsed.diagnostics));
    };
    let steps = document.root().get("steps").and_then(Node::sequence).ok_or("the document has no list of steps")?;
    let step = steps
        .into_iter()
        .find(|step| step.get("id").and_then(|id| id.scalar_text()) == Some(step_id))
        .ok_or_else(|| format!("no step has the id '{step_id}'"))?;
    let keys: Vec<Node<'_>> = step.mapping().ok_or("the step is not a mapping")?.map(|(key, _)| key).collect();
    let first_key = keys.first().ok_or("the step is empty")?.position();
    if keys.iter().any(|key| key.position().line == first_key.line && key.position() != first_key) {
        return Err(format!("step '{step_id}' is written on one line; give it one key per line to edit its roles"));
    }
    let lines: Vec<&str> = source.split_inclusive('\n').collect();
    let indent = first_key.column.saturating_sub(1) as usize;
    // The step's keys sit at `indent`: a line belongs to a block while it
    // is blank or indented at least `deeper` than that.
    let inside = |line: &str, deeper: usize| {
        let trimmed = line.trim_start_matches(' ');
        trimmed.trim().is_empty() || line.len() - trimmed.len() >= indent + deeper
    };
    let roles_key = keys.iter().find(|key| key.scalar_text() == Some("roles"));
    let (start, end) = match roles_key {
        Some(key) => {
            let start = key.position().line as usize - 1;
            let mut end = start + 1;
            while end < lines.len() && inside(lines[end], 1) {
                end += 1;
            }
            // Blank lines and comments after the block belong to what follows.
            while end > start + 1 && lines[end - 1].trim().is_empty() {
                end -= 1;
            }
            (start, end)
        }
        None => {
            let mut end = first_key.line as usize;
            while end < lines.len() && inside(lines[end], 0) {
                end += 1;
            }
            while end > first_key.line as usize && (lines[end - 1].trim().is_empty() || is_comment(lines[end - 1])) {
                end -= 1;
            }
            (end, end)
        }
    };
    let mut text = String::with_capacity(source.len() + 128);
    lines[..start].iter().for_each(|line| text.push_str(line));
    if start > 0 && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&roles_block(indent, roles));
    lines[end..].iter().for_each(|line| text.push_str(line));
    Ok(text)
}

fn is_comment(line: &str) -> bool {
    line.trim_start().starts_with('#')
}

fn roles_block(indent: usize, roles: &StepRoles) -> String {
    if roles.executor.is_empty() && roles.monitors.is_empty() && roles.informed.is_empty() {
        return String::new();
    }
    let pad = " ".repeat(indent);
    let mut block = format!("{pad}roles:\n");
    if !roles.executor.is_empty() {
        block.push_str(&format!("{pad}  executor: {}\n", roles.executor));
    }
    for (key, names) in [("monitors", &roles.monitors), ("informed", &roles.informed)] {
        if !names.is_empty() {
            block.push_str(&format!("{pad}  {key}: [{}]\n", names.join(", ")));
        }
    }
    block
}

fn first_problem(diagnostics: &[crate::Diagnostic]) -> String {
    diagnostics.first().map_or_else(
        || "the document cannot be read".to_owned(),
        |problem| format!("line {}, column {}: {}", problem.line, problem.column, problem.message),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOURCE: &str = "\
# A comment at the top.
name: demo
lead: lead-agent
steps:
  - id: first   # the first step
    agent: writer-agent
    message: Write
    roles:
      executor: writer-agent
      # who watches
      monitors: [editor-agent]

  # The second step.
  - id: second
    name: Second
    agent: editor-agent
    depends_on: [first]
extra: kept # unrelated
";

    fn roles(executor: &str, monitors: &[&str], informed: &[&str]) -> StepRoles {
        StepRoles {
            executor: executor.to_owned(),
            monitors: monitors.iter().map(|name| (*name).to_owned()).collect(),
            informed: informed.iter().map(|name| (*name).to_owned()).collect(),
        }
    }

    #[test]
    fn reads_the_matrix() {
        let rows = step_roles(SOURCE).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(
            (rows[0].executor.as_str(), rows[0].monitors.as_slice()),
            ("writer-agent", &["editor-agent".to_owned()][..])
        );
        assert_eq!((rows[1].name.as_str(), rows[1].executor.as_str()), ("Second", "editor-agent"));
        assert!(rows[1].monitors.is_empty());
    }

    #[test]
    fn adds_a_block_keeping_every_other_line() {
        let edited =
            set_step_roles(SOURCE, "second", &roles("editor-agent", &["a-agent", "b-agent"], &["c-agent"])).unwrap();
        let expected = SOURCE.replace(
            "    depends_on: [first]\n",
            "    depends_on: [first]\n    roles:\n      executor: editor-agent\n      monitors: [a-agent, b-agent]\n      informed: [c-agent]\n",
        );
        assert_eq!(edited, expected);
        let rows = step_roles(&edited).unwrap();
        assert_eq!(rows[1].monitors, ["a-agent", "b-agent"]);
        assert_eq!(rows[1].informed, ["c-agent"]);
    }

    #[test]
    fn replaces_a_block_and_keeps_what_follows() {
        let edited = set_step_roles(SOURCE, "first", &roles("writer-agent", &[], &["archive-agent"])).unwrap();
        assert!(
            edited.contains(
                "    roles:\n      executor: writer-agent\n      informed: [archive-agent]\n\n  # The second step.\n"
            ),
            "{edited}"
        );
        assert!(edited.starts_with("# A comment at the top.\n") && edited.ends_with("extra: kept # unrelated\n"));
        assert!(!edited.contains("editor-agent]"), "{edited}");
        let removed = set_step_roles(&edited, "first", &StepRoles::default()).unwrap();
        assert!(!removed.contains("roles:"), "{removed}");
        assert!(removed.contains("    message: Write\n\n  # The second step.\n"), "{removed}");
    }

    #[test]
    fn refuses_what_it_cannot_edit() {
        assert!(set_step_roles(SOURCE, "missing", &StepRoles::default()).unwrap_err().contains("no step"));
        assert!(
            set_step_roles(SOURCE, "first", &roles("bad name!", &[], &[])).unwrap_err().contains("not an agent id")
        );
        let one_line = "name: x\nsteps:\n  - {id: a, agent: b}\n";
        assert!(set_step_roles(one_line, "a", &StepRoles::default()).unwrap_err().contains("one line"));
        assert!(step_roles("steps: [").is_err());
    }
}
