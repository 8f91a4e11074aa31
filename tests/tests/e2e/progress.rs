//! A model-driven step as it goes, end to end through real gRPC to the four
//! real processes, with a worker speaking the protocol by hand: the use it
//! reports counts against its process's budget at once, so a runaway loop
//! is stopped mid-step (the execution cancelled with the budget's reason,
//! the worker told to stop); its model calls are STEP_PROGRESS events, on
//! the record for `WatchExecution` and `muster watch` and in nobody's
//! inbox; its result's figures replace what it reported. And a result with
//! `skip_triggers` keeps its output from the inbox its step posts to.

use std::time::Duration;

use muster_proto::{
    common::v1::{EventType, ExecutionStatus},
    execution::v1::{
        ConnectWorkerRequest, ConnectWorkerResponse, GetExecutionRequest, ListExecutionsRequest,
        ListInboxMessagesRequest, ModelCall, PublishProcessRequest, ServedAgent, StartExecutionRequest, StepProgress,
        StepResult, StepStatus, WorkerHello, connect_worker_request, connect_worker_response,
    },
    notifier::v1::ListNotificationsRequest,
};
use muster_tests::{
    Backend, ExecutionClient, TestCluster, agent,
    command::{run, text},
    events_until_finished,
};
use tokio::sync::mpsc;

/// A worker for `doer`, by hand: what it sends, and what it is sent.
struct ByHand {
    sender: mpsc::Sender<ConnectWorkerRequest>,
    stream: tonic::Streaming<ConnectWorkerResponse>,
}

impl ByHand {
    async fn connect(test: &TestCluster, token: &str) -> Self {
        let (sender, receiver) = mpsc::channel(64);
        let hello = WorkerHello {
            worker_name: "by-hand".to_owned(),
            agents: vec![ServedAgent { agent_id: "doer".to_owned(), token: token.to_owned() }],
            tools: Vec::new(),
            max_concurrency: 4,
            keeps_windows: 0,
        };
        sender.send(say(connect_worker_request::Message::Hello(hello))).await.unwrap();
        let mut stream = test
            .execution_as(token)
            .connect_worker(tokio_stream::wrappers::ReceiverStream::new(receiver))
            .await
            .expect("ConnectWorker")
            .into_inner();
        let welcome = stream.message().await.unwrap().expect("the welcome");
        assert!(matches!(welcome.message, Some(connect_worker_response::Message::Welcome(_))), "{welcome:?}");
        Self { sender, stream }
    }

    async fn next(&mut self) -> connect_worker_response::Message {
        tokio::time::timeout(Duration::from_secs(60), self.stream.message())
            .await
            .expect("a message within a minute")
            .expect("the stream stays open")
            .expect("the stream stays open")
            .message
            .expect("a message")
    }

    /// The next assignment's id.
    async fn assignment(&mut self) -> String {
        match self.next().await {
            connect_worker_response::Message::Assignment(assignment) => assignment.assignment_id,
            other => panic!("expected an assignment, got {other:?}"),
        }
    }

    async fn progress(&self, assignment_id: &str, tokens_used: u64, model_call: Option<ModelCall>) {
        let progress = StepProgress {
            assignment_id: assignment_id.to_owned(),
            message: "thinking".to_owned(),
            percent: 0,
            tokens_used,
            cost: tokens_used as f64 / 1000.0,
            model_call,
        };
        self.sender.send(say(connect_worker_request::Message::Progress(progress))).await.unwrap();
    }

