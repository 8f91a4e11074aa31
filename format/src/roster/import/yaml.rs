//! The YAML side of roster import: every use of the YAML parser sits here, so
//! it can be swapped. Nodes keep their positions for diagnostics.

use std::collections::HashMap;

use saphyr::{LoadableYamlNode, MarkedYamlOwned, ScalarOwned, YamlDataOwned};

use super::{FileDiagnostic, MAX_DEPTH, Severity, Source, file_diagnostic};
use crate::roster::llm_config::{PathStep, Spot, check_llm_config};

pub(super) fn position(node: &MarkedYamlOwned) -> (u32, u32) {
    let start = node.span.start;
    (u32::try_from(start.line()).unwrap_or(0), u32::try_from(start.col() + 1).unwrap_or(0))
}

pub(super) fn scalar_text(node: &MarkedYamlOwned) -> Option<String> {
    match &node.data {
        YamlDataOwned::Value(ScalarOwned::String(text)) => Some(text.clone()),
        YamlDataOwned::Value(ScalarOwned::Integer(number)) => Some(number.to_string()),
        YamlDataOwned::Value(ScalarOwned::FloatingPoint(number)) => Some(number.to_string()),
        YamlDataOwned::Value(ScalarOwned::Boolean(flag)) => Some(flag.to_string()),
        YamlDataOwned::Representation(text, _, _) => Some(text.clone()),
        _ => None,
    }
}

/// Where the YAML first nests deeper than [`MAX_DEPTH`], if it does. Syntax
/// errors are left to the loader, which reports them.
fn too_deep(content: &str) -> Option<(u32, u32)> {
    use saphyr_parser::{Event, Parser};
    let mut depth = 0_usize;
    for event in Parser::new_from_str(content) {
        let Ok((event, span)) = event else { return None };
        match event {
            Event::SequenceStart(..) | Event::MappingStart(..) => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Some((
                        u32::try_from(span.start.line()).unwrap_or(0),
                        u32::try_from(span.start.col() + 1).unwrap_or(0),
                    ));
                }
            }
            Event::SequenceEnd | Event::MappingEnd => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    None
}

pub(super) fn to_json(node: &MarkedYamlOwned) -> serde_json::Value {
    match &node.data {
        YamlDataOwned::Value(ScalarOwned::Null) => serde_json::Value::Null,
        YamlDataOwned::Value(ScalarOwned::Boolean(flag)) => serde_json::Value::Bool(*flag),
        YamlDataOwned::Value(ScalarOwned::Integer(number)) => serde_json::Value::from(*number),
        YamlDataOwned::Value(ScalarOwned::FloatingPoint(number)) => serde_json::Value::from(number.into_inner()),
        YamlDataOwned::Sequence(items) => serde_json::Value::Array(items.iter().map(to_json).collect()),
        YamlDataOwned::Mapping(entries) => serde_json::Value::Object(
            entries.iter().map(|(key, value)| (scalar_text(key).unwrap_or_default(), to_json(value))).collect(),
        ),
        YamlDataOwned::Tagged(_, inner) => to_json(inner),
        _ => scalar_text(node).map(serde_json::Value::String).unwrap_or(serde_json::Value::Null),
    }
}

/// Reads the fields of one YAML mapping, reporting type errors and unknown keys.
pub(super) struct Fields<'a> {
    file_name: &'a str,
    path: String,
    entries: Vec<(String, &'a MarkedYamlOwned)>,
    source: Source,
    diagnostics: Vec<FileDiagnostic>,
    failed: bool,
}

impl<'a> Fields<'a> {
    pub(super) fn new(file_name: &'a str, path: String, node: &'a MarkedYamlOwned) -> Option<Self> {
        let YamlDataOwned::Mapping(mapping) = &node.data else { return None };
        let mut source = Source { file_name: file_name.to_owned(), path: path.clone(), positions: HashMap::new() };
        source.positions.insert(String::new(), position(node));
        let mut entries = Vec::new();
        for (key, value) in mapping {
            let key = scalar_text(key).unwrap_or_default();
            source.positions.insert(key.clone(), position(value));
            entries.push((key, value));
        }
        Some(Self { file_name, path, entries, source, diagnostics: Vec::new(), failed: false })
    }

    pub(super) fn take(&mut self, names: &[&str]) -> Option<(&'a MarkedYamlOwned, String)> {
        let index = self.entries.iter().position(|(key, _)| names.contains(&key.as_str()))?;
        let (key, node) = self.entries.remove(index);
        if matches!(node.data, YamlDataOwned::Value(ScalarOwned::Null)) {
            return None;
        }
        Some((node, key))
    }

