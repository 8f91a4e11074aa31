//! The NDJSON memory format: one line per notification, in
//! `<agent>/events/notifications_YYYY-MM-DD.ndjson` (UTC day of the event).

use serde::Serialize;
use time::OffsetDateTime;

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

/// The memory file of `agent_id` for a UTC day ([`utc_day`]), relative to
/// the memory root, with `/` separators. Only call with a safe agent id.
pub(crate) fn relative_file_path(agent_id: &str, day: &str) -> String {
    format!("{agent_id}/events/notifications_{day}.ndjson")
}

/// The calendar date and time of day in UTC of `millis` since the epoch.
fn utc_datetime(millis: i64) -> OffsetDateTime {
    // grpc.rs only admits timestamps within the years 1..9999.
    OffsetDateTime::from_unix_timestamp(millis.div_euclid(1000)).unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

/// Appends `value` as `width` decimal digits, zero-padded (`value` has at most `width` digits).
fn push_digits(text: &mut String, value: u32, width: u32) {
    for position in (0..width).rev() {
        let digit = value / 10u32.pow(position) % 10;
        text.push(char::from(b'0' + digit as u8));
    }
}

/// The UTC day of `millis` since the epoch: `2026-01-16`.
pub(crate) fn utc_day(millis: i64) -> String {
    let mut day = String::with_capacity(20);
    push_day(&mut day, utc_datetime(millis));
    day
}

fn push_day(text: &mut String, at: OffsetDateTime) {
    push_digits(text, at.year().clamp(0, 9999) as u32, 4);
    text.push('-');
    push_digits(text, u32::from(u8::from(at.month())), 2);
    text.push('-');
    push_digits(text, u32::from(at.day()), 2);
}

/// RFC 3339 in UTC, to the second: `2026-01-16T10:30:00Z`.
pub(crate) fn rfc3339_seconds(millis: i64) -> String {
    let at = utc_datetime(millis);
    let mut text = String::with_capacity(20);
    push_day(&mut text, at);
    text.push('T');
    push_digits(&mut text, u32::from(at.hour()), 2);
    text.push(':');
    push_digits(&mut text, u32::from(at.minute()), 2);
    text.push(':');
    push_digits(&mut text, u32::from(at.second()), 2);
    text.push('Z');
    text
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
    metadata: Metadata<'event>,
}

/// The event-specific `metadata` object: cost and whole seconds on completion,
/// error code and retry count on failure; the responsible agent, wait, awaited
/// approvers or final status for the other events; for session events, the
/// agents addressed and what the event says (the task context, a role and
/// subtask, the new lead). Its keys are written in alphabetical order.
#[derive(Serialize, Default)]
struct Metadata<'event> {
    #[serde(skip_serializing_if = "Option::is_none")]
    agent_id: Option<&'event str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cost: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<&'event str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    duration_seconds: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error_code: Option<&'event str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    execution_status: Option<&'event str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    participants: Option<&'event [String]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_count: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    wait_seconds: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    waiting_for: Option<&'event [String]>,
}

