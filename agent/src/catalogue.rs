//! The tools a model-driven agent is offered beyond its role's own: the
//! cluster's tools (the roster, delegation, the team protocol, inboxes,
//! memory) and the workspace's file tools. Each is defined here once — its
//! name, what it does, the JSON schema of its arguments, and how a refusal
//! of the cluster becomes the tool error the model reads — so every front
//! end that offers them (the agent, an MCP server) offers the same.

use std::{collections::HashMap, sync::LazyLock};

use jsonschema::Validator;
use serde_json::{Value, json};

use crate::provider::ToolDefinition;

/// A tool of the cluster's own. Each acts with the agent's own credential:
/// the cluster's authority decides, as for any call of the agent's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClusterTool {
    /// The organisation's roster, through one of its filters.
    GetOrganizationRoster,
    /// Hands the step onward through the roster's decision.
    DelegateTask,
    /// The agent's role in the execution.
    GetMyRole,
    /// Whether an action is permitted, and why.
    RoleCheck,
    /// Gives an agent a role in a team session (the lead's).
    AssignRole,
    /// Drops a message into an inbox.
    PostToInbox,
    /// Something later runs should know.
    Remember,
    /// The step's output starts no run through its inbox post.
    SkipTriggers,
}

/// A built-in file tool, served inside the worker on its workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorkspaceTool {
    /// A file's text.
    ReadFile,
    /// Writes a file.
    WriteFile,
    /// Adds to a file.
    AppendFile,
    /// A folder's entries.
    ListFiles,
    /// Moves a file or folder.
    MoveFile,
}

/// What every tool of the catalogue answers, whichever kind it is.
pub trait Tool: Copy + PartialEq + 'static {
    /// Every tool of the kind, in the order they are offered.
    const ALL: &'static [Self];

    /// Its name (as roles list it in `tools`).
    fn name(self) -> &'static str;

    /// What it does, for the model.
    fn description(self) -> &'static str;

    /// The tool of that name.
    fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|tool| tool.name() == name)
    }

    /// The JSON schema of its arguments.
    fn input_schema(self) -> &'static Value {
        &schema_of(self.name()).0
    }

    /// Arguments checked against the schema: the first problem, for the model.
    fn check(self, arguments: &Value) -> Result<(), String> {
        schema_of(self.name()).1.check(arguments)
    }

    /// The tool as a model is offered it.
    fn definition(self) -> ToolDefinition {
        ToolDefinition {
            name: self.name().to_owned(),
            description: self.description().to_owned(),
            parameters: self.input_schema().clone(),
        }
    }
}

impl Tool for ClusterTool {
    const ALL: &'static [Self] = &[
        Self::GetOrganizationRoster,
        Self::DelegateTask,
        Self::GetMyRole,
        Self::RoleCheck,
        Self::AssignRole,
        Self::PostToInbox,
        Self::Remember,
        Self::SkipTriggers,
    ];

    fn name(self) -> &'static str {
        match self {
            Self::GetOrganizationRoster => "get_organization_roster",
            Self::DelegateTask => "delegate_task",
            Self::GetMyRole => "get_my_role",
            Self::RoleCheck => "role_check",
            Self::AssignRole => "assign_role",
            Self::PostToInbox => "post_to_inbox",
            Self::Remember => "remember",
            Self::SkipTriggers => "skip_triggers",
        }
    }

    fn description(self) -> &'static str {
        match self {
            Self::GetOrganizationRoster => {
                "Get a fresh view of the organisation: you, and your colleagues with their team, role, expertise, \
                 status and workload. Filters: all, my_team, available (not offline, below capacity), by_expertise \
                 (give `expertise`). Call it before delegating; status and workload change all the time."
            }
            Self::DelegateTask => {
                "Hand this step to someone else: a named colleague (`to_agent_id`), or whoever the roster's \
                 decision framework picks for the `expertise` (and `role`) you give. Say why in `reason`. If the \
                 cluster accepts, the step is theirs and your work on it ends; if it refuses (a delegation loop, \
                 nobody available, delegation not allowed), you get the reason and the step stays yours."
            }
            Self::GetMyRole => {
                "Your role in this execution (in a team session: your role, subtask and the actions it permits)."
            }
            Self::RoleCheck => {
                "Whether an action (such as `code`, `review`, `approve`) is permitted to you (or, for the lead, to \
                 an agent of the execution), and why."
            }
            Self::AssignRole => "As the session's lead: give an agent a role (and a subtask) in this execution.",
            Self::PostToInbox => {
                "Drop a message into an inbox (`[a-z0-9][a-z0-9_-]*`); the process the inbox triggers runs on it."
            }
            Self::Remember => {
                "Keep a note for later runs: in your role's memory (scope `role`, the default) or the global \
                 memory (scope `global`). At most 16 notes of 4 KiB per step."
            }
            Self::SkipTriggers => {
                "Decide that no other role needs to run after this step: its output is posted to no inbox, so the \
                 runs it would start do not start. Say why in `reason`."
            }
        }
    }
}

