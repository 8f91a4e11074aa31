//! The typed process model the execution service runs, and the context the
//! caller may pass for reference checks.

/// A process definition that passed validation.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ProcessDefinition {
    /// The process name (`[a-z0-9][a-z0-9_-]*`, up to 64 characters).
    pub name: String,
    /// Free text; empty when not given.
    pub description: String,
    /// The execution's lead agent, if the process names one.
    pub lead: Option<String>,
    /// Most steps running at once, if the process limits it.
    pub max_parallel: Option<u32>,
    /// The steps, in source order.
    pub steps: Vec<StepDefinition>,
    /// What starts the process on its own, if it declares anything.
    #[serde(default)]
    pub triggers: Option<Triggers>,
    /// Its budget, if it declares one.
    #[serde(default)]
    pub budget: Option<ProcessBudget>,
    /// Its throttle, if it declares one.
    #[serde(default)]
    pub throttle: Option<ProcessThrottle>,
}

/// How often a process's executions may start: at least
/// `min_interval_seconds` apart, at most `max_concurrent` at once; 0 means
/// no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProcessThrottle {
    /// Least time between the starts of two executions, in seconds.
    pub min_interval_seconds: u64,
    /// Most executions underway at once.
    pub max_concurrent: u32,
}

/// What starts a process on its own: a schedule or an inbox.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Triggers {
    /// A cron expression: five fields, six with seconds first, or a macro
    /// such as `@daily` (see [`crate::Schedule`]).
    pub schedule: Option<String>,
    /// The schedule's IANA time zone; empty for UTC.
    #[serde(default)]
    pub time_zone: String,
    /// What happens to due times missed while no scheduler ran.
    #[serde(default)]
    pub missed: crate::MissedRuns,
    /// The inbox whose messages start a run.
    pub inbox: Option<String>,
}

/// Limits per period and per run that a process declares for its own
/// executions (the execution service's `Budget`, process scope); 0 means no
/// limit.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ProcessBudget {
    /// Length of the period, in seconds.
    pub period_seconds: u64,
    /// Most cost per period, in US dollars.
    pub max_cost: f64,
    /// Most tokens per period.
    pub max_tokens: u64,
    /// Most executions per period.
    pub max_runs: u32,
    /// Most cost of one execution, in US dollars.
    pub run_max_cost: f64,
    /// Most tokens of one execution.
    pub run_max_tokens: u64,
    /// What happens to a running execution that goes over a limit.
    pub on_exceed: BudgetAction,
}

/// What happens to a running execution that goes over a limit of its budget.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BudgetAction {
    /// Cancel it.
    #[default]
    Stop,
    /// Pause it until it is resumed.
    Pause,
    /// Only tell its monitors and lead.
    Warn,
}

impl BudgetAction {
    /// The name in a process: `stop`, `pause` or `warn`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Pause => "pause",
            Self::Warn => "warn",
        }
    }

    /// The action a process names.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "stop" => Some(Self::Stop),
            "pause" => Some(Self::Pause),
            "warn" => Some(Self::Warn),
            _ => None,
        }
    }
}

/// One step of a process.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StepDefinition {
    /// Unique id within the process.
    pub id: String,
    /// Human name: `name`, else `title`, else the id.
    pub name: String,
    /// `agent_task`, `human_approval` or `tool_call`.
    pub step_type: String,
    /// The step's `agent`, if given.
    pub agent: Option<String>,
    /// The instruction for the executor; empty when not given.
    pub message: String,
    /// Ids of the steps this one waits for.
    pub depends_on: Vec<String>,
    /// The EMI roles (executor, monitors, informed), if given.
    pub roles: Option<StepRoles>,
    /// The step's inputs as JSON object text; `{}` when none.
    pub inputs_json: String,
    /// Seconds before an attempt times out, if limited.
    pub timeout_seconds: Option<u64>,
    /// Extra attempts after a failure (0 to 10).
    pub retries: u32,
    /// Whether dependants still run when this step fails.
    pub continue_on_failure: bool,
    /// The tool a `tool_call` step invokes.
    pub tool: Option<String>,
    /// Delegation criteria, when the step asks the roster for an executor.
    pub delegate: Option<DelegationRequest>,
    /// The action the step performs (`code`, `review`, ...), checked against its
    /// role's permitted actions, if declared.
    pub action: Option<String>,
    /// An inbox the step's output is posted to when it completes, which
    /// starts the process that inbox triggers.
    #[serde(default)]
    pub post_to_inbox: Option<String>,
    /// Who may decide a `human_approval` step; empty means its executor and
    /// monitors.
    #[serde(default)]
    pub approvers: Vec<String>,
    /// Seconds a started step may wait for a worker to take it, if limited
    /// here (the execution service has a default).
    #[serde(default)]
    pub schedule_to_start_seconds: Option<u64>,
}