fn metadata(event: &Event) -> Metadata<'_> {
    let agent_id = (!event.agent_id.is_empty()).then_some(event.agent_id.as_str());
    match event.kind {
        EventKind::StepCompleted => Metadata {
            cost: Some(format_cost(event.cost)),
            duration_seconds: Some(event.duration_ms / 1000),
            ..Metadata::default()
        },
        EventKind::StepFailed => Metadata {
            error_code: Some(&event.error_code),
            retry_count: Some(event.retry_count),
            ..Metadata::default()
        },
        EventKind::StepQueued => Metadata { agent_id, wait_seconds: Some(event.wait_seconds), ..Metadata::default() },
        EventKind::ApprovalRequested => Metadata { waiting_for: Some(&event.waiting_for), ..Metadata::default() },
        EventKind::ExecutionFinished => {
            Metadata { execution_status: Some(&event.execution_status), ..Metadata::default() }
        }
        // A step's progress reaches nobody (see `recipients`): it never has a line.
        EventKind::BudgetExceeded | EventKind::StepProgress => {
            Metadata { cost: Some(format_cost(event.cost)), detail: Some(&event.detail), ..Metadata::default() }
        }
        EventKind::SessionStarted
        | EventKind::RoleAssigned
        | EventKind::LeadChanged
        | EventKind::SubtaskRequested
        | EventKind::SubtaskDecided => Metadata {
            agent_id,
            participants: Some(&event.participants),
            detail: Some(&event.detail),
            ..Metadata::default()
        },
        EventKind::StepStarted
        | EventKind::StepDelegated
        | EventKind::StepEscalated
        | EventKind::StepIntervened
        | EventKind::ExecutionStarted => Metadata { agent_id, ..Metadata::default() },
    }
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
    // Serialising strings and numbers into memory cannot fail.
    let mut text = serde_json::to_string(&line).unwrap_or_default();
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use time::macros::format_description;

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
        assert_eq!(relative_file_path("a", &utc_day(1_768_607_999_000)), "a/events/notifications_2026-01-16.ndjson");
        assert_eq!(relative_file_path("a", &utc_day(1_768_608_000_000)), "a/events/notifications_2026-01-17.ndjson");
    }

    /// The dates and times are written as `time` formats them, over the
    /// whole admitted range of years.
    #[test]
    fn dates_and_times_read_as_rfc_3339() {
        let reference = |millis: i64| {
            let at = utc_datetime(millis);
            let day = at.format(format_description!("[year]-[month]-[day]")).unwrap();
            let time = at.format(format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]Z")).unwrap();
            (day, time)
        };
        // Year 1 to 9999, in uneven strides that visit every month, day and hour.
        let first = -62_135_596_800_000_i64;
        let last = 253_402_300_799_999_i64;
        let mut millis = first;
        while millis <= last {
            assert_eq!((utc_day(millis), rfc3339_seconds(millis)), reference(millis), "{millis}");
            millis += 86_399_999_i64 * 37 + 3_599_001;
        }
        for millis in [first, last, 0, -1, 1_768_607_999_999, 951_782_400_000] {
            assert_eq!((utc_day(millis), rfc3339_seconds(millis)), reference(millis), "{millis}");
        }
    }

    /// Every kind of event's metadata, keys in alphabetical order, as a JSON
    /// object of the same fields sorts them.
    #[test]
    fn metadata_of_every_kind_holds_its_fields_in_order() {
        let mut event = event(EventKind::StepCompleted);
        event.agent_id = "a\"gent".to_owned();
        event.cost = 0.0042;
        event.duration_ms = 1_999;
        event.error_code = "TIMEOUT".to_owned();
        event.retry_count = 2;
        event.wait_seconds = 7;
        event.waiting_for = vec!["x".to_owned(), "y".to_owned()];
        event.execution_status = "completed".to_owned();
        event.participants = vec!["p".to_owned()];
        event.detail = "line\nbreak".to_owned();
        let expected = [
            (EventKind::StepCompleted, r#"{"cost":"$0.0042","duration_seconds":1}"#),
            (EventKind::StepFailed, r#"{"error_code":"TIMEOUT","retry_count":2}"#),
            (EventKind::StepQueued, r#"{"agent_id":"a\"gent","wait_seconds":7}"#),
            (EventKind::ApprovalRequested, r#"{"waiting_for":["x","y"]}"#),
            (EventKind::ExecutionFinished, r#"{"execution_status":"completed"}"#),
            (EventKind::BudgetExceeded, r#"{"cost":"$0.0042","detail":"line\nbreak"}"#),
            (EventKind::SessionStarted, r#"{"agent_id":"a\"gent","detail":"line\nbreak","participants":["p"]}"#),
            (EventKind::StepDelegated, r#"{"agent_id":"a\"gent"}"#),
        ];
        for (kind, metadata) in expected {
            event.kind = kind;
            let line = ndjson_line(&event, "");
            assert!(line.ends_with(&format!(",\"metadata\":{metadata}}}\n")), "{kind:?}: {line}");
        }
        event.agent_id.clear();
        event.kind = EventKind::StepStarted;
        assert!(ndjson_line(&event, "").ends_with(",\"metadata\":{}}\n"));
    }
}