impl Tool for WorkspaceTool {
    const ALL: &'static [Self] = &[Self::ReadFile, Self::WriteFile, Self::AppendFile, Self::ListFiles, Self::MoveFile];

    fn name(self) -> &'static str {
        match self {
            Self::ReadFile => "read_file",
            Self::WriteFile => "write_file",
            Self::AppendFile => "append_file",
            Self::ListFiles => "list_files",
            Self::MoveFile => "move_file",
        }
    }

    fn description(self) -> &'static str {
        match self {
            Self::ReadFile => "Read a text file of the workspace (at most 256 KiB of it).",
            Self::WriteFile => "Write a text file of the workspace (at most 1 MiB), replacing it; folders are made.",
            Self::AppendFile => "Add text to the end of a workspace file, making it when missing.",
            Self::ListFiles => "List a folder of the workspace (`\"\"` for the workspace itself).",
            Self::MoveFile => "Move a file or folder within the workspace; the target must not exist.",
        }
    }
}

/// Each tool's schema with its validator, made once, by the tool's name
/// (names are unique across the kinds: a test says so).
static SCHEMAS: LazyLock<HashMap<&'static str, (Value, Checker)>> = LazyLock::new(|| {
    let cluster = ClusterTool::ALL.iter().map(|tool| (tool.name(), cluster_schema(*tool)));
    let workspace = WorkspaceTool::ALL.iter().map(|tool| (tool.name(), workspace_schema(*tool)));
    cluster
        .chain(workspace)
        .map(|(name, schema)| {
            let checker = Checker::new(&schema).expect("the catalogue's own schemas are valid");
            (name, (schema, checker))
        })
        .collect()
});

fn schema_of(name: &str) -> &'static (Value, Checker) {
    SCHEMAS.get(name).expect("every tool of the catalogue has a schema")
}

fn object(properties: Value, required: &[&str]) -> Value {
    json!({"type": "object", "properties": properties, "required": required, "additionalProperties": false})
}

fn text(description: &str, max: usize) -> Value {
    json!({"type": "string", "description": description, "maxLength": max})
}

