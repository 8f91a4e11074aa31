//! Inboxes end to end, through real gRPC to the four real processes and the
//! `muster` command, on both databases: a posted message starts the run of
//! the process its inbox triggers; messages posted while it runs wait for
//! the next run; a run that fails gives its messages back with a note and
//! does not start itself again; one that completes marks them processed;
//! listing pages and is for the agents the process names; archiving,
//! senders and bad input are checked. A message its process's throttle
//! holds back says why, and runs when the throttle allows.

use std::time::Duration;

use muster_proto::{
    common::v1::ExecutionStatus,
    execution::v1::{
        ArchiveInboxMessageRequest, GetExecutionRequest, InboxMessage, ListExecutionsRequest, ListInboxMessagesRequest,
        MessagePriority, MessageState, PostToInboxRequest, PublishProcessRequest, StartExecutionRequest,
    },
};
use muster_tests::{
    Backend, ExecutionClient, TestCluster, agent,
    command::{run, text},
    events_until_finished, spawn_sample_worker,
};
use serde_json::Value;
use tonic::Code;

/// The risk review: started by its inbox, run by `risk-agent`, failing
/// when no worker takes the step within two seconds.
const PROCESS: &str = "\
name: risk-review
lead: tpm
triggers:
  inbox: risk
steps:
  - id: review
    type: agent_task
    agent: risk-agent
    message: review the risks
    schedule_to_start_seconds: 2
";

fn post(inbox: &str, body: &str) -> PostToInboxRequest {
    PostToInboxRequest { inbox: inbox.to_owned(), body: body.to_owned(), ..Default::default() }
}

async fn messages(client: &mut ExecutionClient, state: MessageState) -> Vec<InboxMessage> {
    let request = ListInboxMessagesRequest { inbox: "risk".to_owned(), state: state as i32, ..Default::default() };
    client.list_inbox_messages(request).await.expect("ListInboxMessages").into_inner().messages
}

async fn runs(client: &mut ExecutionClient) -> Vec<String> {
    let request = ListExecutionsRequest { process_name: "risk-review".to_owned(), ..Default::default() };
    let executions = client.list_executions(request).await.unwrap().into_inner().executions;
    executions.into_iter().map(|execution| execution.id).collect()
}

