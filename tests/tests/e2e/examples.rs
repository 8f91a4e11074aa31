//! The examples as a user runs them with the `muster` command, on a real
//! cluster with the sample roster and its agents: the chain (a message to
//! `status` starts the sweep, whose findings start the risk review, whose
//! review lands in the digest) and the runaway loop that its budget stops.

use std::time::Duration;

use muster_proto::execution::v1::{ListInboxMessagesRequest, MessageState};
use muster_tests::{
    Backend, ExecutionClient, TestCluster,
    command::{Background, run, text},
};

const EXAMPLES: [&str; 5] = [
    "examples/chain/status-sweep.yaml",
    "examples/chain/risk-review.yaml",
    "examples/chain/digest.yaml",
    "examples/loop/ping.yaml",
    "examples/loop/pong.yaml",
];

/// Waits until `inbox` holds a message in `state` that `accept` likes.
async fn wait_for_message(
    client: &mut ExecutionClient,
    inbox: &str,
    state: MessageState,
    accept: impl Fn(&muster_proto::execution::v1::InboxMessage) -> bool,
) -> muster_proto::execution::v1::InboxMessage {
    for _ in 0..600 {
        let request = ListInboxMessagesRequest { inbox: inbox.to_owned(), state: state as i32, ..Default::default() };
        let messages = client.list_inbox_messages(request).await.unwrap().into_inner().messages;
        if let Some(message) = messages.into_iter().find(&accept) {
            return message;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no such message in inbox '{inbox}'");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chain_and_the_loop_run_as_the_readme_says() {
    let Some(test) = TestCluster::start(Backend::Sqlite).await else { return };
    let environment = test.command_environment();
    let command = |words: &[&str]| words.iter().map(|word| (*word).to_owned()).collect::<Vec<_>>();
    let tokens_file = test.data_dir.join("tokens.json").display().to_string();
    let imported =
        run(command(&["roster", "import", "examples/roster.yaml", "--tokens-file", &tokens_file]), environment.clone())
            .await;
    assert!(imported.status.success(), "{}", text(&imported));
    let mut agents = Background::spawn(&["agent", "--tokens-file", &tokens_file], &environment);
    agents.wait_for("connected: serving", Duration::from_secs(60)).await;
    for example in EXAMPLES {
        let valid = run(command(&["validate", example]), environment.clone()).await;
        assert_eq!(valid.status.code(), Some(0), "{example}: {}", text(&valid));
        let published = run(command(&["publish", example]), environment.clone()).await;
        assert!(published.status.success(), "{example}: {}", text(&published));
    }
    let mut client = test.execution();

    // The chain: status → sweep → risk → review → digest → record.
    let posted =
        run(command(&["inbox", "post", "status", "the auth module is 3 days late"]), environment.clone()).await;
    assert!(posted.status.success(), "{}", text(&posted));
    let record = wait_for_message(&mut client, "digest", MessageState::Processed, |_| true).await;
    assert_eq!(record.sender, "analyst-agent", "the review, posted by its executor");
    assert!(record.subject.starts_with("step 'assess' of risk-review"), "{}", record.subject);
    let finding = wait_for_message(&mut client, "risk", MessageState::Processed, |_| true).await;
    assert_eq!(finding.sender, "research-agent");
    assert!(finding.body.contains("the auth module is 3 days late"), "the sweep saw the message: {}", finding.body);
    let schedules = run(command(&["schedule", "list"]), environment.clone()).await;
    assert!(
        text(&schedules).contains("status-sweep  '0 9 * * 1-5' Europe/London  missed: run_once  next 20"),
        "{}",
        text(&schedules)
    );

    // The loop: five runs of ping, then its budget stops it.
    let posted = run(command(&["inbox", "post", "ping", "start"]), environment.clone()).await;
    assert!(posted.status.success(), "{}", text(&posted));
    let stopped =
        wait_for_message(&mut client, "ping", MessageState::Unprocessed, |message| !message.note.is_empty()).await;
    assert_eq!(
        stopped.note,
        "held: budget of process 'ping' exhausted: 5 of 5 runs in the last 3600 s (declared budget)"
    );
    let budgets = run(command(&["budget", "list"]), environment.clone()).await;
    assert!(text(&budgets).contains("ping  (declared, per 3600 s)  runs 5 of 5"), "{}", text(&budgets));

    drop(agents);
    test.shutdown().await;
}