fn cluster_schema(tool: ClusterTool) -> Value {
    match tool {
        ClusterTool::GetOrganizationRoster => object(
            json!({
                "filter": {"type": "string", "enum": ["all", "my_team", "available", "by_expertise"]},
                "expertise": text("the expertise tag, with filter by_expertise", 64),
            }),
            &["filter"],
        ),
        ClusterTool::DelegateTask => object(
            json!({
                "to_agent_id": text("a named colleague; empty to let the roster decide", 64),
                "expertise": {"type": "array", "items": {"type": "string", "maxLength": 64}, "maxItems": 16},
                "role": text("a role the delegate must have", 64),
                "reason": text("why, for the audit trail", 16_384),
            }),
            &["reason"],
        ),
        ClusterTool::GetMyRole => object(json!({}), &[]),
        ClusterTool::RoleCheck => object(
            json!({
                "action": text("the action, such as code, review or approve", 64),
                "agent_id": text("another agent of the execution (the lead only); empty for yourself", 64),
            }),
            &["action"],
        ),
        ClusterTool::AssignRole => object(
            json!({
                "agent_id": text("the agent", 64),
                "role": text("a role of the permission matrix", 64),
                "subtask": text("what the agent is to do", 16_384),
            }),
            &["agent_id", "role"],
        ),
        ClusterTool::PostToInbox => object(
            json!({
                "inbox": {"type": "string", "pattern": "^[a-z0-9][a-z0-9_-]{0,63}$"},
                "body": text("the message", 262_144),
                "subject": text("a one-line summary", 1024),
                "priority": {"type": "string", "enum": ["low", "normal", "high"]},
            }),
            &["inbox", "body"],
        ),
        ClusterTool::Remember => object(
            json!({
                "text": text("the note", 4096),
                "scope": {"type": "string", "enum": ["role", "global"]},
            }),
            &["text"],
        ),
        ClusterTool::SkipTriggers => object(json!({"reason": text("why no other role needs to run", 4096)}), &[]),
    }
}

fn workspace_schema(tool: WorkspaceTool) -> Value {
    let path = |description: &str| text(description, 1024);
    match tool {
        WorkspaceTool::ReadFile => object(json!({"path": path("relative to the workspace")}), &["path"]),
        WorkspaceTool::WriteFile | WorkspaceTool::AppendFile => object(
            json!({"path": path("relative to the workspace"), "content": text("the text", 1 << 20)}),
            &["path", "content"],
        ),
        WorkspaceTool::ListFiles => object(json!({"path": path("a folder; \"\" for the workspace")}), &[]),
        WorkspaceTool::MoveFile => {
            object(json!({"from": path("what to move"), "to": path("where to; must not exist")}), &["from", "to"])
        }
    }
}

/// A value checked against a JSON schema (a role's output schema): the
/// first problem, for the model.
pub fn check_against(schema: &Value, value: &Value) -> Result<(), String> {
    Checker::new(schema)?.check(value)
}

/// A JSON schema compiled once, for values checked against it again and
/// again (the arguments of a tool offered by another front end).
pub struct Checker(Validator);

impl Checker {
    /// `schema` compiled, or why it is not a valid schema.
    pub fn new(schema: &Value) -> Result<Self, String> {
        jsonschema::validator_for(schema).map(Self).map_err(|error| format!("the schema is not valid: {error}"))
    }

    /// The first problem of `value`, naming where it is.
    pub fn check(&self, value: &Value) -> Result<(), String> {
        match self.0.iter_errors(value).next() {
            None => Ok(()),
            Some(error) => {
                let at = error.instance_path().to_string();
                Err(if at.is_empty() { error.to_string() } else { format!("{at}: {error}") })
            }
        }
    }
}

/// A refusal or failure of a tool, as the model reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolError {
    /// A stable code: `invalid_arguments`, `permission_denied`, `not_found`, ...
    pub code: &'static str,
    /// What the cluster or the tool said.
    pub message: String,
}

impl ToolError {
    /// A tool error of `code`.
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        Self { code, message: message.into() }
    }

    /// The JSON the model is given.
    pub fn to_json(&self) -> Value {
        json!({"error": {"code": self.code, "message": self.message}})
    }
}

impl From<tonic::Status> for ToolError {
    /// A refusal of the cluster, with its reason as the cluster gave it.
    fn from(status: tonic::Status) -> Self {
        let code = match status.code() {
            tonic::Code::InvalidArgument | tonic::Code::OutOfRange => "invalid_arguments",
            tonic::Code::PermissionDenied | tonic::Code::Unauthenticated => "permission_denied",
            tonic::Code::NotFound => "not_found",
            tonic::Code::AlreadyExists => "already_exists",
            tonic::Code::FailedPrecondition => "failed_precondition",
            tonic::Code::ResourceExhausted => "resource_exhausted",
            tonic::Code::Unavailable | tonic::Code::DeadlineExceeded => "unavailable",
            _ => "internal",
        };
        Self { code, message: status.message().to_owned() }
    }
}