    async fn complete(&self, assignment_id: &str, tokens_used: u64, skip_triggers: bool) {
        let result = StepResult {
            assignment_id: assignment_id.to_owned(),
            output: muster_tests::value(r#"{"done": true}"#),
            tokens_used,
            cost: tokens_used as f64 / 1000.0,
            iterations: 1,
            skip_triggers,
            ..Default::default()
        };
        self.sender.send(say(connect_worker_request::Message::Result(result))).await.unwrap();
    }
}

fn say(message: connect_worker_request::Message) -> ConnectWorkerRequest {
    ConnectWorkerRequest { message: Some(message) }
}

fn call(iteration: u32) -> ModelCall {
    ModelCall {
        iteration,
        model: "gpt-x".to_owned(),
        input_tokens: 700,
        output_tokens: 112,
        latency: Some(muster_runtime::time::to_duration(340)),
        tool_calls: vec!["read_file".to_owned(), "write_file".to_owned()],
        cost: 0.0,
    }
}

fn line(iteration: u32) -> String {
    format!("model call {iteration} (gpt-x): 700 in + 112 out tokens, 340 ms, tools: read_file, write_file")
}

async fn publish(client: &mut ExecutionClient, source: &str) {
    let request = PublishProcessRequest { source: source.to_owned(), file_name: String::new() };
    client.publish_process(request).await.unwrap_or_else(|status| panic!("publish: {status}"));
}

async fn start(client: &mut ExecutionClient, process_name: &str) -> String {
    let request = StartExecutionRequest { process_name: process_name.to_owned(), ..Default::default() };
    client.start_execution(request).await.expect("start").into_inner().execution.unwrap().id
}

const RUNAWAY: &str = "\
name: runaway
lead: lead
budget:
  run_max_tokens: 1000
steps:
  - {id: loop, type: agent_task, agent: doer, message: m, roles: {executor: doer, monitors: [quality]}}
  - {id: after, type: agent_task, agent: doer, message: m, depends_on: [loop]}
";

const CHATTY: &str = "\
name: chatty
lead: lead
steps:
  - {id: talk, type: agent_task, agent: doer, message: m, post_to_inbox: next}
";

const NEXT: &str = "\
name: next
lead: lead
triggers:
  inbox: next
steps:
  - {id: read, type: agent_task, agent: doer, message: m}
";

async fn a_model_driven_step_as_it_goes(backend: Backend) {
    let Some(test) = TestCluster::start(backend).await else { return };
    let ids = ["lead", "doer", "quality"];
    let tokens = test.register_agents(&ids.map(|id| agent(id, "member", "core"))).await;
    let mut client = test.execution();
    for source in [RUNAWAY, CHATTY, NEXT] {
        publish(&mut client, source).await;
    }
    let mut worker = ByHand::connect(&test, &tokens[1]).await;

    // A loop that keeps calling its model: its reported use goes past the
    // run's 1000 tokens in the middle of the step, which is stopped there.
    let id = start(&mut client, "runaway").await;
    let assignment_id = worker.assignment().await;
    worker.progress(&assignment_id, 400, Some(call(1))).await;
    worker.progress(&assignment_id, 800, Some(call(2))).await;
    worker.progress(&assignment_id, 1200, Some(call(3))).await;
    let reason = "budget exceeded: the run used 1200 tokens, over its 1000 (declared budget)";
    match worker.next().await {
        connect_worker_response::Message::Cancel(cancel) => {
            assert_eq!((cancel.assignment_id.as_str(), cancel.reason.as_str()), (assignment_id.as_str(), reason));
        }
        other => panic!("expected CancelAssignment, got {other:?}"),
    }
    let events = events_until_finished(&test.operator("execution"), &id).await;
    let last = events.last().unwrap();
    assert_eq!((last.execution_status, last.detail.as_str()), (ExecutionStatus::Cancelled as i32, reason));
    let over = events.iter().find(|event| event.event_type == EventType::BudgetExceeded as i32).expect("the event");
    assert_eq!((over.step_id.as_str(), over.tokens_used), ("loop", 1200));
    assert!(!events.iter().any(|event| event.event_type == EventType::StepCompleted as i32), "nothing completed");
    let calls: Vec<(&str, &str, u64)> = events
        .iter()
        .filter(|event| event.event_type == EventType::StepProgress as i32)
        .map(|event| (event.step_id.as_str(), event.detail.as_str(), event.tokens_used))
        .collect();
    assert_eq!(
        calls,
        [("loop", line(1).as_str(), 400), ("loop", line(2).as_str(), 800), ("loop", line(3).as_str(), 1200)]
    );
    let execution = client.get_execution(GetExecutionRequest { id: id.clone() }).await.unwrap().into_inner();
    let step = &execution.execution.unwrap().steps[0];
    assert_eq!((step.status, step.tokens_used), (StepStatus::Cancelled as i32, 1200));

    // The monitor and the lead hear of the budget, not of the model calls.
    for token in [&tokens[2], &tokens[0]] {
        let agent_id = if token == &tokens[2] { "quality" } else { "lead" };
        let request = ListNotificationsRequest { agent_id: agent_id.to_owned(), ..Default::default() };
        let mut heard = Vec::new();
        for _ in 0..200 {
            heard =
                test.notifier_as(token).list_notifications(request.clone()).await.unwrap().into_inner().notifications;
            if heard.iter().any(|notification| {
                notification.event.as_ref().is_some_and(|event| event.event_type == EventType::BudgetExceeded as i32)
            }) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let kinds: Vec<i32> =
            heard.iter().filter_map(|notification| notification.event.as_ref()).map(|event| event.event_type).collect();
        assert!(kinds.contains(&(EventType::BudgetExceeded as i32)), "{agent_id}: {kinds:?}");
        assert!(!kinds.contains(&(EventType::StepProgress as i32)), "{agent_id}: {kinds:?}");
    }

    // `muster watch` shows the calls (and fails, as the run did not complete).
    let output = run(vec!["watch".into(), id.clone()], test.command_environment()).await;
    assert!(!output.status.success(), "{}", text(&output));
    assert!(text(&output).contains(&format!("{} ({} tokens so far)", line(2), 800)), "{}", text(&output));

    // A step that completes after reporting: its result's figures replace
    // the reports'; with skip_triggers its output goes to no inbox.
    let id = start(&mut client, "chatty").await;
    let assignment_id = worker.assignment().await;
    worker.progress(&assignment_id, 900, Some(call(1))).await;
    worker.complete(&assignment_id, 700, true).await;
    let events = events_until_finished(&test.operator("execution"), &id).await;
    assert_eq!(events.last().unwrap().execution_status, ExecutionStatus::Completed as i32);
    let execution = client.get_execution(GetExecutionRequest { id }).await.unwrap().into_inner().execution.unwrap();
    assert_eq!((execution.steps[0].tokens_used, execution.steps[0].cost), (700, 0.7));
    let inbox = ListInboxMessagesRequest { inbox: "next".into(), ..Default::default() };
    assert!(client.list_inbox_messages(inbox.clone()).await.unwrap().into_inner().messages.is_empty());
    let next_runs = ListExecutionsRequest { process_name: "next".into(), ..Default::default() };
    assert!(client.list_executions(next_runs.clone()).await.unwrap().into_inner().executions.is_empty());

    // Without it, the output is posted and the inbox's process runs.
    let id = start(&mut client, "chatty").await;
    let assignment_id = worker.assignment().await;
    worker.complete(&assignment_id, 10, false).await;
    let events = events_until_finished(&test.operator("execution"), &id).await;
    assert_eq!(events.last().unwrap().execution_status, ExecutionStatus::Completed as i32);
    assert_eq!(client.list_inbox_messages(inbox).await.unwrap().into_inner().messages.len(), 1);
    let read = worker.assignment().await;
    assert!(read.contains("/read/"), "the next process's step: {read}");
    assert_eq!(client.list_executions(next_runs).await.unwrap().into_inner().executions.len(), 1);

    drop(worker);
    test.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_driven_step_as_it_goes_on_sqlite() {
    a_model_driven_step_as_it_goes(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_driven_step_as_it_goes_on_postgres() {
    a_model_driven_step_as_it_goes(Backend::Postgres).await;
}
