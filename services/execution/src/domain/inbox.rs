//! Inboxes: messages posted for the process an inbox triggers. A message
//! is unprocessed until a run that had it completes (then processed), and
//! archived when an operator says so. A run claims the unprocessed messages
//! it starts with; one that fails or is cancelled gives them back, with a
//! note saying so, for the next run.

use serde_json::{Value, json};

use super::stored_enum;

/// Where a message is in its lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageState {
    Unprocessed,
    Processed,
    Archived,
}

stored_enum!(MessageState {
    Unprocessed => "unprocessed",
    Processed => "processed",
    Archived => "archived",
});

/// How urgent a message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Priority {
    Low,
    Normal,
    High,
}

stored_enum!(Priority {
    Low => "low",
    Normal => "normal",
    High => "high",
});

/// A message in an inbox.
#[derive(Debug, Clone, PartialEq)]
pub struct InboxMessage {
    pub id: String,
    pub inbox: String,
    pub sender: String,
    pub priority: Priority,
    pub subject: String,
    pub body: String,
    pub posted_at: i64,
    pub state: MessageState,
    /// The run that has it now; empty when none.
    pub claimed_by: String,
    /// The run that processed it.
    pub processed_by: String,
    /// Why it is still unprocessed: a run had it and failed, or its
    /// process's budget or throttle holds its run back ([`held_note`]).
    pub note: String,
}

/// Longest message body, in bytes (the contract's limit).
pub const MAX_BODY_BYTES: usize = 256 * 1024;
/// Most messages one run starts with.
pub const MESSAGES_PER_RUN: usize = 100;
/// Most bytes of message bodies one run starts with (its inputs are at most 1 MiB).
pub const BYTES_PER_RUN: usize = 512 * 1024;

/// How the note of a message held back (not yet tried by a run) begins.
const HELD: &str = "held: ";

/// The note of messages whose run `refusal` (a budget or a throttle)
/// held back.
pub fn held_note(refusal: &impl std::fmt::Display) -> String {
    format!("{HELD}{refusal}")
}

/// Whether a message's note says a run had it and failed: such a message
/// alone starts no run when another ends (no loop), while one held back by
/// a limit is tried again.
pub fn failed_in_a_run(note: &str) -> bool {
    !note.is_empty() && !note.starts_with(HELD)
}

/// The messages a run takes, from the unprocessed ones oldest first: as many
/// as fit, and always the first.
pub fn take_for_run(unprocessed: Vec<InboxMessage>) -> Vec<InboxMessage> {
    let mut bytes = 0;
    let mut taken = Vec::new();
    for message in unprocessed.into_iter().take(MESSAGES_PER_RUN) {
        bytes += message.body.len() + message.subject.len();
        if bytes > BYTES_PER_RUN && !taken.is_empty() {
            break;
        }
        taken.push(message);
    }
    taken
}

/// A run's inputs: the inbox and its messages, most urgent first, then oldest.
pub fn run_inputs(inbox: &str, messages: &[InboxMessage]) -> String {
    let mut ordered: Vec<&InboxMessage> = messages.iter().collect();
    ordered.sort_by(|a, b| b.priority.cmp(&a.priority).then(a.posted_at.cmp(&b.posted_at)));
    let messages: Vec<Value> = ordered
        .into_iter()
        .map(|message| {
            json!({
                "id": message.id,
                "from": message.sender,
                "priority": message.priority.as_str(),
                "subject": message.subject,
                "body": message.body,
                "posted_at_ms": message.posted_at,
            })
        })
        .collect();
    json!({ "inbox": inbox, "inbox_messages": messages }).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(id: &str, priority: Priority, posted_at: i64, body: &str) -> InboxMessage {
        InboxMessage {
            id: id.to_owned(),
            inbox: "risk".to_owned(),
            sender: "delivery".to_owned(),
            priority,
            subject: String::new(),
            body: body.to_owned(),
            posted_at,
            state: MessageState::Unprocessed,
            claimed_by: String::new(),
            processed_by: String::new(),
            note: String::new(),
        }
    }

    #[test]
    fn a_run_takes_what_fits_and_always_the_first() {
        let big = "b".repeat(BYTES_PER_RUN);
        let taken = take_for_run(vec![message("a", Priority::Normal, 1, &big), message("b", Priority::Normal, 2, "x")]);
        assert_eq!(taken.iter().map(|message| message.id.as_str()).collect::<Vec<_>>(), ["a"]);
        let many: Vec<_> = (0..150).map(|index| message(&index.to_string(), Priority::Low, index, "x")).collect();
        assert_eq!(take_for_run(many).len(), MESSAGES_PER_RUN);
    }

    #[test]
    fn held_messages_are_tried_again_failed_ones_not() {
        let held = held_note(&"process 'risk' is throttled: it allows 1 run at a time; 1 of 1 runs underway");
        assert_eq!(held, "held: process 'risk' is throttled: it allows 1 run at a time; 1 of 1 runs underway");
        assert!(!failed_in_a_run(&held));
        assert!(!failed_in_a_run(""), "never tried");
        assert!(failed_in_a_run("run r1 failed: step 'a' failed: no worker"));
    }

    #[test]
    fn the_most_urgent_come_first_then_the_oldest() {
        let inputs = run_inputs(
            "risk",
            &[
                message("old-low", Priority::Low, 1, "l"),
                message("new-high", Priority::High, 3, "h"),
                message("old-high", Priority::High, 2, "h"),
            ],
        );
        let inputs: Value = serde_json::from_str(&inputs).unwrap();
        assert_eq!(inputs["inbox"], "risk");
        let order: Vec<&str> =
            inputs["inbox_messages"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
        assert_eq!(order, ["old-high", "new-high", "old-low"]);
        assert_eq!(inputs["inbox_messages"][0]["from"], "delivery");
        assert_eq!(inputs["inbox_messages"][0]["priority"], "high");
    }
}