/// The catalogue as JSON: every cluster tool and every workspace tool with
/// its name, description and input schema, in the order they are offered.
/// `agent/catalogue.json` holds it, and the Python and TypeScript worker
/// libraries ship copies of that file byte for byte (a test of this crate
/// fails when one differs; `MUSTER_WRITE_CATALOGUE=1` rewrites them).
pub fn catalogue_json() -> String {
    let entry = |name: &str, description: &str, schema: &Value| json!({"name": name, "description": description, "input_schema": schema});
    let catalogue = json!({
        "cluster_tools": ClusterTool::ALL
            .iter()
            .map(|tool| entry(tool.name(), tool.description(), tool.input_schema()))
            .collect::<Vec<_>>(),
        "workspace_tools": WorkspaceTool::ALL
            .iter()
            .map(|tool| entry(tool.name(), tool.description(), tool.input_schema()))
            .collect::<Vec<_>>(),
    });
    let mut text = serde_json::to_string_pretty(&catalogue).unwrap_or_default();
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed catalogue and its copies in the other languages' worker
    /// libraries, relative to this crate.
    const CATALOGUE_FILES: [&str; 3] = [
        "catalogue.json",
        "../clients/python/muster_worker/catalogue.json",
        "../clients/typescript/src/catalogue.json",
    ];

    #[test]
    fn the_committed_catalogues_are_this_one() {
        let expected = catalogue_json();
        let rewrite = std::env::var("MUSTER_WRITE_CATALOGUE").as_deref() == Ok("1");
        for file in CATALOGUE_FILES {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
            if rewrite {
                std::fs::write(&path, &expected).unwrap();
            }
            let committed = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                committed == expected,
                "{} differs from ClusterTool::ALL and WorkspaceTool::ALL: rewrite it (and its copies) with \
                 `MUSTER_WRITE_CATALOGUE=1 cargo test -p muster-agent --lib catalogue`",
                path.display()
            );
        }
    }

    #[test]
    fn every_tool_has_a_unique_name_and_an_object_schema() {
        let mut names: Vec<&str> = ClusterTool::ALL.iter().map(|tool| tool.name()).collect();
        names.extend(WorkspaceTool::ALL.iter().map(|tool| tool.name()));
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count);
        for &tool in ClusterTool::ALL {
            assert_eq!(ClusterTool::from_name(tool.name()), Some(tool));
            assert_eq!(tool.input_schema()["type"], "object");
        }
        for &tool in WorkspaceTool::ALL {
            assert_eq!(WorkspaceTool::from_name(tool.name()), Some(tool));
            assert_eq!(tool.input_schema()["type"], "object");
        }
    }

    #[test]
    fn arguments_are_checked_with_the_problem_named() {
        let tool = ClusterTool::PostToInbox;
        assert!(tool.check(&json!({"inbox": "risk", "body": "late"})).is_ok());
        let problem = tool.check(&json!({"inbox": "Risk!", "body": "late"})).unwrap_err();
        assert!(problem.contains("/inbox"), "{problem}");
        assert!(tool.check(&json!({"body": "late"})).unwrap_err().contains("inbox"));
        assert!(tool.check(&json!({"inbox": "a", "body": "b", "extra": 1})).is_err());
        assert!(check_against(&json!({"type": "object", "required": ["light"]}), &json!({})).is_err());
    }

    #[test]
    fn a_refusal_keeps_the_clusters_reason() {
        let error = ToolError::from(tonic::Status::permission_denied("analyst-agent may not code: ..."));
        assert_eq!(error.to_json()["error"]["code"], "permission_denied");
        assert_eq!(error.message, "analyst-agent may not code: ...");
    }
}