async fn messages_start_runs(backend: Backend) {
    let Some(test) = TestCluster::start(backend).await else { return };
    let ids = ["tpm", "risk-agent", "delivery-agent", "outsider"];
    let tokens = test.register_agents(&ids.map(|id| agent(id, "member", "core"))).await;
    let token = |id: &str| tokens[ids.iter().position(|known| *known == id).unwrap()].clone();
    let mut client = test.execution();
    let publish = |source: &str| PublishProcessRequest { source: source.to_owned(), file_name: String::new() };
    client.publish_process(publish(PROCESS)).await.expect("publish");

    // One inbox triggers one process.
    let rival = PROCESS.replace("name: risk-review", "name: rival");
    let status = client.publish_process(publish(&rival)).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains("inbox 'risk' already triggers process 'risk-review'"), "{}", status.message());

    // No worker yet: the first message starts a run, which has it (so it
    // cannot be archived now) and will fail; a second, posted while that run
    // is underway, waits.
    let late = PostToInboxRequest {
        subject: "auth module late".to_owned(),
        idempotency_key: "auth-late".to_owned(),
        ..post("risk", "3 days behind")
    };
    let first = client.post_to_inbox(late.clone()).await.expect("PostToInbox").into_inner();
    let [first_run] = first.triggered_execution_ids.as_slice() else { panic!("one run: {first:?}") };
    let first_message = first.message.clone().unwrap();
    // The same post retried (same sender and key) posts nothing and starts
    // nothing: the first message comes back, with its run.
    let retried = client.post_to_inbox(late.clone()).await.expect("PostToInbox again").into_inner();
    assert_eq!(
        (retried.message.unwrap().id, retried.triggered_execution_ids),
        (first_message.id.clone(), vec![first_run.clone()])
    );
    assert_eq!(first_message.sender, "local", "an operator posts under its own name by default");
    assert_eq!(&first_message.claimed_by_execution_id, first_run);
    let busy = client.archive_inbox_message(ArchiveInboxMessageRequest { id: first_message.id.clone() }).await;
    let status = busy.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "a claimed message is not archived: {status:?}");
    // An agent posts as itself, and only as itself.
    let mut delivery = test.execution_as(&token("delivery-agent"));
    // (A key is the sender's own: another sender's post with it is another message.)
    let second = delivery
        .post_to_inbox(PostToInboxRequest {
            priority: MessagePriority::High as i32,
            idempotency_key: "auth-late".to_owned(),
            ..post("risk", "vendor slipped")
        })
        .await
        .expect("an agent posts")
        .into_inner();
    assert_ne!(second.message.as_ref().unwrap().id, first_message.id);
    assert!(second.triggered_execution_ids.is_empty(), "a run is underway: the message waits");
    assert_eq!(second.message.as_ref().unwrap().sender, "delivery-agent");
    let forged = delivery
        .post_to_inbox(PostToInboxRequest { sender: "tpm".to_owned(), ..post("risk", "forged") })
        .await
        .unwrap_err();
    assert_eq!(forged.code(), Code::PermissionDenied, "{forged:?}");

    // The first run fails (no worker): its message goes back with a note,
    // and the waiting message starts the next run, which takes both.
    let events = events_until_finished(&test.operator("execution"), first_run).await;
    assert_eq!(events.last().unwrap().execution_status, ExecutionStatus::Failed as i32);
    let second_run = loop {
        let runs = runs(&mut client).await;
        if runs.len() == 2 {
            break runs.into_iter().find(|id| id != first_run).unwrap();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let events = events_until_finished(&test.operator("execution"), &second_run).await;
    assert_eq!(events.last().unwrap().execution_status, ExecutionStatus::Failed as i32);
    let unprocessed = messages(&mut client, MessageState::Unprocessed).await;
    assert_eq!(unprocessed.len(), 2);
    for message in &unprocessed {
        assert!(message.claimed_by_execution_id.is_empty(), "{message:?}");
        assert!(message.note.starts_with(&format!("run {second_run} failed")), "{}", message.note);
    }
    // A run that failed does not start itself again: no loop.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(runs(&mut client).await.len(), 2, "failed messages alone start no run");

    // A worker comes; the next message starts a run that takes all three,
    // most urgent first, and completes: they are processed.
    let credentials =
        vec![muster::worker::AgentCredential { agent_id: "risk-agent".into(), token: token("risk-agent") }];
    let (stop, worker) = spawn_sample_worker(test.operator("execution"), credentials);
    let third = client.post_to_inbox(post("risk", "budget review")).await.unwrap().into_inner();
    let [third_run] = third.triggered_execution_ids.as_slice() else { panic!("one run: {third:?}") };
    let events = events_until_finished(&test.operator("execution"), third_run).await;
    assert_eq!(events.last().unwrap().execution_status, ExecutionStatus::Completed as i32);
    let execution =
        client.get_execution(GetExecutionRequest { id: third_run.clone() }).await.unwrap().into_inner().execution;
    let output: Value = muster_tests::json_of(&execution.unwrap().steps[0].output);
    assert_eq!(output["inputs"]["inbox"], "risk");
    let bodies: Vec<&str> = output["inputs"]["inbox_messages"]
        .as_array()
        .expect("the messages in the run's inputs")
        .iter()
        .map(|message| message["body"].as_str().unwrap())
        .collect();
    assert_eq!(bodies, ["vendor slipped", "3 days behind", "budget review"]);
    assert_eq!(output["inputs"]["inbox_messages"][0]["from"], "delivery-agent");
    let processed = messages(&mut client, MessageState::Processed).await;
    assert_eq!(processed.len(), 3);
    assert!(processed.iter().all(|message| &message.processed_by_execution_id == third_run && message.note.is_empty()));
    assert!(messages(&mut client, MessageState::Unprocessed).await.is_empty());

    // Listing pages; agents the process names may read it, others not.
    let mut seen = Vec::new();
    let mut page_token = String::new();
    loop {
        let request = ListInboxMessagesRequest {
            inbox: "risk".to_owned(),
            page_size: 2,
            page_token: page_token.clone(),
            ..Default::default()
        };
        let page = test.execution_as(&token("risk-agent")).list_inbox_messages(request).await.unwrap().into_inner();
        assert!(page.messages.len() <= 2);
        seen.extend(page.messages.into_iter().map(|message| message.id));
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    let all: Vec<String> = processed.iter().map(|message| message.id.clone()).collect();
    assert_eq!(seen, all, "every message once, oldest first");
    let request = ListInboxMessagesRequest { inbox: "risk".to_owned(), ..Default::default() };
    let status = test.execution_as(&token("outsider")).list_inbox_messages(request).await.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");

    // Archiving: a processed message leaves the default list.
    let archived = client.archive_inbox_message(ArchiveInboxMessageRequest { id: all[0].clone() }).await.unwrap();
    assert_eq!(archived.into_inner().message.unwrap().state, MessageState::Archived as i32);
    assert_eq!(messages(&mut client, MessageState::Unspecified).await.len(), 2);
    assert_eq!(messages(&mut client, MessageState::Archived).await.len(), 1);
    let status = client.archive_inbox_message(ArchiveInboxMessageRequest { id: "nothing".into() }).await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    let status = delivery.archive_inbox_message(ArchiveInboxMessageRequest { id: all[1].clone() }).await.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "archiving is for operators: {status:?}");

    // Bad input names what is wrong.
    let status = client.post_to_inbox(post("../risk", "x")).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("inbox '../risk' must match"), "{}", status.message());
    let status = client.post_to_inbox(post("risk", "  ")).await.unwrap_err();
    assert_eq!((status.code(), status.message()), (Code::InvalidArgument, "body is empty: a message needs one"));

    // A message to an inbox no process listens to is kept, and starts nothing.
    let kept = client.post_to_inbox(post("ideas", "later")).await.unwrap().into_inner();
    assert!(kept.triggered_execution_ids.is_empty());

    // The command line: post, list, archive.
    let environment = test.command_environment();
    let posted = run(
        ["inbox", "post", "ideas", "from the command line", "--subject", "cli", "--priority", "high"]
            .map(String::from)
            .to_vec(),
        environment.clone(),
    )
    .await;
    assert!(posted.status.success(), "{}", text(&posted));
    let id = text(&posted).split_whitespace().nth(1).expect("the message's id").to_owned();
    let listed = run(["inbox", "list", "ideas"].map(String::from).to_vec(), environment.clone()).await;
    assert!(listed.status.success(), "{}", text(&listed));
    assert!(text(&listed).contains(&format!("{id}  unprocessed  high    from local  cli")), "{}", text(&listed));
    let archived = run(vec!["inbox".into(), "archive".into(), id.clone()], environment.clone()).await;
    assert!(text(&archived).contains(&format!("archived {id}")), "{}", text(&archived));

    let _ = stop.send(());
    worker.await.unwrap().unwrap();
    test.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_start_runs_on_sqlite() {
    messages_start_runs(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_start_runs_on_postgres() {
    messages_start_runs(Backend::Postgres).await;
}

/// Triage: started by its inbox, one run at a time.
const TRIAGE: &str = "name: triage\nlead: tpm\ntriggers: {inbox: triage}\nthrottle: {max_concurrent: 1}\n\
                      steps:\n  - {id: sort, type: agent_task, agent: risk-agent, message: sort}\n";

async fn triage_messages(client: &mut ExecutionClient) -> Vec<InboxMessage> {
    let request = ListInboxMessagesRequest { inbox: "triage".to_owned(), ..Default::default() };
    client.list_inbox_messages(request).await.expect("ListInboxMessages").into_inner().messages
}

async fn held_messages_say_why(backend: Backend) {
    let Some(test) = TestCluster::start(backend).await else { return };
    let tokens = test.register_agents(&[agent("tpm", "member", "core"), agent("risk-agent", "member", "core")]).await;
    let mut client = test.execution();
    client
        .publish_process(PublishProcessRequest { source: TRIAGE.to_owned(), file_name: String::new() })
        .await
        .unwrap();

    // A run started by hand is underway (no worker yet): a message posted
    // now is held by the throttle, and its note says so.
    let start = StartExecutionRequest { process_name: "triage".into(), ..Default::default() };
    let manual = client.start_execution(start).await.expect("StartExecution").into_inner().execution.unwrap().id;
    let posted = client.post_to_inbox(post("triage", "new bug")).await.expect("PostToInbox").into_inner();
    assert!(posted.triggered_execution_ids.is_empty(), "held: {posted:?}");
    let [held] = triage_messages(&mut client).await.try_into().expect("one message");
    assert_eq!(held.state, MessageState::Unprocessed as i32);
    assert_eq!(held.note, "held: process 'triage' is throttled: it allows 1 run at a time; 1 of 1 runs underway");

    // A worker comes: the run by hand completes, the held message starts
    // the next run, which takes it: processed, the note cleared.
    let credentials = vec![muster::worker::AgentCredential { agent_id: "risk-agent".into(), token: tokens[1].clone() }];
    let (stop, worker) = spawn_sample_worker(test.operator("execution"), credentials);
    let processed = 'wait: {
        for _ in 0..200 {
            let [message] = triage_messages(&mut client).await.try_into().expect("one message");
            if message.state == MessageState::Processed as i32 {
                break 'wait message;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the held message was never processed");
    };
    assert!(processed.note.is_empty(), "{}", processed.note);
    assert!(!processed.processed_by_execution_id.is_empty() && processed.processed_by_execution_id != manual);

    let _ = stop.send(());
    worker.await.unwrap().unwrap();
    test.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_messages_say_why_on_sqlite() {
    held_messages_say_why(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_messages_say_why_on_postgres() {
    held_messages_say_why(Backend::Postgres).await;
}
