//! The roster's entities and the rules every one of them obeys on input.

/// A value the roster refuses: the request field it came from (`agent.id`,
/// `role.budget.max_cost`) and why, with the field named first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// The field, as a path.
    pub field: String,
    /// What is wrong, for people: "`field`: problem".
    pub message: String,
}

impl std::fmt::Display for Invalid {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(&self.message)
    }
}

impl std::error::Error for Invalid {}

/// The result of the roster's rules.
pub type Result<T, E = Invalid> = std::result::Result<T, E>;

/// The default number of tasks an agent holds at once (a workload of `X/5`).
pub const DEFAULT_CAPACITY: u32 = 5;
/// The default iteration limit of an agent (`max_iterations`).
pub const DEFAULT_MAX_ITERATIONS: u32 = 10;
/// The longest id or name the roster accepts.
pub const MAX_ID_LENGTH: usize = 64;
/// The largest capacity the roster accepts: an agent may stand for a fleet
/// of workers taking its tasks.
pub const MAX_CAPACITY: u32 = 100_000;

/// An agent's availability, as delegation decisions read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// No task held.
    Idle,
    /// Some tasks held, room for more.
    Active,
    /// At or one below capacity.
    Busy,
    /// Not available; never delegated to.
    Offline,
}

impl Status {
    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Idle => "idle",
            Self::Active => "active",
            Self::Busy => "busy",
            Self::Offline => "offline",
        }
    }

    /// Parses the stored spelling.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "idle" => Some(Self::Idle),
            "active" => Some(Self::Active),
            "busy" => Some(Self::Busy),
            "offline" => Some(Self::Offline),
            _ => None,
        }
    }

    /// The status that follows from a workload: `idle` with no task, `busy`
    /// from one below capacity (4/5 "approaching", 5/5 "at capacity"),
    /// `active` in between.
    pub fn from_workload(workload: u32, capacity: u32) -> Self {
        if workload == 0 {
            Self::Idle
        } else if workload.saturating_add(1) >= capacity {
            Self::Busy
        } else {
            Self::Active
        }
    }
}

/// A member of the roster.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Agent {
    /// Unique id.
    pub id: String,
    /// Display name.
    pub name: String,
    /// Name of the role definition.
    pub role: String,
    /// Team name; empty for none.
    pub team: String,
    /// Senior's id; empty for none.
    pub senior_id: String,
    /// Lowercase expertise tags, sorted and unique.
    pub expertise: Vec<String>,
    /// A status set by hand, which sticks until changed; `None` follows the workload.
    pub manual_status: Option<Status>,
    /// Tasks held.
    pub current_workload: u32,
    /// Most tasks held at once.
    pub workload_capacity: u32,
    /// When a busy agent expects to be free, in ms since the epoch.
    pub availability_until: Option<i64>,
    /// The agent's own prompt.
    pub custom_prompt: String,
    /// Model settings, a JSON object as text (empty for none); checked by
    /// [`super::llm_config::check_llm_config`].
    pub llm_config_json: String,
    /// The agent's backstory, given to its model.
    pub backstory: String,
    /// Whether the agent may hand its steps onward to others.
    pub allow_delegation: bool,
    /// Most iterations per task; 0 on input means the default.
    pub max_iterations: u32,
    /// How long the agent's tasks take, observed: a moving average of the
    /// time from a slot's reservation to its release, in ms; 0 until a task
    /// of it ended. Kept by the roster; the estimated wait for the agent's
    /// slot comes from it.
    pub average_task_millis: i64,
}

impl Agent {
    /// The effective status: the manual one if set, else the one the workload gives.
    pub fn status(&self) -> Status {
        self.manual_status.unwrap_or_else(|| Status::from_workload(self.current_workload, self.workload_capacity))
    }

    /// Whether the agent can take one more task now: not offline, not set busy
    /// by hand, and below capacity.
    pub fn has_free_slot(&self) -> bool {
        !matches!(self.manual_status, Some(Status::Offline | Status::Busy))
            && self.current_workload < self.workload_capacity
    }

