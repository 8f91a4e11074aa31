//! A process's declared budget, its guard against runaway loops: limits per
//! period and per run that the execution service enforces, in the shape of
//! its `Budget` message.

use super::diagnostic::{Diagnostics, child_path};
use super::fields::{check_keys, integer_field};
use super::model::{BudgetAction, ProcessBudget, ProcessThrottle};
use super::yaml::{Node, ScalarValue};

const BUDGET_FIELDS: [&str; 7] =
    ["period_seconds", "max_cost", "max_tokens", "max_runs", "run_max_cost", "run_max_tokens", "on_exceed"];

const THROTTLE_FIELDS: [&str; 2] = ["min_interval_seconds", "max_concurrent"];

/// Checks `throttle:`; answers it when it is well formed.
pub(crate) fn check_throttle(node: Node<'_>, diagnostics: &mut Diagnostics) -> Option<ProcessThrottle> {
    if !node.is_mapping() {
        diagnostics.error(
            "THR001",
            "throttle",
            node.position(),
            format!("field 'throttle' must be a mapping, found {}", node.type_name()),
        );
        return None;
    }
    let errors_before = diagnostics.error_count();
    check_keys(node, "throttle", &THROTTLE_FIELDS, "THR003", "THR001", "throttle", diagnostics);
    let interval =
        integer_field(node, "min_interval_seconds", "throttle", ("THR001", "THR002"), (0, 31_536_000), diagnostics);
    let concurrent = integer_field(node, "max_concurrent", "throttle", ("THR001", "THR002"), (0, 100_000), diagnostics);
    if diagnostics.error_count() != errors_before {
        return None;
    }
    Some(ProcessThrottle {
        min_interval_seconds: interval.and_then(|value| u64::try_from(value).ok()).unwrap_or(0),
        max_concurrent: concurrent.and_then(|value| u32::try_from(value).ok()).unwrap_or(0),
    })
}

/// Checks `budget:`; answers it when it is well formed.
pub(crate) fn check_budget(node: Node<'_>, diagnostics: &mut Diagnostics) -> Option<ProcessBudget> {
    if !node.is_mapping() {
        diagnostics.error(
            "BDG001",
            "budget",
            node.position(),
            format!("field 'budget' must be a mapping, found {}", node.type_name()),
        );
        return None;
    }
    let errors_before = diagnostics.error_count();
    check_keys(node, "budget", &BUDGET_FIELDS, "BDG004", "BDG001", "budget", diagnostics);
    let period = integer_field(node, "period_seconds", "budget", ("BDG001", "BDG002"), (1, 31_536_000), diagnostics);
    let max_tokens = integer_field(node, "max_tokens", "budget", ("BDG001", "BDG003"), (0, i64::MAX), diagnostics);
    let max_runs =
        integer_field(node, "max_runs", "budget", ("BDG001", "BDG003"), (0, i64::from(u32::MAX)), diagnostics);
    let max_cost = cost_field(node, "max_cost", diagnostics);
    let run_max_tokens =
        integer_field(node, "run_max_tokens", "budget", ("BDG001", "BDG003"), (0, i64::MAX), diagnostics);
    let run_max_cost = cost_field(node, "run_max_cost", diagnostics);
    let has_period_limit = ["max_cost", "max_tokens", "max_runs"].iter().any(|key| node.get(key).is_some());
    if has_period_limit && node.get("period_seconds").is_none() {
        diagnostics.error(
            "BDG002",
            "budget",
            node.position(),
            "a budget with max_cost, max_tokens or max_runs needs 'period_seconds' (1 to 31536000)",
        );
    }
    let on_exceed = node.get("on_exceed").and_then(|value| {
        let action = value.as_str().and_then(BudgetAction::parse);
        if action.is_none() {
            diagnostics.error(
                "BDG005",
                &child_path("budget", "on_exceed"),
                value.position(),
                "field 'on_exceed' must be stop, pause or warn",
            );
        }
        action
    });
    if diagnostics.error_count() != errors_before {
        return None;
    }
    Some(ProcessBudget {
        period_seconds: period.and_then(|value| u64::try_from(value).ok()).unwrap_or(0),
        max_cost: max_cost.unwrap_or(0.0),
        max_tokens: max_tokens.and_then(|value| u64::try_from(value).ok()).unwrap_or(0),
        max_runs: max_runs.and_then(|value| u32::try_from(value).ok()).unwrap_or(0),
        run_max_cost: run_max_cost.unwrap_or(0.0),
        run_max_tokens: run_max_tokens.and_then(|value| u64::try_from(value).ok()).unwrap_or(0),
        on_exceed: on_exceed.unwrap_or_default(),
    })
}

/// An amount of US dollars: a finite number, 0 or more.
fn cost_field(node: Node<'_>, key: &str, diagnostics: &mut Diagnostics) -> Option<f64> {
    let value = node.get(key)?;
    let number = match value.scalar_value() {
        Some(ScalarValue::Int(number)) => Some(*number as f64),
        Some(ScalarValue::Float(number)) => Some(*number),
        _ => None,
    };
    match number {
        Some(cost) if cost.is_finite() && cost >= 0.0 => Some(cost),
        Some(_) => {
            diagnostics.error(
                "BDG003",
                &child_path("budget", key),
                value.position(),
                format!("field '{key}' must be a finite amount of US dollars, 0 or more"),
            );
            None
        }
        None => {
            diagnostics.error(
                "BDG001",
                &child_path("budget", key),
                value.position(),
                format!("field '{key}' must be a number, found {}", value.type_name()),
            );
            None
        }
    }
}
