//! The NDJSON memory format: one line per notification, in
//! `<agent>/events/notifications_YYYY-MM-DD.ndjson` (UTC day of the event).

use serde::Serialize;
use serde_json::{Map, Value};
use time::{OffsetDateTime, macros::format_description};

use super::{Event, EventKind};

/// The visible marker appended to a truncated `output_summary`.
pub(crate) const TRUNCATION_MARKER: &str = "…[truncated]";

/// Longest agent id that may name a memory directory (a file name limit).
const MAX_AGENT_DIRECTORY_BYTES: usize = 255;

/// The text an event's notification summarises: the output on completion, the
/// error message on failure (its code when it has no message), the detail
/// otherwise; at most `max_chars` characters, then the marker. Never splits a
/// UTF-8 character.
pub(crate) fn output_summary(event: &Event, max_chars: usize) -> String {
    let text = match event.kind {
        EventKind::StepCompleted => event.output_json.trim(),
        EventKind::StepFailed if event.error_message.is_empty() => event.error_code.as_str(),
        EventKind::StepFailed => event.error_message.as_str(),
        _ => event.detail.as_str(),
    };
    truncate(text, max_chars)
}

/// `text` cut after `max_chars` characters, with the marker when cut.
pub(crate) fn truncate(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        None => text.to_owned(),
        Some((byte_index, _)) => format!("{}{TRUNCATION_MARKER}", &text[..byte_index]),
    }
}

/// Whether `agent_id` can name a directory directly under the memory root:
/// not empty, not `.` or `..`, no path separator, no NUL, not too long.
pub(crate) fn is_safe_agent_directory(agent_id: &str) -> bool {
    !agent_id.is_empty()
        && agent_id != "."
        && agent_id != ".."
        && agent_id.len() <= MAX_AGENT_DIRECTORY_BYTES
        && !agent_id.contains(['/', '\\', '\0'])
}

/// The memory file of `agent_id` for the UTC day of `occurred_at` (ms), relative
/// to the memory root, with `/` separators. Only call with a safe agent id.
pub(crate) fn relative_file_path(agent_id: &str, occurred_at: i64) -> String {
    format!("{agent_id}/events/notifications_{}.ndjson", utc_day(occurred_at))
}

fn utc_datetime(millis: i64) -> OffsetDateTime {
    // grpc.rs only admits timestamps within the years 1..9999.
    OffsetDateTime::from_unix_timestamp(millis.div_euclid(1000)).unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

fn utc_day(millis: i64) -> String {
    utc_datetime(millis).format(format_description!("[year]-[month]-[day]")).unwrap_or_else(|_| "1970-01-01".to_owned())
}

/// RFC 3339 in UTC, to the second: `2026-01-16T10:30:00Z`.
pub(crate) fn rfc3339_seconds(millis: i64) -> String {
    utc_datetime(millis)
        .format(format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]Z"))
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".to_owned())
}

/// A cost in US dollars with two decimals: `$0.10`; sub-cent amounts keep
/// their significant digits (`$0.0042`).
pub(crate) fn format_cost(cost: f64) -> String {
    if !cost.is_finite() {
        return "$0.00".to_owned();
    }
    let cents = cost * 100.0;
    if (cents - cents.round()).abs() < 1e-9 {
        format!("${cost:.2}")
    } else {
        let precise = format!("{cost:.6}");
        format!("${}", precise.trim_end_matches('0'))
    }
}

#[derive(Serialize)]
struct MemoryLine<'event> {
    event_type: &'static str,
    process_name: &'event str,
    execution_id: &'event str,
    step_id: &'event str,
    step_name: &'event str,
    output_summary: &'event str,
    timestamp: String,
    metadata: Map<String, Value>,
}

