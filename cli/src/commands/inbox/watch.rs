//! `muster inbox watch DIR`: inboxes as folders. Each subfolder `DIR/<inbox>/`
//! (named as an inbox is, `[a-z0-9][a-z0-9_-]*`) is that inbox; a file dropped
//! into it is posted as a message, and moved to `processed/` when a run has
//! processed it and to `archive/` when it is archived.
//!
//! The contract, poll by poll (every `--interval-seconds`):
//! - A file is posted once it has been seen unchanged (size and modification
//!   time) by two polls in a row, so one still being written waits. Dotfiles,
//!   names ending in `~`, `.error` notes and subfolders are never posted.
//! - Its idempotency key is derived from the inbox, the file's name and its
//!   content: posting it again (after a crash, before the state file said it
//!   was posted) posts nothing and answers the first message.
//! - A file the service refuses, or that is too big or not UTF-8, stays where
//!   it is with `<file>.error` beside it saying why; it is tried again only
//!   once it changes (or the note is removed). When the service cannot be
//!   reached, files wait for the next poll, with no note.
//! - The messages of posted files are listed (`ListInboxMessages`, all but
//!   archived): processed ones' files move to `processed/`; those no longer
//!   listed were archived, and their files move to `archive/`.
//! - What is posted and where each file is are kept in
//!   `DIR/.muster-inbox-watch.json` ([`super::folder`]).

use std::{collections::HashMap, path::PathBuf, time::Duration};

use anyhow::Context as _;
use muster_proto::execution::v1::{
    ListInboxMessagesRequest, MessagePriority, MessageState, PostToInboxRequest,
    execution_service_client::ExecutionServiceClient,
};
use muster_runtime::auth::client::AuthChannel;
use sha2::Digest as _;

use super::folder::{ARCHIVE, Candidate, Folder, Moved, PROCESSED, Place, Tracked};

/// The service's limit on a message body (`PostToInboxRequest.body`).
const MAX_BODY_BYTES: u64 = 262_144;

/// How `muster inbox watch` posts.
pub(super) struct Watch {
    /// The folder whose subfolders are inboxes.
    pub(super) dir: PathBuf,
    /// Time between polls.
    pub(super) interval: Duration,
    /// The sender (empty: the caller's own name). The idempotency keys are
    /// the sender's: a restart must post as the same sender.
    pub(super) sender: String,
    /// The messages' priority.
    pub(super) priority: MessagePriority,
}

type Client = ExecutionServiceClient<AuthChannel>;

/// Watches until Ctrl-C.
pub(super) async fn run(watch: Watch, mut client: Client) -> anyhow::Result<()> {
    let mut folder = Folder::open(&watch.dir)?;
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    println!(
        "watching {} every {} s: a file in <inbox>/ is posted to that inbox; Ctrl-C stops",
        watch.dir.display(),
        watch.interval.as_secs()
    );
    loop {
        // Stopping mid-poll is safe: a post repeated after a restart posts
        // nothing, and each step on disk is one rename.
        tokio::select! {
            _ = &mut interrupted => break,
            polled = poll(&watch, &mut folder, &mut client) => polled?,
        }
        tokio::select! {
            _ = &mut interrupted => break,
            () = tokio::time::sleep(watch.interval) => {}
        }
    }
    println!("stopped watching {}", watch.dir.display());
    Ok(())
}

async fn poll(watch: &Watch, folder: &mut Folder, client: &mut Client) -> anyhow::Result<()> {
    let inboxes = folder.inboxes()?;
    let mut seen_now = HashMap::new();
    let ready: Vec<Candidate> = inboxes.iter().flat_map(|inbox| folder.ready(inbox, &mut seen_now)).collect();
    folder.seen(seen_now);
    for candidate in ready {
        if !post(watch, folder, client, &candidate).await? {
            // The service cannot be reached: the rest waits for the next poll.
            break;
        }
    }
    follow(folder, client).await
}

/// The idempotency key of a file: the inbox, its name and its content.
fn idempotency_key(inbox: &str, file: &str, body: &[u8]) -> String {
    let digest = sha2::Sha256::new()
        .chain_update(inbox)
        .chain_update([0])
        .chain_update(file)
        .chain_update([0])
        .chain_update(body)
        .finalize();
    let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("inbox-watch-{hex}")
}

/// Whether a refusal is the service's answer about this file (a note), or a
/// passing trouble (try again at the next poll).
fn passing(code: tonic::Code) -> bool {
    matches!(
        code,
        tonic::Code::Unavailable
            | tonic::Code::DeadlineExceeded
            | tonic::Code::Cancelled
            | tonic::Code::Unknown
            | tonic::Code::Internal
            | tonic::Code::Aborted
            | tonic::Code::ResourceExhausted
    )
}

