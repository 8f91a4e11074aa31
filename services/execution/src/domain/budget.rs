//! Budgets: limits per period on a process's runs, cost and tokens, and on
//! the cost and tokens of one run. A process declares one (`budget:`) and
//! operators may set another in its place; a run that would start when a
//! period limit is reached is refused, and a running execution that goes
//! over a limit is acted on as the budget says ([`Action`]).

pub use muster_format::BudgetAction as Action;

/// Where a budget comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Set by an operator (SetBudget).
    Operator,
    /// The process's own `budget:`.
    Declared,
}

impl Source {
    /// The name stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Operator => "operator",
            Self::Declared => "declared",
        }
    }
}

/// Limits per period and per run on a process's executions; 0 means no
/// limit. An agent's budget limits, per period, the steps it starts and
/// what they use; it is kept under the key `agent:<id>` ([`agent_key`]),
/// which no process name can be.
#[derive(Debug, Clone, PartialEq)]
pub struct Budget {
    /// The process, or `agent:<id>`.
    pub process_name: String,
    pub period_seconds: u64,
    pub max_cost: f64,
    pub max_tokens: u64,
    pub max_runs: u32,
    pub run_max_cost: f64,
    pub run_max_tokens: u64,
    pub on_exceed: Action,
    pub source: Source,
}

/// What a process's executions used in a period.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    pub cost: f64,
    pub tokens: u64,
    pub runs: u64,
}

/// The limit a new run would break, as (limit, what the description says).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exhausted {
    pub limit: &'static str,
    pub description: String,
}

/// The key of an agent's budget.
pub fn agent_key(agent_id: &str) -> String {
    format!("agent:{agent_id}")
}

impl Budget {
    /// The agent whose budget it is, if it is an agent's.
    pub fn agent_id(&self) -> Option<&str> {
        self.process_name.strip_prefix("agent:")
    }

    /// What the budget limits, for messages: `process 'p'` or `agent 'a'`.
    pub fn owner(&self) -> String {
        owner(&self.process_name)
    }

    /// Whether every limit is 0 (no limit at all).
    pub fn is_unlimited(&self) -> bool {
        !self.has_period_limit() && self.run_max_cost == 0.0 && self.run_max_tokens == 0
    }

    /// Whether a limit per period is set.
    pub fn has_period_limit(&self) -> bool {
        self.max_cost > 0.0 || self.max_tokens > 0 || self.max_runs > 0
    }

    /// Whether a running execution's use can go over a limit: one on cost
    /// or tokens.
    pub fn limits_use(&self) -> bool {
        self.max_cost > 0.0 || self.max_tokens > 0 || self.run_max_cost > 0.0 || self.run_max_tokens > 0
    }

    /// The start of the current period, for a clock at `now` (milliseconds).
    pub fn period_start(&self, now: i64) -> i64 {
        now.saturating_sub(i64::try_from(self.period_seconds.saturating_mul(1000)).unwrap_or(i64::MAX))
    }

    /// The first limit that `usage` leaves no room under for another run.
    pub fn exhausted(&self, usage: &Usage) -> Option<Exhausted> {
        let period = self.period_seconds;
        if self.max_runs > 0 && usage.runs >= u64::from(self.max_runs) {
            let unit = if self.agent_id().is_some() { "steps" } else { "runs" };
            return Some(Exhausted {
                limit: "runs",
                description: format!("{} of {} {unit} in the last {period} s", usage.runs, self.max_runs),
            });
        }
        if self.max_cost > 0.0 && usage.cost >= self.max_cost {
            return Some(Exhausted {
                limit: "cost",
                description: format!("${:.2} of ${:.2} in the last {period} s", usage.cost, self.max_cost),
            });
        }
        if self.max_tokens > 0 && usage.tokens >= self.max_tokens {
            return Some(Exhausted {
                limit: "tokens",
                description: format!("{} of {} tokens in the last {period} s", usage.tokens, self.max_tokens),
            });
        }
        None
    }