/// The event-specific `metadata` object: cost and whole seconds on completion,
/// error code and retry count on failure; the responsible agent, wait, awaited
/// approvers or final status for the other events; for session events, the
/// agents addressed and what the event says (the task context, a role and
/// subtask, the new lead).
fn metadata(event: &Event) -> Map<String, Value> {
    let mut metadata = Map::new();
    let mut put = |key: &str, value: Value| {
        metadata.insert(key.to_owned(), value);
    };
    match event.kind {
        EventKind::StepCompleted => {
            put("cost", Value::from(format_cost(event.cost)));
            put("duration_seconds", Value::from(event.duration_ms / 1000));
        }
        EventKind::StepFailed => {
            put("error_code", Value::from(event.error_code.as_str()));
            put("retry_count", Value::from(event.retry_count));
        }
        EventKind::StepQueued => {
            if !event.agent_id.is_empty() {
                put("agent_id", Value::from(event.agent_id.as_str()));
            }
            put("wait_seconds", Value::from(event.wait_seconds));
        }
        EventKind::ApprovalRequested => {
            put("waiting_for", Value::from(event.waiting_for.clone()));
        }
        EventKind::ExecutionFinished => {
            put("execution_status", Value::from(event.execution_status.as_str()));
        }
        EventKind::BudgetExceeded => {
            put("cost", Value::from(format_cost(event.cost)));
            put("detail", Value::from(event.detail.as_str()));
        }
        EventKind::SessionStarted | EventKind::RoleAssigned | EventKind::LeadChanged => {
            if !event.agent_id.is_empty() {
                put("agent_id", Value::from(event.agent_id.as_str()));
            }
            put("participants", Value::from(event.participants.clone()));
            put("detail", Value::from(event.detail.as_str()));
        }
        EventKind::StepStarted
        | EventKind::StepDelegated
        | EventKind::StepEscalated
        | EventKind::StepIntervened
        | EventKind::ExecutionStarted => {
            if !event.agent_id.is_empty() {
                put("agent_id", Value::from(event.agent_id.as_str()));
            }
        }
    }
    metadata
}

/// One NDJSON line (with its trailing newline) with exactly the format's fields.
pub(crate) fn ndjson_line(event: &Event, output_summary: &str) -> String {
    let line = MemoryLine {
        event_type: event.kind.name(),
        process_name: &event.process_name,
        execution_id: &event.execution_id,
        step_id: &event.step_id,
        step_name: &event.step_name,
        output_summary,
        timestamp: rfc3339_seconds(event.occurred_at),
        metadata: metadata(event),
    };
    // Serialising strings, numbers and maps cannot fail.
    let mut text = serde_json::to_string(&line).unwrap_or_default();
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::tests::event;

    #[test]
    fn completion_line_matches_the_format() {
        let mut completed = event(EventKind::StepCompleted);
        completed.output_json = "{\"topic\":\"rust\"}".to_owned();
        completed.cost = 0.1;
        completed.duration_ms = 45_900;
        let summary = output_summary(&completed, 500);
        assert_eq!(
            ndjson_line(&completed, &summary),
            "{\"event_type\":\"step_completed\",\"process_name\":\"content-pipeline\",\"execution_id\":\"x1\",\
             \"step_id\":\"research\",\"step_name\":\"Research Topic\",\"output_summary\":\"{\\\"topic\\\":\\\"rust\\\"}\",\
             \"timestamp\":\"2026-01-16T10:30:00Z\",\"metadata\":{\"cost\":\"$0.10\",\"duration_seconds\":45}}\n"
        );
    }

    #[test]
    fn failure_line_carries_error_code_and_retries() {
        let mut failed = event(EventKind::StepFailed);
        failed.error_code = "TIMEOUT".to_owned();
        failed.error_message = "Agent timeout".to_owned();
        failed.retry_count = 3;
        let summary = output_summary(&failed, 500);
        let line = ndjson_line(&failed, &summary);
        assert!(line.contains("\"output_summary\":\"Agent timeout\""), "{line}");
        assert!(line.contains("\"metadata\":{\"error_code\":\"TIMEOUT\",\"retry_count\":3}"), "{line}");
    }

    #[test]
    fn truncation_keeps_whole_characters() {
        assert_eq!(truncate("héllo", 10), "héllo");
        assert_eq!(truncate("héllo", 2), format!("hé{TRUNCATION_MARKER}"));
        assert_eq!(truncate("日本語テキスト", 3), format!("日本語{TRUNCATION_MARKER}"));
        assert_eq!(truncate("abc", 3), "abc");
    }

    #[test]
    fn costs_read_like_money() {
        assert_eq!(format_cost(0.1), "$0.10");
        assert_eq!(format_cost(2.0), "$2.00");
        assert_eq!(format_cost(0.0042), "$0.0042");
        assert_eq!(format_cost(f64::NAN), "$0.00");
    }

    #[test]
    fn unsafe_agent_ids_are_refused() {
        for unsafe_id in ["", ".", "..", "../x", "a/b", "a\\b", "a\0b"] {
            assert!(!is_safe_agent_directory(unsafe_id), "{unsafe_id:?}");
        }
        assert!(is_safe_agent_directory("learning-agent"));
        assert!(is_safe_agent_directory("..hidden"));
    }

    #[test]
    fn file_is_per_utc_day() {
        assert_eq!(relative_file_path("a", 1_768_607_999_000), "a/events/notifications_2026-01-16.ndjson");
        assert_eq!(relative_file_path("a", 1_768_608_000_000), "a/events/notifications_2026-01-17.ndjson");
    }
}