    /// Validates and normalises the descriptive fields of an agent given on input:
    /// id format, name default, tag format, capacity default, model settings
    /// (a JSON object without secrets, its known keys well typed; the first
    /// error is named by its path, `agent.llm_config.api_key`, never by its value).
    pub fn normalize(mut self) -> Result<Self> {
        validate_id("agent.id", &self.id)?;
        self.name = self.name.trim().to_owned();
        if self.name.is_empty() {
            self.name.clone_from(&self.id);
        }
        if self.name.chars().count() > 200 {
            return Err(invalid("agent.name", "at most 200 characters"));
        }
        if !self.role.is_empty() {
            validate_name("agent.role", &self.role)?;
        }
        if !self.team.is_empty() {
            validate_id("agent.team", &self.team)?;
        }
        if !self.senior_id.is_empty() {
            validate_id("agent.senior_id", &self.senior_id)?;
            if self.senior_id == self.id {
                return Err(invalid("agent.senior_id", format!("agent {:?} cannot be its own senior", self.id)));
            }
        }
        self.expertise = normalize_tags("agent.expertise", &self.expertise)?;
        if self.workload_capacity == 0 {
            self.workload_capacity = DEFAULT_CAPACITY;
        }
        if self.workload_capacity > MAX_CAPACITY {
            return Err(invalid("agent.workload_capacity", format!("at most {MAX_CAPACITY}")));
        }
        if self.max_iterations == 0 {
            self.max_iterations = DEFAULT_MAX_ITERATIONS;
        }
        validate_json_object("agent.llm_config_json", &self.llm_config_json)?;
        if let Ok(settings) = serde_json::from_str::<serde_json::Value>(&self.llm_config_json) {
            let findings = super::llm_config::check_llm_config(&settings);
            if let Some(error) = findings.iter().find(|finding| finding.severity == crate::Severity::Error) {
                return Err(invalid(&error.path_under("agent.llm_config"), &error.message));
            }
        }
        Ok(self)
    }

    /// Takes the `fields` named from `from`, keeping the others: an update
    /// that names some fields. Normalise the result again.
    pub fn update(&mut self, from: &Agent, fields: &[AgentField]) {
        for field in fields {
            match field {
                AgentField::Name => self.name.clone_from(&from.name),
                AgentField::Role => self.role.clone_from(&from.role),
                AgentField::Team => self.team.clone_from(&from.team),
                AgentField::SeniorId => self.senior_id.clone_from(&from.senior_id),
                AgentField::Expertise => self.expertise.clone_from(&from.expertise),
                AgentField::WorkloadCapacity => self.workload_capacity = from.workload_capacity,
                AgentField::AvailabilityUntil => self.availability_until = from.availability_until,
                AgentField::CustomPrompt => self.custom_prompt.clone_from(&from.custom_prompt),
                AgentField::LlmConfig => self.llm_config_json.clone_from(&from.llm_config_json),
                AgentField::Backstory => self.backstory.clone_from(&from.backstory),
                AgentField::AllowDelegation => self.allow_delegation = from.allow_delegation,
                AgentField::MaxIterations => self.max_iterations = from.max_iterations,
            }
        }
    }
}

/// A descriptive field of an agent: what an update may change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentField {
    /// `name`.
    Name,
    /// `role`.
    Role,
    /// `team`.
    Team,
    /// `senior_id`.
    SeniorId,
    /// `expertise`.
    Expertise,
    /// `workload_capacity`.
    WorkloadCapacity,
    /// `availability_until`.
    AvailabilityUntil,
    /// `custom_prompt`.
    CustomPrompt,
    /// `llm_config`.
    LlmConfig,
    /// `backstory`.
    Backstory,
    /// `allow_delegation`.
    AllowDelegation,
    /// `max_iterations`.
    MaxIterations,
}

impl AgentField {
    /// Every descriptive field.
    pub const ALL: [AgentField; 12] = [
        AgentField::Name,
        AgentField::Role,
        AgentField::Team,
        AgentField::SeniorId,
        AgentField::Expertise,
        AgentField::WorkloadCapacity,
        AgentField::AvailabilityUntil,
        AgentField::CustomPrompt,
        AgentField::LlmConfig,
        AgentField::Backstory,
        AgentField::AllowDelegation,
        AgentField::MaxIterations,
    ];