/// Posts one ready file; `false` when the service cannot be reached.
async fn post(watch: &Watch, folder: &mut Folder, client: &mut Client, candidate: &Candidate) -> anyhow::Result<bool> {
    let shown = format!("{}/{}", candidate.inbox, candidate.file);
    let refuse = |folder: &mut Folder, reason: String| {
        println!("{shown}: not posted: {reason} (see {shown}.error)");
        folder.refuse(candidate, &reason);
    };
    let bytes = match std::fs::read(&candidate.path) {
        Ok(bytes) => bytes,
        // Gone or unreadable since the scan: the next poll sees.
        Err(_) => return Ok(true),
    };
    if Folder::changed_since_seen(candidate) {
        return Ok(true);
    }
    if bytes.len() as u64 > MAX_BODY_BYTES {
        refuse(folder, format!("{} bytes; an inbox message is at most {MAX_BODY_BYTES} bytes", bytes.len()));
        return Ok(true);
    }
    let key = idempotency_key(&candidate.inbox, &candidate.file, &bytes);
    let Ok(body) = String::from_utf8(bytes) else {
        refuse(folder, "not UTF-8 text; an inbox message is text".to_owned());
        return Ok(true);
    };
    let request = PostToInboxRequest {
        inbox: candidate.inbox.clone(),
        sender: watch.sender.clone(),
        priority: watch.priority as i32,
        body,
        subject: candidate.file.clone(),
        idempotency_key: key,
    };
    let posted = match client.post_to_inbox(request).await {
        Ok(posted) => posted.into_inner(),
        Err(status) if status.code() == tonic::Code::Unauthenticated => return Err(crate::commands::refused(status)),
        Err(status) if passing(status.code()) => {
            eprintln!("{shown}: not posted yet: {}; trying again at the next poll", crate::commands::refused(status));
            return Ok(false);
        }
        Err(status) => {
            refuse(folder, crate::commands::refused(status).to_string());
            return Ok(true);
        }
    };
    let message = posted.message.context("no message in the answer")?;
    folder.track(candidate, &message.id)?;
    let before = match MessageState::try_from(message.state) {
        Ok(MessageState::Processed) => " (posted before, processed)",
        Ok(MessageState::Archived) => " (posted before, archived)",
        _ => "",
    };
    println!("posted {shown} as message {}{before}", message.id);
    for id in posted.triggered_execution_ids {
        println!("started execution {id}; `muster watch {id}` follows it");
    }
    Ok(true)
}

/// Lists the messages of the inboxes with tracked files and moves the files
/// whose messages moved.
async fn follow(folder: &mut Folder, client: &mut Client) -> anyhow::Result<()> {
    let mut inboxes: Vec<String> = folder.tracked.iter().map(|tracked| tracked.inbox.clone()).collect();
    inboxes.sort();
    inboxes.dedup();
    for inbox in inboxes {
        let states = match unarchived(client, &inbox).await {
            Ok(states) => states,
            Err(status) if passing(status.code()) => {
                eprintln!(
                    "inbox {inbox}: not listed: {}; trying again at the next poll",
                    crate::commands::refused(status)
                );
                return Ok(());
            }
            Err(status) => return Err(crate::commands::refused(status)),
        };
        let moves: Vec<(Tracked, &str)> = folder
            .tracked
            .iter()
            .filter(|tracked| tracked.inbox == inbox)
            .filter_map(|tracked| match (states.get(&tracked.message_id), tracked.place) {
                (Some(MessageState::Processed), Place::Inbox) => Some((tracked.clone(), PROCESSED)),
                (None, _) => Some((tracked.clone(), ARCHIVE)),
                _ => None,
            })
            .collect();
        for (tracked, to) in moves {
            let Some(index) = folder.tracked.iter().position(|known| *known == tracked) else { continue };
            let shown = format!("{inbox}/{}", tracked.file);
            let state = if to == PROCESSED { "processed" } else { "archived" };
            let id = &tracked.message_id;
            match folder.advance(index, to)? {
                Moved::To(name) => println!("{shown}: message {id} {state}; moved to {inbox}/{to}/{name}"),
                Moved::Gone => println!("{shown}: message {id} {state}; the file is gone"),
                Moved::Blocked(reason) => println!("{shown}: message {id} {state}; {reason}"),
            }
        }
    }
    Ok(())
}

/// The state of every message of `inbox` but the archived ones.
async fn unarchived(client: &mut Client, inbox: &str) -> Result<HashMap<String, MessageState>, tonic::Status> {
    let mut states = HashMap::new();
    let mut page_token = String::new();
    loop {
        let request = ListInboxMessagesRequest {
            inbox: inbox.to_owned(),
            state: MessageState::Unspecified as i32,
            page_size: 1000,
            page_token,
        };
        let page = client.list_inbox_messages(request).await?.into_inner();
        for message in page.messages {
            states.insert(message.id, MessageState::try_from(message.state).unwrap_or(MessageState::Unspecified));
        }
        if page.next_page_token.is_empty() {
            return Ok(states);
        }
        page_token = page.next_page_token;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_the_inbox_name_and_content_and_fits_the_service() {
        let key = idempotency_key("risk", "late.md", b"3 days late");
        assert!(key.len() <= 128, "{key}");
        assert_eq!(key, idempotency_key("risk", "late.md", b"3 days late"));
        for other in [
            idempotency_key("ideas", "late.md", b"3 days late"),
            idempotency_key("risk", "late.txt", b"3 days late"),
            idempotency_key("risk", "late.md", b"4 days late"),
            idempotency_key("risk", "late.md3", b" days late"),
        ] {
            assert_ne!(key, other);
        }
    }
}
