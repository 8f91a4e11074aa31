//! Roster import: a YAML roster (teams, agents, roles) and Markdown role files
//! (`##` sections), parsed into entities with diagnostics that carry the
//! file, the path and the line and column. The format is documented in
//! `docs/roster-format.md`.

mod markdown;
mod yaml;

use std::collections::{HashMap, HashSet};

use saphyr::YamlDataOwned;

use markdown::parse_markdown_role;
use yaml::{Fields, load_document, position};

use super::model::Invalid;
use super::model::{Agent, RoleDefinition, Team};

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

pub use crate::Severity;

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

impl FileDiagnostic {
    /// The finding as the other documents' checks give theirs (its file aside).
    pub fn to_diagnostic(&self) -> crate::Diagnostic {
        crate::Diagnostic {
            severity: self.severity,
            code: self.code,
            message: self.message.clone(),
            path: self.path.clone(),
            line: self.line,
            column: self.column,
        }
    }
}

/// Every finding about `files` as one import into an empty roster would
/// report them: each file's, and the references between them (teams,
/// seniors, leads and roles must be defined in the files).
pub fn validate_files(files: &[ImportFile]) -> Vec<FileDiagnostic> {
    let parsed = parse_files(files);
    let mut diagnostics = parsed.diagnostics.clone();
    diagnostics.extend(check_references(&parsed, &Existing::default()));
    diagnostics
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
    pub(super) fn diagnostic(
        &self,
        severity: Severity,
        code: &'static str,
        field: &str,
        message: String,
    ) -> FileDiagnostic {
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

pub(super) fn file_diagnostic(
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

pub(super) fn invalid_message(error: Invalid) -> String {
    error.message
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
    let root = match load_document(name, &file.content) {
        Ok(Some(root)) => root,
        Ok(None) => {
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
        }
        Err(diagnostic) => {
            parsed.diagnostics.push(diagnostic);
            return;
        }
    };
    let root = &root;
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
        llm_config_json: fields.llm_config(&["llm_config", "llm_config_json"]),
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
        read_paths: fields.workspace_paths(&["read_paths"]),
        write_paths: fields.workspace_paths(&["write_paths"]),
        schedule: fields.text(&["schedule"]),
        inbox: fields.text(&["inbox"]),
        user_preferences: fields.text(&["user_preferences"]),
        post_to_inbox: fields.text(&["post_to_inbox"]),
        budget: fields.mapping(&["budget"]),
        throttle: fields.mapping(&["throttle"]),
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

#[cfg(test)]
mod tests;