    /// The field's name in the contract's `Agent`.
    pub fn name(self) -> &'static str {
        match self {
            AgentField::Name => "name",
            AgentField::Role => "role",
            AgentField::Team => "team",
            AgentField::SeniorId => "senior_id",
            AgentField::Expertise => "expertise",
            AgentField::WorkloadCapacity => "workload_capacity",
            AgentField::AvailabilityUntil => "availability_until",
            AgentField::CustomPrompt => "custom_prompt",
            AgentField::LlmConfig => "llm_config",
            AgentField::Backstory => "backstory",
            AgentField::AllowDelegation => "allow_delegation",
            AgentField::MaxIterations => "max_iterations",
        }
    }

    /// The field named `name` in the contract's `Agent`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|field| field.name() == name)
    }
}

/// A team of agents.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Team {
    /// Unique name (id format).
    pub name: String,
    /// What the team does.
    pub description: String,
    /// The lead's agent id; empty for none.
    pub lead_agent_id: String,
}

impl Team {
    /// Validates a team given on input.
    pub fn normalize(mut self) -> Result<Self> {
        validate_id("team.name", &self.name)?;
        self.description = self.description.trim().to_owned();
        if !self.lead_agent_id.is_empty() {
            validate_id("team.lead_agent_id", &self.lead_agent_id)?;
        }
        Ok(self)
    }
}

/// Limits on a role's own runs, as a process's `budget:` (0: no limit).
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RoleBudget {
    /// Length of the period, in seconds.
    pub period_seconds: u64,
    /// Most runs per period.
    pub max_runs: u32,
    /// Most cost per period, in US dollars.
    pub max_cost: f64,
    /// Most tokens per period.
    pub max_tokens: u64,
    /// Most cost of one run, in US dollars.
    pub run_max_cost: f64,
    /// Most tokens of one run.
    pub run_max_tokens: u64,
    /// `stop` (empty: stop), `pause` or `warn`.
    pub on_exceed: String,
}

/// How often a role's own runs may start, as a process's `throttle:` (0: no
/// limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RoleThrottle {
    /// Least time between the starts of two runs, in seconds.
    pub min_interval_seconds: u64,
    /// Most runs underway at once.
    pub max_concurrent: u32,
}

/// Longest budget period and throttle interval: a year, in seconds.
const MAX_PERIOD_SECONDS: u64 = 31_536_000;
/// Largest cost limit, in US dollars.
const MAX_COST: f64 = 1e9;

impl RoleBudget {
    fn check(&self) -> Result<()> {
        for (field, cost) in [("max_cost", self.max_cost), ("run_max_cost", self.run_max_cost)] {
            if !(cost.is_finite() && (0.0..=MAX_COST).contains(&cost)) {
                return Err(invalid(
                    &format!("role.budget.{field}"),
                    format!("must be from 0 to {MAX_COST} US dollars, not {cost}"),
                ));
            }
        }
        let period_limit = self.max_runs > 0 || self.max_cost > 0.0 || self.max_tokens > 0;
        if self.period_seconds > MAX_PERIOD_SECONDS || (period_limit && self.period_seconds == 0) {
            return Err(invalid(
                "role.budget.period_seconds",
                format!("must be from 1 to {MAX_PERIOD_SECONDS} with a limit per period, not {}", self.period_seconds),
            ));
        }
        if !["", "stop", "pause", "warn"].contains(&self.on_exceed.as_str()) {
            return Err(invalid("role.budget.on_exceed", format!("{:?} is not stop, pause or warn", self.on_exceed)));
        }
        Ok(())
    }
}

impl RoleThrottle {
    fn check(&self) -> Result<()> {
        if self.min_interval_seconds > MAX_PERIOD_SECONDS {
            return Err(invalid(
                "role.throttle.min_interval_seconds",
                format!("at most {MAX_PERIOD_SECONDS}, not {}", self.min_interval_seconds),
            ));
        }
        if self.max_concurrent > 100_000 {
            return Err(invalid(
                "role.throttle.max_concurrent",
                format!("at most 100000, not {}", self.max_concurrent),
            ));
        }
        Ok(())
    }
}

