//! Roster import: a YAML roster (teams, agents, roles) and Markdown role files
//! (seed 003 sections), parsed into entities with diagnostics that carry the
//! file, the path and the line and column. The format is documented in
//! `docs/roster-format.md`.

use std::collections::{HashMap, HashSet};

use saphyr::{LoadableYamlNode, MarkedYamlOwned, ScalarOwned, YamlDataOwned};

use super::model::{Agent, RoleDefinition, Team};
use crate::error::Error;

/// Largest file accepted.
pub const MAX_FILE_BYTES: usize = 1024 * 1024;
/// Most files in one import.
pub const MAX_FILES: usize = 200;
/// Deepest YAML nesting accepted.
pub const MAX_DEPTH: usize = 32;

/// A file to import.
#[derive(Debug, Clone)]
pub struct ImportFile {
    /// Its name; `.md` files are Markdown role definitions.
    pub name: String,
    /// Its text.
    pub content: String,
}

/// How serious a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// The import is refused.
    Error,
    /// Accepted, but probably wrong.
    Warning,
}

/// One finding about one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileDiagnostic {
    /// The file.
    pub file_name: String,
    /// Error or warning.
    pub severity: Severity,
    /// A stable code (`ROS001` ...), listed in docs/roster-format.md.
    pub code: &'static str,
    /// A sentence.
    pub message: String,
    /// Where: `agents[2].senior`.
    pub path: String,
    /// 1-based line; 0 when unknown.
    pub line: u32,
    /// 1-based column; 0 when unknown.
    pub column: u32,
}

/// Where an entity came from.
#[derive(Debug, Clone, Default)]
pub struct Source {
    /// The file.
    pub file_name: String,
    /// The entity's path, such as `agents[2]`.
    pub path: String,
    /// Line and column of the entity and of each of its fields.
    pub positions: HashMap<String, (u32, u32)>,
}

impl Source {
    fn diagnostic(&self, severity: Severity, code: &'static str, field: &str, message: String) -> FileDiagnostic {
        let (line, column) = self.positions.get(field).or_else(|| self.positions.get("")).copied().unwrap_or_default();
        let path = if field.is_empty() { self.path.clone() } else { format!("{}.{field}", self.path) };
        FileDiagnostic { file_name: self.file_name.clone(), severity, code, message, path, line, column }
    }
}

/// What the files hold.
#[derive(Debug, Clone, Default)]
pub struct ParsedRoster {
    /// Teams.
    pub teams: Vec<Team>,
    /// Where each team came from.
    pub team_sources: Vec<Source>,
    /// Role definitions.
    pub roles: Vec<RoleDefinition>,
    /// Agents.
    pub agents: Vec<Agent>,
    /// Where each agent came from.
    pub agent_sources: Vec<Source>,
    /// Findings so far.
    pub diagnostics: Vec<FileDiagnostic>,
}

fn file_diagnostic(
    file_name: &str,
    severity: Severity,
    code: &'static str,
    message: String,
    path: &str,
    line: u32,
    column: u32,
) -> FileDiagnostic {
    FileDiagnostic { file_name: file_name.to_owned(), severity, code, message, path: path.to_owned(), line, column }
}

/// Parses every file; entities with errors are left out and reported.
pub fn parse_files(files: &[ImportFile]) -> ParsedRoster {
    let mut parsed = ParsedRoster::default();
    if files.len() > MAX_FILES {
        parsed.diagnostics.push(file_diagnostic(
            "",
            Severity::Error,
            "ROS010",
            format!("at most {MAX_FILES} files per import"),
            "",
            0,
            0,
        ));
        return parsed;
    }
    for file in files {
        if file.name.trim().is_empty() {
            parsed.diagnostics.push(file_diagnostic(
                "",
                Severity::Error,
                "ROS010",
                "a file has no name".into(),
                "",
                0,
                0,
            ));
            continue;
        }
        if file.content.len() > MAX_FILE_BYTES {
            parsed.diagnostics.push(file_diagnostic(
                &file.name,
                Severity::Error,
                "ROS010",
                format!("larger than {MAX_FILE_BYTES} bytes"),
                "",
                0,
                0,
            ));
            continue;
        }
        if file.name.ends_with(".md") {
            parse_markdown_role(file, &mut parsed);
        } else {
            parse_yaml_roster(file, &mut parsed);
        }
    }
    check_duplicates(&mut parsed);
    parsed
}