    pub(super) fn error(&mut self, code: &'static str, field: &str, message: String) {
        self.failed = true;
        self.diagnostics.push(self.source.diagnostic(Severity::Error, code, field, message));
    }

    pub(super) fn text(&mut self, names: &[&str]) -> String {
        let Some((node, key)) = self.take(names) else { return String::new() };
        match &node.data {
            YamlDataOwned::Sequence(_) | YamlDataOwned::Mapping(_) => {
                self.error("ROS003", &key, format!("{key} must be a string"));
                String::new()
            }
            _ => scalar_text(node).unwrap_or_default(),
        }
    }

    pub(super) fn list(&mut self, names: &[&str]) -> Vec<String> {
        let Some((node, key)) = self.take(names) else { return Vec::new() };
        match &node.data {
            YamlDataOwned::Sequence(items) => {
                let mut list = Vec::new();
                for (index, item) in items.iter().enumerate() {
                    match scalar_text(item) {
                        Some(text) => list.push(text),
                        None => self.error("ROS003", &key, format!("{key}[{index}] must be a string")),
                    }
                }
                list
            }
            YamlDataOwned::Mapping(_) => {
                self.error("ROS003", &key, format!("{key} must be a list of strings"));
                Vec::new()
            }
            _ => scalar_text(node).into_iter().collect(),
        }
    }

    /// A role's `read_paths` or `write_paths`: a list of workspace-relative
    /// paths, each wrong entry reported at its own line and column (`ROS014`).
    pub(super) fn workspace_paths(&mut self, names: &[&str]) -> Vec<String> {
        let Some((node, key)) = self.take(names) else { return Vec::new() };
        let YamlDataOwned::Sequence(items) = &node.data else {
            self.error("ROS003", &key, format!("{key} must be a list of paths"));
            return Vec::new();
        };
        let list_path = format!("{}.{key}", self.path);
        if items.len() > crate::MAX_WORKSPACE_PATHS {
            let (line, column) = position(node);
            self.error_at(
                "ROS014",
                &list_path,
                (line, column),
                format!("{key}: at most {} paths, found {}", crate::MAX_WORKSPACE_PATHS, items.len()),
            );
        }
        let mut paths = Vec::with_capacity(items.len());
        for (index, item) in items.iter().enumerate() {
            let entry_path = format!("{list_path}[{index}]");
            match scalar_text(item) {
                Some(entry) => match crate::workspace_path_problem(&entry) {
                    Some(problem) => self.error_at(
                        "ROS014",
                        &entry_path,
                        position(item),
                        format!("{key}[{index}]: workspace path {problem}"),
                    ),
                    None => paths.push(entry.trim().to_owned()),
                },
                None => self.error_at("ROS003", &entry_path, position(item), format!("{key}[{index}] must be a path")),
            }
        }
        paths
    }

    /// An error at a position of its own (an entry inside a field's value).
    fn error_at(&mut self, code: &'static str, path: &str, (line, column): (u32, u32), message: String) {
        self.failed = true;
        self.diagnostics.push(file_diagnostic(self.file_name, Severity::Error, code, message, path, line, column));
    }

    pub(super) fn number(&mut self, names: &[&str], max: u32) -> u32 {
        let Some((node, key)) = self.take(names) else { return 0 };
        match &node.data {
            YamlDataOwned::Value(ScalarOwned::Integer(number)) if (0..=i64::from(max)).contains(number) => {
                u32::try_from(*number).unwrap_or(0)
            }
            _ => {
                self.error("ROS003", &key, format!("{key} must be a whole number from 0 to {max}"));
                0
            }
        }
    }

    pub(super) fn flag(&mut self, names: &[&str]) -> bool {
        let Some((node, key)) = self.take(names) else { return false };
        match &node.data {
            YamlDataOwned::Value(ScalarOwned::Boolean(flag)) => *flag,
            _ => {
                self.error("ROS003", &key, format!("{key} must be true or false"));
                false
            }
        }
    }

    pub(super) fn json_object(&mut self, names: &[&str]) -> String {
        let Some((node, key)) = self.take(names) else { return String::new() };
        match &node.data {
            YamlDataOwned::Mapping(_) => to_json(node).to_string(),
            _ => match scalar_text(node) {
                Some(text) => text,
                None => {
                    self.error("ROS003", &key, format!("{key} must be a mapping"));
                    String::new()
                }
            },
        }
    }