impl StepDefinition {
    /// The named executor: `roles.executor`, else `agent`.
    pub fn executor(&self) -> Option<&str> {
        self.roles.as_ref().map(|roles| roles.executor.as_str()).or(self.agent.as_deref())
    }

    /// Who may decide a `human_approval` step: its `approvers` when it lists
    /// them, else its executor and monitors.
    pub fn approvers(&self) -> Vec<String> {
        if !self.approvers.is_empty() {
            return self.approvers.clone();
        }
        let mut approvers: Vec<String> = self.executor().into_iter().map(str::to_owned).collect();
        for monitor in self.roles.iter().flat_map(|roles| &roles.monitors) {
            if !approvers.contains(monitor) {
                approvers.push(monitor.clone());
            }
        }
        approvers
    }
}

/// The Executor / Monitor / Informed roles of a step.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StepRoles {
    /// The one agent that performs the step.
    pub executor: String,
    /// Agents that own the outcome and may intervene.
    pub monitors: Vec<String>,
    /// Agents told when the step completes or fails.
    pub informed: Vec<String>,
}

/// What a step asks of the roster's `Delegate` when it names no executor.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DelegationRequest {
    /// The role the executor must hold.
    pub role: Option<String>,
    /// Expertise the executor should have.
    pub expertise: Vec<String>,
    /// The team to prefer.
    pub team: Option<String>,
    /// `low`, `normal`, `high` or `critical`.
    pub urgency: Option<String>,
    /// An RFC 3339 time by which the work is due.
    pub deadline: Option<String>,
}

/// What the caller knows of the world. A `None` list skips the rules that
/// need it; they are never guessed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Context {
    /// Every known agent; other agent names are errors.
    pub agents: Option<Vec<KnownAgent>>,
    /// Every known role with its permissions.
    pub roles: Option<Vec<KnownRole>>,
    /// Every registered tool name.
    pub tools: Option<Vec<String>>,
}

/// An agent of the roster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownAgent {
    /// The agent's id.
    pub id: String,
    /// The agent's role name, if any.
    pub role: Option<String>,
    /// True when the agent is offline (references draw a warning).
    pub offline: bool,
}

/// A role with what it may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownRole {
    /// The role's name.
    pub name: String,
    /// Tools the role may use.
    pub permitted_tools: Vec<String>,
    /// Actions the role may perform.
    pub permitted_actions: Vec<String>,
}

/// The outcome of [`crate::validate_process`].
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessReport {
    /// Every finding, in source order.
    pub diagnostics: Vec<super::Diagnostic>,
    /// The typed process, when no diagnostic is an error.
    pub process: Option<ProcessDefinition>,
    /// The process's triggers, when it declares valid ones.
    pub triggers: Option<Triggers>,
    /// The process's budget, when it declares a valid one.
    pub budget: Option<ProcessBudget>,
    /// The `name`, when it is a string (also of an invalid process).
    pub name: Option<String>,
    /// The number of entries in `steps`, when it is a list (also of an invalid process).
    pub step_count: usize,
}

impl ProcessReport {
    /// True when no diagnostic is an error.
    pub fn is_valid(&self) -> bool {
        !self.diagnostics.iter().any(super::Diagnostic::is_error)
    }
}