fn check_duplicates(parsed: &mut ParsedRoster) {
    let mut seen = HashSet::new();
    for (agent, source) in parsed.agents.iter().zip(&parsed.agent_sources) {
        if !seen.insert(agent.id.clone()) {
            parsed.diagnostics.push(source.diagnostic(
                Severity::Error,
                "ROS006",
                "id",
                format!("agent {:?} is defined twice", agent.id),
            ));
        }
    }
    let mut seen = HashSet::new();
    for (team, source) in parsed.teams.iter().zip(&parsed.team_sources) {
        if !seen.insert(team.name.clone()) {
            parsed.diagnostics.push(source.diagnostic(
                Severity::Error,
                "ROS006",
                "name",
                format!("team {:?} is defined twice", team.name),
            ));
        }
    }
    let mut seen = HashSet::new();
    let duplicates: Vec<String> =
        parsed.roles.iter().filter(|role| !seen.insert(role.name.clone())).map(|role| role.name.clone()).collect();
    for name in duplicates {
        parsed.diagnostics.push(file_diagnostic(
            "",
            Severity::Error,
            "ROS006",
            format!("role {name:?} is defined twice"),
            "",
            0,
            0,
        ));
    }
}

/// What the roster already holds, for reference checks.
#[derive(Debug, Clone, Default)]
pub struct Existing {
    /// Agent id -> senior id.
    pub agents: HashMap<String, String>,
    /// Team names.
    pub teams: HashSet<String>,
    /// Role names.
    pub roles: HashSet<String>,
}

/// Checks that teams, seniors, leads and roles exist (in the files or the
/// roster) and that the hierarchy has no cycle.
pub fn check_references(parsed: &ParsedRoster, existing: &Existing) -> Vec<FileDiagnostic> {
    let mut diagnostics = Vec::new();
    let teams: HashSet<&str> =
        parsed.teams.iter().map(|team| team.name.as_str()).chain(existing.teams.iter().map(String::as_str)).collect();
    let roles: HashSet<&str> =
        parsed.roles.iter().map(|role| role.name.as_str()).chain(existing.roles.iter().map(String::as_str)).collect();
    let mut seniors: HashMap<&str, &str> =
        existing.agents.iter().map(|(id, senior)| (id.as_str(), senior.as_str())).collect();
    for agent in &parsed.agents {
        seniors.insert(&agent.id, &agent.senior_id);
    }
    for (agent, source) in parsed.agents.iter().zip(&parsed.agent_sources) {
        if !agent.team.is_empty() && !teams.contains(agent.team.as_str()) {
            diagnostics.push(source.diagnostic(
                Severity::Error,
                "ROS007",
                "team",
                format!("team {:?} is neither in the files nor in the roster", agent.team),
            ));
        }
        if !agent.senior_id.is_empty() && !seniors.contains_key(agent.senior_id.as_str()) {
            diagnostics.push(source.diagnostic(
                Severity::Error,
                "ROS007",
                "senior",
                format!("senior {:?} is neither in the files nor in the roster", agent.senior_id),
            ));
        }
        if !agent.role.is_empty() && !roles.contains(agent.role.as_str()) {
            diagnostics.push(source.diagnostic(
                Severity::Warning,
                "ROS009",
                "role",
                format!("role {:?} has no role definition yet", agent.role),
            ));
        }
        let mut path = vec![agent.id.as_str()];
        let mut current = agent.senior_id.as_str();
        while !current.is_empty() {
            if path.contains(&current) {
                path.push(current);
                if current == agent.id {
                    diagnostics.push(source.diagnostic(
                        Severity::Error,
                        "ROS008",
                        "senior",
                        format!("the hierarchy loops: {}", path.join(" -> ")),
                    ));
                }
                break;
            }
            path.push(current);
            current = seniors.get(current).copied().unwrap_or_default();
        }
    }
    let agent_ids: HashSet<&str> = seniors.keys().copied().collect();
    for (team, source) in parsed.teams.iter().zip(&parsed.team_sources) {
        if !team.lead_agent_id.is_empty() && !agent_ids.contains(team.lead_agent_id.as_str()) {
            diagnostics.push(source.diagnostic(
                Severity::Error,
                "ROS007",
                "lead",
                format!("lead {:?} is neither in the files nor in the roster", team.lead_agent_id),
            ));
        }
    }
    diagnostics
}