/// What a role is for and what it may do.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RoleDefinition {
    /// Unique name.
    pub name: String,
    /// A brief description.
    pub description: String,
    /// Key objectives.
    pub goals: Vec<String>,
    /// Duties.
    pub responsibilities: Vec<String>,
    /// Tools the role may use.
    pub tools: Vec<String>,
    /// Actions the role may perform.
    pub permitted_actions: Vec<String>,
    /// JSON schema of its input, as text.
    pub input_schema_json: String,
    /// JSON schema of its output, as text.
    pub output_schema_json: String,
    /// The mission: what the role is for.
    pub mission: String,
    /// Files the role reads for context.
    pub context_files: Vec<String>,
    /// What the agent's workspace file tools may read: workspace-relative
    /// paths (a folder ending in `/` covers everything under it); empty for
    /// no narrowing.
    pub read_paths: Vec<String>,
    /// What the agent's workspace file tools may write, as `read_paths`.
    pub write_paths: Vec<String>,
    /// When the role runs, as written (a cron expression or text).
    pub schedule: String,
    /// The inbox that triggers the role.
    pub inbox: String,
    /// How the user wants the role to behave.
    pub user_preferences: String,
    /// The inbox the role's own runs post their output to; empty for none.
    pub post_to_inbox: String,
    /// Limits on the role's own runs.
    pub budget: Option<RoleBudget>,
    /// How often the role's own runs may start.
    pub throttle: Option<RoleThrottle>,
}

impl RoleDefinition {
    /// Validates a role definition given on input.
    pub fn normalize(mut self) -> Result<Self> {
        validate_name("role.name", &self.name)?;
        for (field, list) in [("role.tools", &mut self.tools), ("role.permitted_actions", &mut self.permitted_actions)]
        {
            for (index, item) in list.iter_mut().enumerate() {
                *item = item.trim().to_owned();
                validate_name(&format!("{field}[{index}]"), item)?;
            }
            let mut seen = std::collections::HashSet::new();
            list.retain(|item| seen.insert(item.clone()));
        }
        for (field, list) in [("role.read_paths", &mut self.read_paths), ("role.write_paths", &mut self.write_paths)] {
            if list.len() > crate::MAX_WORKSPACE_PATHS {
                return Err(invalid(
                    field,
                    format!("at most {} paths, not {}", crate::MAX_WORKSPACE_PATHS, list.len()),
                ));
            }
            for (index, entry) in list.iter_mut().enumerate() {
                *entry = entry.trim().to_owned();
                if let Some(problem) = crate::workspace_path_problem(entry) {
                    return Err(invalid(&format!("{field}[{index}]"), format!("workspace path {problem}")));
                }
            }
        }
        validate_json_object("role.input_schema_json", &self.input_schema_json)?;
        validate_json_object("role.output_schema_json", &self.output_schema_json)?;
        self.schedule = self.schedule.trim().to_owned();
        // A schedule that cannot be read is kept (the validator warns that
        // nothing fires it); one that reads must be a schedule that fires.
        if let Ok(Some(schedule)) = crate::role_schedule(&self.schedule) {
            crate::Schedule::parse(&schedule.cron, &schedule.time_zone)
                .map_err(|reason| invalid("role.schedule", reason))?;
        }
        self.inbox = self.inbox.trim().to_owned();
        if !self.inbox.is_empty() && crate::role_inbox_name(&self.inbox).is_none() {
            return Err(invalid(
                "role.inbox",
                format!("{:?} is neither an inbox name ([a-z0-9][a-z0-9_-]*) nor a path ending in one", self.inbox),
            ));
        }
        if let Some(budget) = &self.budget {
            budget.check()?;
        }
        if let Some(throttle) = &self.throttle {
            throttle.check()?;
        }
        self.post_to_inbox = self.post_to_inbox.trim().to_owned();
        if !self.post_to_inbox.is_empty() && !crate::is_identifier(&self.post_to_inbox) {
            return Err(invalid(
                "role.post_to_inbox",
                format!("{:?} is not an inbox name ([a-z0-9][a-z0-9_-]*, at most 64 characters)", self.post_to_inbox),
            ));
        }
        Ok(self)
    }
}

