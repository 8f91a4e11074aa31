//! Exactly-once memory lines across crashes: the inbox and the NDJSON files
//! agree after a kill -9 and a restart, and after a torn append.

mod common;

use std::{collections::BTreeMap, process::Stdio, time::Duration};

use common::{TempDirectory, TestNotifier, completed, failed, memory_lines, wait_until_serving};
use muster_notifier::{
    domain::Reason,
    store::{MemoryState, NewEvent, NewRecipient, SqlStore, Store},
};
use muster_proto::{
    common::v1::StepEvent,
    notifier::v1::{IngestEventsRequest, ListNotificationsRequest, notifier_service_client::NotifierServiceClient},
};
use muster_runtime::{
    auth::client::{AuthChannel, Credentials, with_credentials},
    testing::TestCredentials,
};
use prost::Message as _;
use tokio_stream::StreamExt as _;

const AGENTS: [&str; 3] = ["informed", "monitor", "lead"];

fn events(count: usize) -> Vec<StepEvent> {
    (0..count).map(|index| completed(&format!("e{index}"), &format!("s{index}"), "{\"n\":1}")).collect()
}

struct Process {
    child: tokio::process::Child,
    address: String,
}

fn log_file(data_dir: &std::path::Path) -> Stdio {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(data_dir.join("notifier.log"))
        .map(Stdio::from)
        .unwrap_or_else(|_| Stdio::null())
}

/// The credentials every notifier process of a test shares.
fn credentials() -> &'static TestCredentials {
    static CREDENTIALS: std::sync::OnceLock<TestCredentials> = std::sync::OnceLock::new();
    CREDENTIALS.get_or_init(TestCredentials::new)
}

fn client(address: &str, credentials: Credentials) -> NotifierServiceClient<AuthChannel> {
    let channel = tonic::transport::Endpoint::from_shared(address.to_owned()).expect("an address").connect_lazy();
    NotifierServiceClient::new(with_credentials(channel, credentials))
}