    /// An agent's model settings (a mapping, or JSON text), as JSON text,
    /// checked by [`check_llm_config`] with each finding at the line and
    /// column of its key or value.
    pub(super) fn llm_config(&mut self, names: &[&str]) -> String {
        let Some((node, key)) = self.take(names) else { return String::new() };
        let (text, settings) = match &node.data {
            YamlDataOwned::Mapping(_) => {
                let settings = to_json(node);
                (settings.to_string(), settings)
            }
            _ => match scalar_text(node) {
                // JSON text: a finding can only point at the text; what is not
                // a JSON object is the model's rule to report.
                Some(text) => {
                    let settings = serde_json::from_str(&text).unwrap_or(serde_json::Value::Null);
                    (text, settings)
                }
                None => {
                    self.error("ROS003", &key, format!("{key} must be a mapping"));
                    return String::new();
                }
            },
        };
        if !settings.is_object() {
            return text;
        }
        let mut findings: Vec<_> = check_llm_config(&settings)
            .into_iter()
            .map(|finding| (locate(node, &finding.steps, finding.spot), finding))
            .collect();
        findings.sort_by_key(|(at, _)| *at);
        for ((line, column), finding) in findings {
            if finding.severity == Severity::Error {
                self.failed = true;
            }
            let path = finding.path_under(&format!("{}.{key}", self.path));
            self.diagnostics.push(file_diagnostic(
                self.file_name,
                finding.severity,
                finding.code,
                finding.message,
                &path,
                line,
                column,
            ));
        }
        text
    }

    /// A mapping read into `T` (its fields, none unknown); `None` when absent
    /// or wrong.
    pub(super) fn mapping<T: serde::de::DeserializeOwned>(&mut self, names: &[&str]) -> Option<T> {
        let (node, key) = self.take(names)?;
        if !matches!(node.data, YamlDataOwned::Mapping(_)) {
            self.error("ROS003", &key, format!("{key} must be a mapping"));
            return None;
        }
        match serde_json::from_value(to_json(node)) {
            Ok(value) => Some(value),
            Err(error) => {
                self.error("ROS003", &key, format!("{key}: {error}"));
                None
            }
        }
    }

    /// Reports the keys nobody took and returns the findings.
    pub(super) fn finish(mut self) -> (Source, Vec<FileDiagnostic>, bool) {
        for (key, _) in std::mem::take(&mut self.entries) {
            self.diagnostics.push(self.source.diagnostic(
                Severity::Warning,
                "ROS002",
                &key,
                format!("unknown field {key:?} is ignored"),
            ));
        }
        (self.source, self.diagnostics, self.failed)
    }
}

/// The line and column of the key or value that `steps` lead to from
/// `node`; where the path leaves the YAML (JSON text), the nearest node's.
fn locate(node: &MarkedYamlOwned, steps: &[PathStep], spot: Spot) -> (u32, u32) {
    let mut current = node;
    for (index, step) in steps.iter().enumerate() {
        while let YamlDataOwned::Tagged(_, inner) = &current.data {
            current = inner;
        }
        let next = match (step, &current.data) {
            (PathStep::Key(wanted), YamlDataOwned::Mapping(entries)) => {
                // The last of duplicate keys is the one the JSON holds.
                let Some((key, value)) =
                    entries.iter().rev().find(|(key, _)| scalar_text(key).as_deref() == Some(wanted.as_str()))
                else {
                    break;
                };
                if index + 1 == steps.len() && spot == Spot::Key {
                    return position(key);
                }
                value
            }
            (PathStep::Index(wanted), YamlDataOwned::Sequence(items)) => match items.get(*wanted) {
                Some(item) => item,
                None => break,
            },
            _ => break,
        };
        current = next;
    }
    position(current)
}

/// Parses one YAML document with positions; `None` for an empty file. Nesting
/// is measured on the event stream first, so a hostile file never builds (or
/// drops, recursively) a deep tree; aliases expand within saphyr's node budget.
pub(super) fn load_document(name: &str, content: &str) -> Result<Option<MarkedYamlOwned>, FileDiagnostic> {
    if let Some((line, column)) = too_deep(content) {
        return Err(file_diagnostic(
            name,
            Severity::Error,
            "ROS010",
            format!("nested deeper than {MAX_DEPTH} levels"),
            "",
            line,
            column,
        ));
    }
    let mut documents = MarkedYamlOwned::load_from_str(content).map_err(|error| {
        let marker = error.marker();
        file_diagnostic(
            name,
            Severity::Error,
            "ROS001",
            format!("not valid YAML: {}", error.info()),
            "",
            u32::try_from(marker.line()).unwrap_or(0),
            u32::try_from(marker.col() + 1).unwrap_or(0),
        )
    })?;
    if documents.len() > 1 {
        return Err(file_diagnostic(name, Severity::Error, "ROS001", "one YAML document per file".into(), "", 0, 0));
    }
    Ok(documents.pop())
}
