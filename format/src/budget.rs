//! A process's declared budget, its guard against runaway loops: limits per
//! period that the execution service enforces, in the shape of its `Budget`
//! message.

use super::diagnostic::{Diagnostics, child_path};
use super::fields::{check_keys, integer_field};
use super::model::ProcessBudget;
use super::yaml::{Node, ScalarValue};

const BUDGET_FIELDS: [&str; 4] = ["period_seconds", "max_cost", "max_tokens", "max_runs"];

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
    if node.get("period_seconds").is_none() {
        diagnostics.error("BDG002", "budget", node.position(), "a budget needs 'period_seconds' (1 to 31536000)");
    }
    let max_tokens = integer_field(node, "max_tokens", "budget", ("BDG001", "BDG003"), (0, i64::MAX), diagnostics);
    let max_runs =
        integer_field(node, "max_runs", "budget", ("BDG001", "BDG003"), (0, i64::from(u32::MAX)), diagnostics);
    let max_cost = node.get("max_cost").and_then(|value| {
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
                    &child_path("budget", "max_cost"),
                    value.position(),
                    "field 'max_cost' must be a finite amount of US dollars, 0 or more",
                );
                None
            }
            None => {
                diagnostics.error(
                    "BDG001",
                    &child_path("budget", "max_cost"),
                    value.position(),
                    format!("field 'max_cost' must be a number, found {}", value.type_name()),
                );
                None
            }
        }
    });
    if diagnostics.error_count() != errors_before {
        return None;
    }
    Some(ProcessBudget {
        period_seconds: period.and_then(|value| u64::try_from(value).ok()).unwrap_or(0),
        max_cost: max_cost.unwrap_or(0.0),
        max_tokens: max_tokens.and_then(|value| u64::try_from(value).ok()).unwrap_or(0),
        max_runs: max_runs.and_then(|value| u32::try_from(value).ok()).unwrap_or(0),
    })
}