async fn spawn_notifier(data_dir: &std::path::Path, failpoint: Option<&str>) -> Process {
    let port_file = data_dir.join("port");
    let _ = std::fs::remove_file(&port_file);
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_muster-notifier"));
    if let Some(failpoint) = failpoint {
        command.env("MUSTER_NOTIFIER_FAILPOINT", failpoint);
    }
    let child = command
        .arg("--listen")
        .arg("127.0.0.1:0")
        .arg("--port-file")
        .arg(&port_file)
        .arg("--database-url")
        .arg(format!("sqlite://{}", data_dir.join("notifier.db").display()))
        .arg("--data-dir")
        .arg(data_dir)
        .env("MUSTER_LOG", "info")
        .env("MUSTER_LOG_FORMAT", "json")
        .envs(credentials().environment())
        // No agent calls in these tests: no roster is needed.
        .env("MUSTER_ROSTER_URL", "http://127.0.0.1:9")
        .stdout(log_file(data_dir))
        .stderr(log_file(data_dir))
        .kill_on_drop(true)
        .spawn()
        .expect("spawning muster-notifier");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let address = loop {
        if let Ok(address) = std::fs::read_to_string(&port_file) {
            break format!("http://{address}");
        }
        assert!(tokio::time::Instant::now() < deadline, "no port file");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    wait_until_serving(&address).await;
    Process { child, address }
}

/// Streams `events` and returns how many were acknowledged before `stop_after`
/// acks (or all), without closing politely.
async fn stream_events(address: &str, events: Vec<StepEvent>, stop_after: usize) -> usize {
    let mut client = client(address, credentials().service("execution"));
    let requests = tokio_stream::iter(events.into_iter().map(|event| IngestEventsRequest { event: Some(event) }));
    let Ok(response) = client.ingest_events(requests).await else { return 0 };
    let mut responses = response.into_inner();
    let mut acked = 0;
    while acked < stop_after {
        match responses.next().await {
            Some(Ok(_)) => acked += 1,
            _ => break,
        }
    }
    acked
}

async fn inbox(address: &str, agent_id: &str) -> Vec<String> {
    let mut client = client(address, credentials().operator());
    let mut event_ids = Vec::new();
    let mut after = 0;
    let mut shed = 0;
    loop {
        let request = ListNotificationsRequest { agent_id: agent_id.to_owned(), after_cursor: after, limit: 1000 };
        let page = match client.list_notifications(request).await {
            Ok(answer) => answer.into_inner().notifications,
            // A caller's reads are one at a time on a small machine: the
            // previous page's slot may not be back yet. As the refusal says,
            // ask again a little later.
            Err(status) if status.code() == tonic::Code::ResourceExhausted && shed < 50 => {
                shed += 1;
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
            Err(status) => panic!("list: {status}"),
        };
        let Some(last) = page.last() else { return event_ids };
        after = last.cursor;
        event_ids.extend(page.into_iter().map(|n| n.event.expect("event").event_id));
    }
}

/// Each agent's memory lines, as step ids in file order.
fn line_steps(memory_root: &std::path::Path, agent: &str) -> Vec<String> {
    memory_lines(memory_root, agent).iter().map(|line| line["step_id"].as_str().expect("step_id").to_owned()).collect()
}

#[tokio::test]
async fn kill_nine_and_restart_neither_lose_nor_double_a_line() {
    const EVENTS: usize = 10_000;
    let data = TempDirectory::new("kill");
    let memory_root = data.0.join("agents");
    for (round, stop_after) in [(0, 500), (1, 1500), (2, 3000), (3, 6000)] {
        let mut process = spawn_notifier(&data.0, None).await;
        // Everything is (re)sent each round, as the execution service resends
        // whatever was not acknowledged; the notifier is killed mid-stream.
        let acked = stream_events(&process.address, events(EVENTS), stop_after).await;
        process.child.start_kill().expect("kill -9");
        let _ = process.child.wait().await;
        eprintln!("round {round}: killed after {acked} acks");
    }
    let process = spawn_notifier(&data.0, None).await;
    assert_eq!(stream_events(&process.address, events(EVENTS), EVENTS).await, EVENTS);

    for agent in AGENTS {
        let stored = inbox(&process.address, agent).await;
        assert_eq!(stored.len(), EVENTS, "{agent}: one notification per event");
        let mut lines = line_steps(&memory_root, agent);
        assert_eq!(lines.len(), EVENTS, "{agent}: one line per notification");
        lines.sort();
        lines.dedup();
        assert_eq!(lines.len(), EVENTS, "{agent}: no line doubled");
    }
    drop(process);
    let log = std::fs::read_to_string(data.0.join("notifier.log")).unwrap_or_default();
    eprintln!(
        "recoveries: {}, cut-backs: {}",
        log.matches("recovered unwritten memory lines").count(),
        log.matches("removing an unconfirmed memory append").count()
    );
}

/// The informed agent's memory file of the test events' day.
const INFORMED_FILE: &str = "informed/events/notifications_2026-01-16.ndjson";

/// A notifier's data folder after one event (step s0) went through normally,
/// with a store on its database to simulate a crash with.
struct OneLine {
    data: TempDirectory,
    store: SqlStore,
    memory_root: std::path::PathBuf,
    /// The informed agent's memory file.
    file: std::path::PathBuf,
    /// Its one line.
    first_line: String,
}

async fn one_line_written(name: &str) -> OneLine {
    let data = TempDirectory::new(name);
    let memory_root = data.0.join("agents");
    let file = memory_root.join(INFORMED_FILE);
    let notifier = TestNotifier::start(&data.0, &[]).await;
    notifier.ingest(vec![completed("e0", "s0", "{}")]).await;
    notifier.stop().await;
    let first_line = std::fs::read_to_string(&file).expect("file");
    let url = format!("sqlite://{}", data.0.join("notifier.db").display());
    let store = SqlStore::connect_lazy(&url, 1).expect("store");
    OneLine { data, store, memory_root, file, first_line }
}

/// A completed event for the informed agent, stored with its memory line pending.
fn pending_for_informed(event_id: &str, step_id: &str) -> NewEvent {
    NewEvent {
        event_id: event_id.to_owned(),
        encoded: completed(event_id, step_id, "{}").encode_to_vec().into(),
        output_summary: "{}".to_owned(),
        received_at: 0,
        recipients: vec![NewRecipient {
            agent_id: "informed".to_owned(),
            reason: Reason::Informed,
            memory: MemoryState::Pending,
            memory_path: Some(INFORMED_FILE.to_owned()),
        }],
    }
}

#[tokio::test]
async fn a_crash_between_commit_and_append_is_repaired_at_start() {
    let OneLine { data, store, memory_root, file, first_line } = one_line_written("torn").await;

    // Simulate the crash: a batch committed as pending, with the file's length
    // before the append recorded, and half of its first line on disk.
    let pending = [pending_for_informed("e1", "s1"), pending_for_informed("e2", "s2")];
    store.ingest(&pending, &[(INFORMED_FILE.to_owned(), Some(first_line.len() as u64))]).await.expect("ingest");
    drop(store);
    let mut torn = first_line.clone();
    torn.push_str("{\"event_type\":\"step_comp");
    std::fs::write(&file, torn).expect("torn write");

    let notifier = TestNotifier::start(&data.0, &[]).await;
    assert_eq!(line_steps(&memory_root, "informed"), vec!["s0", "s1", "s2"]);
    // A restart with nothing pending changes nothing.
    notifier.stop().await;
    let notifier = TestNotifier::start(&data.0, &[]).await;
    assert_eq!(line_steps(&memory_root, "informed"), vec!["s0", "s1", "s2"]);
    let counts: BTreeMap<&str, usize> =
        AGENTS.iter().map(|agent| (*agent, memory_lines(&memory_root, agent).len())).collect();
    assert_eq!(counts["informed"], 3);
    notifier.stop().await;
}

/// The notifier stores a batch while the previous one's lines are still
/// being appended. A crash then leaves two batches unconfirmed: the first's
/// lines on disk, the second's torn. The file is cut back to its length
/// before the first and both are rewritten.
#[tokio::test]
async fn a_crash_with_two_batches_unconfirmed_rewrites_both() {
    let OneLine { data, store, memory_root, file, first_line } = one_line_written("two-unconfirmed").await;
    // The first batch records the length before its append; the second,
    // stored while that append is under way, leaves it as it is.
    let first_batch = [pending_for_informed("e1", "s1")];
    store.ingest(&first_batch, &[(INFORMED_FILE.to_owned(), Some(first_line.len() as u64))]).await.expect("ingest");
    let second_batch = [pending_for_informed("e2", "s2"), pending_for_informed("e3", "s3")];
    store.ingest(&second_batch, &[]).await.expect("ingest");
    drop(store);
    // The first batch's line whole, the second's torn.
    let first_batch_line = first_line.replace("\"s0\"", "\"s1\"");
    std::fs::write(&file, format!("{first_line}{first_batch_line}{{\"event_type\":\"step_comp")).expect("write");

    let notifier = TestNotifier::start(&data.0, &[]).await;
    assert_eq!(line_steps(&memory_root, "informed"), vec!["s0", "s1", "s2", "s3"]);
    notifier.stop().await;
}

/// Crashes the notifier at a failpoint while it stores a second batch, then
/// restarts it and checks the memory file against the inbox.
async fn crash_at(failpoint: &str) {
    let data = TempDirectory::new(failpoint);
    let memory_root = data.0.join("agents");
    let process = spawn_notifier(&data.0, None).await;
    assert_eq!(stream_events(&process.address, events(10), 10).await, 10);
    drop(process);

    let mut process = spawn_notifier(&data.0, Some(failpoint)).await;
    // The process aborts before acknowledging anything of this batch.
    let batch: Vec<StepEvent> = events(30).split_off(10);
    assert_eq!(stream_events(&process.address, batch, 20).await, 0);
    let status = process.child.wait().await.expect("exit status");
    assert!(!status.success(), "the failpoint aborted the process");
    match failpoint {
        "after-commit" => assert_eq!(line_steps(&memory_root, "informed").len(), 10),
        _ => assert!(
            std::fs::read_to_string(memory_root.join("informed/events/notifications_2026-01-16.ndjson"))
                .expect("file")
                .ends_with(|last: char| last != '\n')
        ),
    }

    let process = spawn_notifier(&data.0, None).await;
    // The execution service resends the unacknowledged events: all deduplicated.
    assert_eq!(stream_events(&process.address, events(30), 30).await, 30);
    for agent in AGENTS {
        let stored = inbox(&process.address, agent).await;
        let lines = line_steps(&memory_root, agent);
        let expected: Vec<String> = (0..30).map(|index| format!("s{index}")).collect();
        assert_eq!(stored.len(), 30, "{agent}");
        assert_eq!(lines, expected, "{agent}: every line once, in order");
    }
    let log = std::fs::read_to_string(data.0.join("notifier.log")).unwrap_or_default();
    assert!(log.contains("recovered unwritten memory lines"), "recovery ran");
}

#[tokio::test]
async fn a_crash_after_the_commit_is_repaired_at_restart() {
    crash_at("after-commit").await;
}

#[tokio::test]
async fn a_torn_append_is_cut_back_and_rewritten_at_restart() {
    crash_at("torn-append").await;
}

#[tokio::test]
async fn a_failed_append_is_retried_at_the_next_start() {
    let data = TempDirectory::new("failed-append");
    let memory_root = data.0.join("agents");
    // A file where the informed agent's events directory should be: its append fails.
    std::fs::create_dir_all(memory_root.join("informed")).expect("dir");
    std::fs::write(memory_root.join("informed/events"), "in the way").expect("blocker");

    let notifier = TestNotifier::start(&data.0, &[]).await;
    let acks = notifier.ingest(vec![completed("e1", "s1", "{}"), failed("e2", "s2")]).await;
    assert_eq!(acks.iter().map(|ack| ack.notifications).collect::<Vec<_>>(), vec![3, 3], "stored and acknowledged");
    assert_eq!(line_steps(&memory_root, "monitor"), vec!["s1", "s2"]);
    notifier.stop().await;

    std::fs::remove_file(memory_root.join("informed/events")).expect("unblock");
    let notifier = TestNotifier::start(&data.0, &[]).await;
    assert_eq!(line_steps(&memory_root, "informed"), vec!["s1", "s2"], "rewritten at start");
    assert_eq!(line_steps(&memory_root, "monitor"), vec!["s1", "s2"], "others untouched");
    notifier.stop().await;
    // Written once: a further restart adds nothing.
    let notifier = TestNotifier::start(&data.0, &[]).await;
    assert_eq!(line_steps(&memory_root, "informed"), vec!["s1", "s2"]);
    notifier.stop().await;
}