// ---------------------------------------------------------------- YAML

fn position(node: &MarkedYamlOwned) -> (u32, u32) {
    let start = node.span.start;
    (u32::try_from(start.line()).unwrap_or(0), u32::try_from(start.col() + 1).unwrap_or(0))
}

fn scalar_text(node: &MarkedYamlOwned) -> Option<String> {
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

fn to_json(node: &MarkedYamlOwned) -> serde_json::Value {
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
struct Fields<'a> {
    file_name: &'a str,
    path: String,
    entries: Vec<(String, &'a MarkedYamlOwned)>,
    source: Source,
    diagnostics: Vec<FileDiagnostic>,
    failed: bool,
}

impl<'a> Fields<'a> {
    fn new(file_name: &'a str, path: String, node: &'a MarkedYamlOwned) -> Option<Self> {
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

    fn take(&mut self, names: &[&str]) -> Option<(&'a MarkedYamlOwned, String)> {
        let index = self.entries.iter().position(|(key, _)| names.contains(&key.as_str()))?;
        let (key, node) = self.entries.remove(index);
        if matches!(node.data, YamlDataOwned::Value(ScalarOwned::Null)) {
            return None;
        }
        Some((node, key))
    }

    fn error(&mut self, code: &'static str, field: &str, message: String) {
        self.failed = true;
        self.diagnostics.push(self.source.diagnostic(Severity::Error, code, field, message));
    }

    fn text(&mut self, names: &[&str]) -> String {
        let Some((node, key)) = self.take(names) else { return String::new() };
        match &node.data {
            YamlDataOwned::Sequence(_) | YamlDataOwned::Mapping(_) => {
                self.error("ROS003", &key, format!("{key} must be a string"));
                String::new()
            }
            _ => scalar_text(node).unwrap_or_default(),
        }
    }

    fn list(&mut self, names: &[&str]) -> Vec<String> {
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

    fn number(&mut self, names: &[&str], max: u32) -> u32 {
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

    fn flag(&mut self, names: &[&str]) -> bool {
        let Some((node, key)) = self.take(names) else { return false };
        match &node.data {
            YamlDataOwned::Value(ScalarOwned::Boolean(flag)) => *flag,
            _ => {
                self.error("ROS003", &key, format!("{key} must be true or false"));
                false
            }
        }
    }

    fn json_object(&mut self, names: &[&str]) -> String {
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

    /// Reports the keys nobody took and returns the findings.
    fn finish(mut self) -> (Source, Vec<FileDiagnostic>, bool) {
        for (key, _) in std::mem::take(&mut self.entries) {
            self.diagnostics.push(self.source.diagnostic(
                Severity::Warning,
                "ROS002",
                &key,
                format!("unknown field {key:?} is ignored"),
            ));
        }
        let _ = (self.file_name, &self.path);
        (self.source, self.diagnostics, self.failed)
    }
}

fn invalid_message(error: Error) -> String {
    match error {
        Error::InvalidArgument(message) => message,
        other => other.to_string(),
    }
}

/// The field a normalisation message names (`agent.team: ...` -> `team`).
fn field_of(message: &str, aliases: &[(&str, &str)]) -> String {
    let field = message.split(':').next().unwrap_or_default();
    let field = field.split('.').nth(1).unwrap_or_default();
    let field = field.split('[').next().unwrap_or_default();
    aliases.iter().find(|(from, _)| *from == field).map(|(_, to)| (*to).to_owned()).unwrap_or_else(|| field.to_owned())
}

fn parse_yaml_roster(file: &ImportFile, parsed: &mut ParsedRoster) {
    let name = file.name.as_str();
    // Measure the nesting on the event stream before building a tree: a
    // hostile file must not build (or drop, recursively) a deep tree.
    if let Some((line, column)) = too_deep(&file.content) {
        parsed.diagnostics.push(file_diagnostic(
            name,
            Severity::Error,
            "ROS010",
            format!("nested deeper than {MAX_DEPTH} levels"),
            "",
            line,
            column,
        ));
        return;
    }
    let documents = match MarkedYamlOwned::load_from_str(&file.content) {
        Ok(documents) => documents,
        Err(error) => {
            let marker = error.marker();
            parsed.diagnostics.push(file_diagnostic(
                name,
                Severity::Error,
                "ROS001",
                format!("not valid YAML: {}", error.info()),
                "",
                u32::try_from(marker.line()).unwrap_or(0),
                u32::try_from(marker.col() + 1).unwrap_or(0),
            ));
            return;
        }
    };
    let Some(root) = documents.first() else {
        parsed.diagnostics.push(file_diagnostic(
            name,
            Severity::Warning,
            "ROS004",
            "the file is empty".into(),
            "",
            0,
            0,
        ));
        return;
    };
    if documents.len() > 1 {
        parsed.diagnostics.push(file_diagnostic(
            name,
            Severity::Error,
            "ROS001",
            "one YAML document per file".into(),
            "",
            0,
            0,
        ));
        return;
    }
    let Some(mut top) = Fields::new(name, String::new(), root) else {
        let (line, column) = position(root);
        parsed.diagnostics.push(file_diagnostic(
            name,
            Severity::Error,
            "ROS003",
            "a roster file is a mapping with teams, agents and roles".into(),
            "",
            line,
            column,
        ));
        return;
    };
    for (section, key) in [("teams", "teams"), ("agents", "agents"), ("roles", "roles")] {
        let Some((node, _)) = top.take(&[key]) else { continue };
        let YamlDataOwned::Sequence(items) = &node.data else {
            let (line, column) = position(node);
            parsed.diagnostics.push(file_diagnostic(
                name,
                Severity::Error,
                "ROS003",
                format!("{section} must be a list"),
                section,
                line,
                column,
            ));
            continue;
        };
        for (index, item) in items.iter().enumerate() {
            let path = format!("{section}[{index}]");
            let Some(fields) = Fields::new(name, path.clone(), item) else {
                let (line, column) = position(item);
                parsed.diagnostics.push(file_diagnostic(
                    name,
                    Severity::Error,
                    "ROS003",
                    format!("{path} must be a mapping"),
                    &path,
                    line,
                    column,
                ));
                continue;
            };
            match section {
                "teams" => read_team(fields, parsed),
                "agents" => read_agent(fields, parsed),
                _ => read_role(fields, parsed),
            }
        }
    }
    let (_, diagnostics, _) = top.finish();
    parsed.diagnostics.extend(diagnostics);
}

fn read_team(mut fields: Fields<'_>, parsed: &mut ParsedRoster) {
    let team = Team {
        name: fields.text(&["name", "id"]),
        description: fields.text(&["description"]),
        lead_agent_id: fields.text(&["lead", "lead_agent_id"]),
    };
    let (source, diagnostics, failed) = fields.finish();
    parsed.diagnostics.extend(diagnostics);
    if failed {
        return;
    }
    match team.normalize() {
        Ok(team) => {
            parsed.teams.push(team);
            parsed.team_sources.push(source);
        }
        Err(error) => {
            let message = invalid_message(error);
            let field = field_of(&message, &[("lead_agent_id", "lead")]);
            parsed.diagnostics.push(source.diagnostic(Severity::Error, "ROS005", &field, message));
        }
    }
}

fn read_agent(mut fields: Fields<'_>, parsed: &mut ParsedRoster) {
    let agent = Agent {
        id: fields.text(&["id"]),
        name: fields.text(&["name"]),
        role: fields.text(&["role"]),
        team: fields.text(&["team"]),
        senior_id: fields.text(&["senior", "senior_id", "seniorId"]),
        expertise: fields.list(&["expertise"]),
        workload_capacity: fields.number(&["capacity", "workload_capacity"], super::model::MAX_CAPACITY),
        custom_prompt: fields.text(&["prompt", "custom_prompt", "system_prompt"]),
        llm_config_json: fields.json_object(&["llm_config", "llm_config_json"]),
        backstory: fields.text(&["backstory"]),
        allow_delegation: fields.flag(&["allow_delegation"]),
        max_iterations: fields.number(&["max_iterations"], 10_000),
        ..Agent::default()
    };
    let (source, diagnostics, failed) = fields.finish();
    parsed.diagnostics.extend(diagnostics);
    if failed {
        return;
    }
    match agent.normalize() {
        Ok(agent) => {
            parsed.agents.push(agent);
            parsed.agent_sources.push(source);
        }
        Err(error) => {
            let message = invalid_message(error);
            let field = field_of(
                &message,
                &[("senior_id", "senior"), ("workload_capacity", "capacity"), ("llm_config_json", "llm_config")],
            );
            parsed.diagnostics.push(source.diagnostic(Severity::Error, "ROS005", &field, message));
        }
    }
}

fn read_role(mut fields: Fields<'_>, parsed: &mut ParsedRoster) {
    let role = RoleDefinition {
        name: fields.text(&["name"]),
        description: fields.text(&["description"]),
        goals: fields.list(&["goals"]),
        responsibilities: fields.list(&["responsibilities"]),
        tools: fields.list(&["tools"]),
        permitted_actions: fields.list(&["actions", "permitted_actions"]),
        input_schema_json: fields.json_object(&["input_schema", "input_schema_json"]),
        output_schema_json: fields.json_object(&["output_schema", "output_schema_json"]),
        mission: fields.text(&["mission"]),
        context_files: fields.list(&["context_files"]),
        schedule: fields.text(&["schedule"]),
        inbox: fields.text(&["inbox"]),
        user_preferences: fields.text(&["user_preferences"]),
    };
    let (source, diagnostics, failed) = fields.finish();
    parsed.diagnostics.extend(diagnostics);
    if failed {
        return;
    }
    match role.normalize() {
        Ok(role) => parsed.roles.push(role),
        Err(error) => {
            let message = invalid_message(error);
            let field = field_of(&message, &[("permitted_actions", "actions")]);
            parsed.diagnostics.push(source.diagnostic(Severity::Error, "ROS005", &field, message));
        }
    }
}

// ---------------------------------------------------------------- Markdown

/// Parses a seed 003 Markdown role file: the file name (without `.md`) is the
/// role's name, the last `#` title before the sections its description, and
/// the `##` sections its fields.
fn parse_markdown_role(file: &ImportFile, parsed: &mut ParsedRoster) {
    let name = file.name.as_str();
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
    if sections.is_empty() {
        parsed.diagnostics.push(file_diagnostic(
            name,
            Severity::Error,
            "MD001",
            "no `## ` sections: not a role file (expected Mission, Goals, Tools, ...)".into(),
            "",
            1,
            1,
        ));
        return;
    }
    let mut seen = HashSet::new();
    for (heading, line_number, lines) in &sections {
        let key = heading.to_lowercase();
        if !seen.insert(key.clone()) {
            parsed.diagnostics.push(file_diagnostic(
                name,
                Severity::Error,
                "MD004",
                format!("section {heading:?} appears twice"),
                heading,
                *line_number,
                1,
            ));
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
            "tools" => role.tools = items(),
            "actions" | "permitted actions" => role.permitted_actions = items(),
            "schedule" => role.schedule = text(),
            "inbox" => role.inbox = text(),
            "user preferences" => role.user_preferences = text(),
            _ => parsed.diagnostics.push(file_diagnostic(
                name,
                Severity::Warning,
                "MD002",
                format!("unknown section {heading:?} is ignored"),
                heading,
                *line_number,
                1,
            )),
        }
    }
    if role.description.is_empty() {
        role.description = title;
    }
    if role.mission.is_empty() {
        parsed.diagnostics.push(file_diagnostic(
            name,
            Severity::Warning,
            "MD003",
            "the role has no Mission section".into(),
            "Mission",
            0,
            0,
        ));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, content: &str) -> ImportFile {
        ImportFile { name: name.into(), content: content.into() }
    }

    #[test]
    fn reads_the_roster_format() {
        let parsed = parse_files(&[file(
            "roster.yaml",
            "teams: [{name: research, description: R, lead: alice}]\nagents:\n  - {id: alice, name: Alice, role: researcher, team: research, expertise: [Research, writing], capacity: 3, prompt: hi, llm_config: {model: x}}\nroles:\n  - {name: researcher, goals: [find], actions: [analyze]}\n",
        )]);
        assert!(parsed.diagnostics.is_empty(), "{:?}", parsed.diagnostics);
        assert_eq!(parsed.agents[0].expertise, vec!["research", "writing"]);
        assert_eq!(parsed.agents[0].workload_capacity, 3);
        assert_eq!(parsed.agents[0].llm_config_json, r#"{"model":"x"}"#);
        assert_eq!(parsed.teams[0].lead_agent_id, "alice");
        assert_eq!(parsed.roles[0].permitted_actions, vec!["analyze"]);
    }

    #[test]
    fn reports_positions() {
        let parsed = parse_files(&[file("r.yaml", "agents:\n  - id: Bad Id\n    capacity: many\n")]);
        let codes: Vec<(&str, u32, u32)> = parsed.diagnostics.iter().map(|d| (d.code, d.line, d.column)).collect();
        assert_eq!(codes, vec![("ROS003", 3, 15)]);
        let parsed = parse_files(&[file("r.yaml", "agents:\n  - id: Bad Id\n")]);
        assert_eq!(parsed.diagnostics[0].code, "ROS005");
        assert_eq!(parsed.diagnostics[0].path, "agents[0].id");
        assert_eq!((parsed.diagnostics[0].line, parsed.diagnostics[0].column), (2, 9));
        let parsed = parse_files(&[file("r.yaml", "agents: [\n")]);
        assert_eq!(parsed.diagnostics[0].code, "ROS001");
    }

    #[test]
    fn refuses_hostile_yaml() {
        let deep = format!("agents: {}{}", "[".repeat(100_000), "]".repeat(100_000));
        let parsed = parse_files(&[file("deep.yaml", &deep)]);
        assert_eq!(parsed.diagnostics[0].code, "ROS010");
        let laughs = "a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\ne: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\n";
        let parsed = parse_files(&[file("laughs.yaml", laughs)]);
        assert_eq!(parsed.diagnostics[0].code, "ROS001", "{:?}", parsed.diagnostics);
        let parsed = parse_files(&[file("big.yaml", &"#".repeat(MAX_FILE_BYTES + 1))]);
        assert_eq!(parsed.diagnostics[0].code, "ROS010");
    }

    #[test]
    fn reads_markdown_roles() {
        let parsed = parse_files(&[file(
            "roles/delivery.md",
            "# roles/delivery.md\n\n# Delivery Manager\n\n## Mission\nKeep delivery on time.\n\n## Goals\n- Track progress\n- Find blockers\n\n## Context Files\n- project/scope.md\n\n## Tools\n- read_file\n\n## Schedule\n9am and 5pm, weekdays\n\n## Inbox\nagent/inbox/delivery/\n\n## User Preferences\n(none)\n",
        )]);
        assert!(parsed.diagnostics.is_empty(), "{:?}", parsed.diagnostics);
        let role = &parsed.roles[0];
        assert_eq!(role.name, "delivery");
        assert_eq!(role.description, "Delivery Manager");
        assert_eq!(role.goals, vec!["Track progress", "Find blockers"]);
        assert_eq!(role.tools, vec!["read_file"]);
        assert_eq!(role.inbox, "agent/inbox/delivery/");
    }

    #[test]
    fn finds_broken_references_and_cycles() {
        let parsed = parse_files(&[file(
            "r.yaml",
            "agents:\n  - {id: a, senior: b, team: nowhere}\n  - {id: b, senior: a}\n  - {id: c, senior: ghost}\n",
        )]);
        let diagnostics = check_references(&parsed, &Existing::default());
        let codes: Vec<&str> = diagnostics.iter().map(|d| d.code).collect();
        assert_eq!(codes, vec!["ROS007", "ROS008", "ROS008", "ROS007"]);
        assert!(diagnostics[1].message.contains("a -> b -> a"));
    }
}