    /// The first limit a running execution went over, having used `run`,
    /// when the process's other runs had used `others` in the period.
    pub fn exceeded(&self, run: &Usage, others: &Usage) -> Option<Exhausted> {
        if self.run_max_tokens > 0 && run.tokens > self.run_max_tokens {
            return Some(Exhausted {
                limit: "run_tokens",
                description: format!("the run used {} tokens, over its {}", run.tokens, self.run_max_tokens),
            });
        }
        if self.run_max_cost > 0.0 && run.cost > self.run_max_cost {
            return Some(Exhausted {
                limit: "run_cost",
                description: format!("the run cost ${:.2}, over its ${:.2}", run.cost, self.run_max_cost),
            });
        }
        let period = self.period_seconds;
        let tokens = others.tokens.saturating_add(run.tokens);
        if self.max_tokens > 0 && tokens > self.max_tokens {
            return Some(Exhausted {
                limit: "tokens",
                description: format!("{tokens} tokens in the last {period} s, over {}", self.max_tokens),
            });
        }
        let cost = others.cost + run.cost;
        if self.max_cost > 0.0 && cost > self.max_cost {
            return Some(Exhausted {
                limit: "cost",
                description: format!("${cost:.2} in the last {period} s, over ${:.2}", self.max_cost),
            });
        }
        None
    }
}

/// What a budget key limits, for messages: `process 'p'` or `agent 'a'`.
pub fn owner(key: &str) -> String {
    match key.strip_prefix("agent:") {
        Some(agent) => format!("agent '{agent}'"),
        None => format!("process '{key}'"),
    }
}

impl From<(&str, &muster_format::ProcessBudget)> for Budget {
    fn from((process_name, declared): (&str, &muster_format::ProcessBudget)) -> Self {
        Self {
            process_name: process_name.to_owned(),
            period_seconds: declared.period_seconds,
            max_cost: declared.max_cost,
            max_tokens: declared.max_tokens,
            max_runs: declared.max_runs,
            run_max_cost: declared.run_max_cost,
            run_max_tokens: declared.run_max_tokens,
            on_exceed: declared.on_exceed,
            source: Source::Declared,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(max_cost: f64, max_tokens: u64, max_runs: u32) -> Budget {
        Budget {
            process_name: "p".into(),
            period_seconds: 3600,
            max_cost,
            max_tokens,
            max_runs,
            run_max_cost: 0.0,
            run_max_tokens: 0,
            on_exceed: Action::Stop,
            source: Source::Operator,
        }
    }

    #[test]
    fn the_first_limit_reached_refuses_a_run() {
        let used = Usage { cost: 2.0, tokens: 500, runs: 3 };
        assert_eq!(budget(0.0, 0, 3).exhausted(&used).unwrap().description, "3 of 3 runs in the last 3600 s");
        assert_eq!(budget(2.0, 0, 4).exhausted(&used).unwrap().limit, "cost");
        assert_eq!(budget(5.0, 500, 4).exhausted(&used).unwrap().limit, "tokens");
        assert_eq!(budget(5.0, 501, 4).exhausted(&used), None);
        assert_eq!(budget(0.0, 0, 0).exhausted(&used), None, "0 is no limit");
        assert!(budget(0.0, 0, 0).is_unlimited());
        assert_eq!(budget(0.0, 0, 1).period_start(10_000_000), 10_000_000 - 3_600_000);
    }

    #[test]
    fn a_run_goes_over_a_limit_past_it_not_at_it() {
        let run = Usage { cost: 0.5, tokens: 200, runs: 1 };
        let none = Usage::default();
        let per_run = Budget { run_max_tokens: 200, run_max_cost: 0.5, ..budget(0.0, 0, 0) };
        assert_eq!(per_run.exceeded(&run, &none), None, "at the limit is within it");
        assert!(!per_run.is_unlimited() && !per_run.has_period_limit() && per_run.limits_use());
        let over = Usage { tokens: 201, ..run };
        let exceeded = per_run.exceeded(&over, &none).unwrap();
        assert_eq!(
            (exceeded.limit, exceeded.description.as_str()),
            ("run_tokens", "the run used 201 tokens, over its 200")
        );
        // Per period, with what the other runs had used.
        let others = Usage { cost: 1.6, tokens: 900, runs: 4 };
        assert_eq!(budget(0.0, 1000, 0).exceeded(&run, &others).unwrap().limit, "tokens");
        assert_eq!(
            budget(2.0, 0, 0).exceeded(&run, &others).unwrap().description,
            "$2.10 in the last 3600 s, over $2.00"
        );
        assert_eq!(budget(0.0, 0, 3).exceeded(&run, &others), None, "runs are checked at the start only");
    }
}