/// A refusal of the field `field`: "`field`: `problem`".
fn invalid(field: &str, problem: impl std::fmt::Display) -> Invalid {
    Invalid { field: field.to_owned(), message: format!("{field}: {problem}") }
}

/// Checks an id: 1 to 64 characters of lowercase letters, digits, `-`, `_`,
/// `.`; not `.` or `..` (ids name folders, such as an agent's memory), and
/// not starting with `-` (ids are command-line arguments).
pub fn validate_id(field: &str, value: &str) -> Result<()> {
    if value.is_empty() {
        return Err(invalid(field, "required"));
    }
    if value == "." || value == ".." {
        return Err(invalid(field, format!("{value:?} is not an id: it names a folder")));
    }
    if value.starts_with('-') {
        return Err(invalid(field, format!("{value:?} starts with '-'; start with a letter, digit, '_' or '.'")));
    }
    if value.len() > MAX_ID_LENGTH {
        return Err(invalid(field, format!("{value:?} is longer than {MAX_ID_LENGTH} characters")));
    }
    if let Some(bad) =
        value.chars().find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.')))
    {
        return Err(invalid(
            field,
            format!("{value:?} contains {bad:?}; use lowercase letters, digits, '-', '_' and '.'"),
        ));
    }
    Ok(())
}

/// Checks a name (role, tool, action): 1 to 64 characters of letters, digits, `-`, `_`, `.`.
pub fn validate_name(field: &str, value: &str) -> Result<()> {
    if value.is_empty() {
        return Err(invalid(field, "required"));
    }
    if value.len() > MAX_ID_LENGTH {
        return Err(invalid(field, format!("{value:?} is longer than {MAX_ID_LENGTH} characters")));
    }
    if let Some(bad) = value.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))) {
        return Err(invalid(field, format!("{value:?} contains {bad:?}; use letters, digits, '-', '_' and '.'")));
    }
    Ok(())
}

/// Lowercases, trims, checks, sorts and deduplicates expertise tags.
pub fn normalize_tags(field: &str, tags: &[String]) -> Result<Vec<String>> {
    let mut normalized = Vec::with_capacity(tags.len());
    for (index, tag) in tags.iter().enumerate() {
        let tag = tag.trim().to_lowercase().replace(' ', "-");
        validate_id(&format!("{field}[{index}]"), &tag)?;
        normalized.push(tag);
    }
    normalized.sort();
    normalized.dedup();
    Ok(normalized)
}

fn validate_json_object(field: &str, text: &str) -> Result<()> {
    if text.trim().is_empty() {
        return Ok(());
    }
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Object(_)) => Ok(()),
        Ok(_) => Err(invalid(field, "must be a JSON object")),
        Err(error) => Err(invalid(field, format!("not valid JSON: {error}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_follow_the_format() {
        assert!(validate_id("id", "research-agent_1.x").is_ok());
        assert!(validate_id("id", "").is_err());
        assert!(validate_id("id", "Alice").is_err());
        for folder_or_flag in [".", "..", "-rf", "--help"] {
            assert!(validate_id("id", folder_or_flag).is_err(), "{folder_or_flag}");
        }
        assert!(validate_id("id", ".hidden").is_ok());
        assert!(validate_id("id", &"a".repeat(65)).is_err());
        assert!(validate_id("id", &"a".repeat(64)).is_ok());
    }

    #[test]
    fn status_follows_the_workload_thresholds() {
        assert_eq!(Status::from_workload(0, 5), Status::Idle);
        assert_eq!(Status::from_workload(3, 5), Status::Active);
        assert_eq!(Status::from_workload(4, 5), Status::Busy);
        assert_eq!(Status::from_workload(5, 5), Status::Busy);
    }

    #[test]
    fn normalize_fills_defaults() {
        let agent = Agent { id: "a".into(), expertise: vec!["Rust".into(), "rust".into()], ..Agent::default() }
            .normalize()
            .unwrap();
        assert_eq!(agent.name, "a");
        assert_eq!(agent.workload_capacity, 5);
        assert_eq!(agent.max_iterations, 10);
        assert_eq!(agent.expertise, vec!["rust".to_owned()]);
    }
}
