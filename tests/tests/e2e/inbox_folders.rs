//! Inboxes as folders, end to end: `muster inbox watch DIR` as a process
//! against the real cluster. Files dropped into `DIR/<inbox>/` are posted
//! once; they move to `processed/` and `archive/` as their messages do; a
//! refused or too big file stays with its `.error` note and is not tried
//! again; a watcher killed and started again (even without its state file)
//! posts nothing twice; Ctrl-C ends it.

use std::{path::Path, time::Duration};

use muster_proto::execution::v1::{
    ArchiveInboxMessageRequest, InboxMessage, ListInboxMessagesRequest, MessageState, PublishProcessRequest,
};
use muster_tests::{Backend, ExecutionClient, TestCluster, agent, command::Background, spawn_sample_worker};
use nix::sys::signal::Signal;

/// The risk review: started by its inbox, run by `risk-agent`.
const PROCESS: &str = "\
name: risk-review
triggers:
  inbox: risk
steps:
  - id: review
    type: agent_task
    agent: risk-agent
    message: review the risks
";

const LIMIT: Duration = Duration::from_secs(120);

/// Every message of `inbox`, archived ones too.
async fn all_messages(client: &mut ExecutionClient, inbox: &str) -> Vec<InboxMessage> {
    let mut messages = Vec::new();
    for state in [MessageState::Unspecified, MessageState::Archived] {
        let request = ListInboxMessagesRequest { inbox: inbox.to_owned(), state: state as i32, ..Default::default() };
        messages.extend(client.list_inbox_messages(request).await.unwrap().into_inner().messages);
    }
    messages
}

/// The id in the line `posted <file> as message <id>...` of `output`.
fn posted_id(output: &str, file: &str) -> String {
    let prefix = format!("posted {file} as message ");
    let line = output.lines().find_map(|line| line.strip_prefix(&prefix)).unwrap_or_else(|| panic!("{output}"));
    line.split_whitespace().next().unwrap().to_owned()
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_dropped_into_folders_are_posted_once_and_follow_their_messages() {
    let Some(test) = TestCluster::start(Backend::Sqlite).await else { return };
    let [token] = test.register_agents(&[agent("risk-agent", "member", "core")]).await.try_into().unwrap();
    let credentials = vec![muster::worker::AgentCredential { agent_id: "risk-agent".into(), token }];
    let (stop, worker) = spawn_sample_worker(test.operator("execution"), credentials);
    let mut client = test.execution();
    let publish = PublishProcessRequest { source: PROCESS.to_owned(), file_name: String::new() };
    client.publish_process(publish).await.expect("publish");

    let dir = test.data_dir.join("inboxes");
    let (risk, ideas) = (dir.join("risk"), dir.join("ideas"));
    std::fs::create_dir_all(&risk).unwrap();
    std::fs::create_dir_all(&ideas).unwrap();
    // `ideas` starts no process: its message stays unprocessed.
    write(&risk.join("late.md"), "auth module 3 days late");
    write(&ideas.join("later.md"), "someday: offline mode");
    write(&risk.join("empty.md"), "   ");
    write(&ideas.join("big.md"), &"x".repeat(300_000));
    write(&risk.join(".draft.md"), "still being written");
    let environment = test.command_environment();
    let dir_text = dir.display().to_string();
    let arguments = ["inbox", "watch", dir_text.as_str(), "--interval-seconds", "1"];

    let mut first = Background::spawn(&arguments, &environment);
    first.wait_for("watching ", LIMIT).await;
    let output = first.wait_for("posted risk/late.md as message ", LIMIT).await;
    let late = posted_id(&output, "risk/late.md");
    first.wait_for(&format!("risk/late.md: message {late} processed; moved to risk/processed/late.md"), LIMIT).await;
    first.wait_for("risk/empty.md: not posted: InvalidArgument: body is empty: a message needs one", LIMIT).await;
    first.wait_for("ideas/big.md: not posted: 300000 bytes; an inbox message is at most 262144 bytes", LIMIT).await;
    let output = first.wait_for("posted ideas/later.md as message ", LIMIT).await;
    let later = posted_id(&output, "ideas/later.md");
    assert!(risk.join("processed/late.md").is_file());
    let note = std::fs::read_to_string(risk.join("empty.md.error")).unwrap();
    assert_eq!(note, "InvalidArgument: body is empty: a message needs one\n");
    assert!(risk.join("empty.md").is_file(), "a refused file stays where it is");
    assert!(std::fs::read_to_string(ideas.join("big.md.error")).unwrap().contains("at most 262144 bytes"));
    assert!(ideas.join("later.md").is_file(), "unprocessed: it stays in its inbox");

    // A crash, and one before the state file was written: the next watcher
    // must post the files still in their inboxes again, and their keys make
    // that a no-op. Meanwhile a new file comes and a message is archived.
    drop(first);
    std::fs::remove_file(dir.join(".muster-inbox-watch.json")).unwrap();
    client.archive_inbox_message(ArchiveInboxMessageRequest { id: later.clone() }).await.unwrap();
    write(&risk.join("second.md"), "the vendor slipped");

    let mut second = Background::spawn(&arguments, &environment);
    second.wait_for(&format!("posted ideas/later.md as message {later} (posted before, archived)"), LIMIT).await;
    second.wait_for(&format!("ideas/later.md: message {later} archived; moved to ideas/archive/later.md"), LIMIT).await;
    let output = second.wait_for("posted risk/second.md as message ", LIMIT).await;
    let vendor = posted_id(&output, "risk/second.md");
    second
        .wait_for(&format!("risk/second.md: message {vendor} processed; moved to risk/processed/second.md"), LIMIT)
        .await;
    client.archive_inbox_message(ArchiveInboxMessageRequest { id: vendor.clone() }).await.unwrap();
    second
        .wait_for(&format!("risk/second.md: message {vendor} archived; moved to risk/archive/second.md"), LIMIT)
        .await;
    second.signal(Signal::SIGINT);
    let (status, output) = second.wait(LIMIT).await;
    assert!(status.success(), "Ctrl-C ends it cleanly:\n{output}");
    assert!(output.contains(&format!("stopped watching {dir_text}")), "{output}");
    assert!(!output.contains("empty.md") && !output.contains("big.md"), "refused files are not tried again:\n{output}");
    assert!(!output.contains("late.md"), "a processed file is not posted again:\n{output}");

    // Each file once, no more.
    let mut bodies: Vec<String> =
        all_messages(&mut client, "risk").await.into_iter().map(|message| message.body).collect();
    bodies.sort();
    assert_eq!(bodies, ["auth module 3 days late", "the vendor slipped"]);
    let ideas_messages = all_messages(&mut client, "ideas").await;
    assert_eq!(ideas_messages.len(), 1, "{ideas_messages:?}");
    assert_eq!((ideas_messages[0].subject.as_str(), ideas_messages[0].id.as_str()), ("later.md", later.as_str()));
    for moved in [risk.join("processed/late.md"), risk.join("archive/second.md"), ideas.join("archive/later.md")] {
        assert!(moved.is_file(), "{}", moved.display());
    }
    assert!(risk.join(".draft.md").is_file(), "a dotfile is never posted");

    let _ = stop.send(());
    worker.await.unwrap().unwrap();
    test.shutdown().await;
}
