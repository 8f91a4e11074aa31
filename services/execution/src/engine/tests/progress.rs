//! What a running attempt reports: its use counts against its process's
//! budget at once (a runaway step is stopped mid-way), its model calls are
//! recorded for audit, and its result's figures replace what it reported.
//! And a result may keep its output from every inbox.

use std::{sync::Arc, time::Duration};

use tokio::sync::mpsc;

use super::{FakeRoster, Harness, settings};
use crate::{
    domain::{
        ExecutionStatus, StepStatus,
        inbox::MessageState,
        model::{Assignment, EventKind, Outcome},
        progress::{ModelCall, Progress},
    },
    engine::workers::{Connection, ServedAgent, ToWorker, Workers},
    store::{ExecutionFilter, InboxFilter},
};

/// A worker the test speaks for, message by message.
struct ByHand {
    worker_id: u64,
    inbox: mpsc::UnboundedReceiver<ToWorker>,
    workers: Arc<Workers>,
}

impl ByHand {
    fn connect(harness: &Harness, agent_id: &str) -> Self {
        let (sender, inbox) = mpsc::unbounded_channel();
        let worker_id = harness.engine.workers.register(Connection {
            name: "by-hand".to_owned(),
            agents: vec![ServedAgent {
                agent_id: agent_id.to_owned(),
                token: muster_runtime::auth::TokenHash::of(agent_id),
            }],
            tools: Vec::new(),
            max_concurrency: 8,
            opened_with: None,
            relayed_by: None,
            sender,
        });
        Self { worker_id, inbox, workers: harness.engine.workers.clone() }
    }

    /// The next message the service sends it.
    async fn next(&mut self) -> ToWorker {
        tokio::time::timeout(Duration::from_secs(30), self.inbox.recv())
            .await
            .expect("a message within 30 s")
            .expect("the connection stays open")
    }

    async fn assignment(&mut self) -> Arc<Assignment> {
        match self.next().await {
            ToWorker::Assignment(assignment) => assignment,
            other => panic!("expected an assignment, got {other:?}"),
        }
    }

    fn progress(&self, assignment: &Assignment, tokens_used: u64, model_call: Option<ModelCall>) {
        let progress = Progress { tokens_used, cost: tokens_used as f64 / 1000.0, model_call };
        self.workers.progress(self.worker_id, &assignment.assignment_id, progress);
    }

    fn complete(&self, assignment: &Assignment, tokens_used: u64, post_to_inbox: &str, skip_triggers: bool) {
        let outcome = Outcome::Completed {
            output_json: r#"{"done":true}"#.to_owned(),
            output_value: None,
            tokens_used,
            cost: tokens_used as f64 / 1000.0,
            duration_ms: 0,
            iterations: 1,
            post_to_inbox: post_to_inbox.to_owned(),
            remember: Vec::new(),
            skip_triggers,
        };
        self.workers.complete(self.worker_id, &assignment.assignment_id, outcome);
    }
}

fn call(iteration: u32) -> ModelCall {
    ModelCall {
        iteration,
        model: "gpt-x".to_owned(),
        input_tokens: 700,
        output_tokens: 112,
        latency_ms: 340,
        tool_calls: vec!["read_file".to_owned(), "write_file".to_owned()],
        cost: 0.0,
    }
}

fn roster() -> FakeRoster {
    FakeRoster { agents: vec!["doer"], ..FakeRoster::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_whose_reported_use_goes_over_its_budget_is_stopped_mid_way() {
    let harness = Harness::new(roster(), settings()).await;
    let mut worker = ByHand::connect(&harness, "doer");
    let source = "name: runaway\nbudget: {run_max_tokens: 1000}\nsteps:\n\
        \x20 - {id: loop, type: agent_task, agent: doer, message: m}\n\
        \x20 - {id: after, type: agent_task, agent: doer, message: m, depends_on: [loop]}\n";
    let id = harness.run(source).await;
    let assignment = worker.assignment().await;
    worker.progress(&assignment, 400, Some(call(1)));
    worker.progress(&assignment, 800, Some(call(2)));
    worker.progress(&assignment, 700, None); // below the last: ignored
    worker.progress(&assignment, 1200, Some(call(3)));

    let (status, events) = harness.finished(&id).await;
    assert_eq!(status, ExecutionStatus::Cancelled);
    let reason = "budget exceeded: the run used 1200 tokens, over its 1000 (declared budget)";
    assert_eq!(harness.engine.store.execution(&id).await.unwrap().unwrap().reason, reason);
    // The worker is told to stop, with the budget's reason.
    match worker.next().await {
        ToWorker::Cancel { assignment_id, reason: told } => {
            assert_eq!((assignment_id.as_str(), told.as_str()), (assignment.assignment_id.as_str(), reason));
        }
        other => panic!("expected the withdrawal, got {other:?}"),
    }
    let over: Vec<_> = events.iter().filter(|event| event.kind == EventKind::BudgetExceeded).collect();
    assert_eq!(over.len(), 1, "{events:?}");
    assert_eq!(
        (over[0].step_id.as_str(), over[0].detail.as_str(), over[0].tokens_used),
        ("loop", format!("{reason}; the run is stopped").as_str(), 1200)
    );
    assert!(!events.iter().any(|event| event.kind == EventKind::StepCompleted), "the step never completed");
    let steps = harness.steps(&id).await;
    let stopped = &steps["loop"];
    assert_eq!(
        (stopped.status, stopped.error_code.as_str(), stopped.tokens_used),
        (StepStatus::Cancelled, "CANCELLED", 1200)
    );
    assert_eq!(steps["after"].attempt, 0, "never started");
    // The model calls are on the record, with the attempt's use as each was reported.
    let calls: Vec<(&str, u64)> = events
        .iter()
        .filter(|event| event.kind == EventKind::StepProgress)
        .map(|event| (event.detail.as_str(), event.tokens_used))
        .collect();
    let line = |iteration| {
        format!("model call {iteration} (gpt-x): 700 in + 112 out tokens, 340 ms, tools: read_file, write_file")
    };
    assert_eq!(calls, [(line(1).as_str(), 400), (line(2).as_str(), 800), (line(3).as_str(), 1200)]);
    // A late result changes nothing.
    worker.complete(&assignment, 5, "", false);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(harness.steps(&id).await["loop"].status, StepStatus::Cancelled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_calls_are_recorded_up_to_a_limit_and_the_result_replaces_the_reported_use() {
    let harness = Harness::new(roster(), settings()).await;
    let mut worker = ByHand::connect(&harness, "doer");
    let id = harness.run("name: chatty\nsteps:\n  - {id: talk, type: agent_task, agent: doer, message: m}\n").await;
    let assignment = worker.assignment().await;
    for iteration in 1..=205 {
        worker.progress(&assignment, u64::from(iteration) * 10, Some(call(iteration)));
    }
    // What it reported is the step's use while it runs.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while harness.steps(&id).await["talk"].tokens_used != 2050 {
        assert!(tokio::time::Instant::now() < deadline, "the reported use never showed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    worker.complete(&assignment, 2000, "", false);
    let (status, events) = harness.finished(&id).await;
    assert_eq!(status, ExecutionStatus::Completed);
    let calls: Vec<_> = events.iter().filter(|event| event.kind == EventKind::StepProgress).collect();
    assert_eq!(calls.len(), 200, "at most 200 per attempt");
    assert_eq!((calls[0].step_id.as_str(), calls[0].tokens_used), ("talk", 10));
    assert_eq!(
        calls[199].detail,
        "model call 200 (gpt-x): 700 in + 112 out tokens, 340 ms, tools: read_file, write_file; \
         the attempt's later model calls are not recorded (at most 200 are)"
    );
    let step = &harness.steps(&id).await["talk"];
    assert_eq!((step.tokens_used, step.cost), (2000, 2.0), "the result's figures, not the reports'");
    let completed = events.iter().find(|event| event.kind == EventKind::StepCompleted).unwrap();
    assert_eq!(completed.tokens_used, 2000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completed_steps_use_counts_once_against_the_budget() {
    let harness = Harness::new(roster(), settings()).await;
    let mut worker = ByHand::connect(&harness, "doer");
    let source = "name: accounted\nbudget: {run_max_tokens: 800, on_exceed: warn}\nsteps:\n\
        \x20 - {id: s0, type: agent_task, agent: doer, message: m}\n\
        \x20 - {id: s1, type: agent_task, agent: doer, message: m, depends_on: [s0]}\n";
    let id = harness.run(source).await;
    let first = worker.assignment().await;
    worker.progress(&first, 400, None);
    worker.complete(&first, 500, "", false);
    // 500 done and 250 underway: within the 800.
    let second = worker.assignment().await;
    worker.progress(&second, 250, None);
    worker.complete(&second, 350, "", false);
    let (status, events) = harness.finished(&id).await;
    assert_eq!(status, ExecutionStatus::Completed);
    let over: Vec<_> = events.iter().filter(|event| event.kind == EventKind::BudgetExceeded).collect();
    assert_eq!(over.len(), 1, "{over:?}");
    assert_eq!(
        (over[0].step_id.as_str(), over[0].tokens_used, over[0].detail.as_str()),
        ("s1", 850, "budget exceeded: the run used 850 tokens, over its 800 (declared budget); the run goes on")
    );
    let steps = harness.steps(&id).await;
    assert_eq!((steps["s0"].tokens_used, steps["s1"].tokens_used), (500, 350));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_that_skips_triggers_posts_to_no_inbox() {
    let harness = Harness::new(roster(), settings()).await;
    let mut worker = ByHand::connect(&harness, "doer");
    let target =
        "name: target\ntriggers: {inbox: next}\nsteps:\n  - {id: read, type: agent_task, agent: doer, message: m}\n";
    harness.engine.publish(target.to_owned()).await.unwrap();
    let source =
        "name: source\nsteps:\n  - {id: work, type: agent_task, agent: doer, message: m, post_to_inbox: next}\n";
    let messages = |inbox: &str| {
        let filter = InboxFilter { inbox: inbox.to_owned(), limit: 100, ..InboxFilter::default() };
        let store = harness.engine.store.clone();
        async move { store.inbox_messages(&filter).await.unwrap() }
    };
    let target_runs = || {
        let filter =
            ExecutionFilter { process_name: Some("target".to_owned()), limit: 100, ..ExecutionFilter::default() };
        let store = harness.engine.store.clone();
        async move { store.list_executions(&filter).await.unwrap() }
    };

    // Skipped: neither the step's inbox nor the one the result names gets the output.
    let id = harness.run(source).await;
    let assignment = worker.assignment().await;
    worker.complete(&assignment, 1, "elsewhere", true);
    assert_eq!(harness.finished(&id).await.0, ExecutionStatus::Completed);
    assert!(messages("next").await.is_empty() && messages("elsewhere").await.is_empty());
    assert!(target_runs().await.is_empty(), "no run started");

    // Not skipped: the step's inbox gets it, and its process runs.
    let id = harness.run(source).await;
    let assignment = worker.assignment().await;
    worker.complete(&assignment, 1, "", false);
    assert_eq!(harness.finished(&id).await.0, ExecutionStatus::Completed);
    let posted = messages("next").await;
    assert_eq!(posted.len(), 1);
    assert_eq!(posted[0].body, r#"{"done":true}"#);
    let read = worker.assignment().await;
    assert_eq!(read.process_name, "target");
    let runs = target_runs().await;
    assert_eq!(runs.len(), 1);
    assert!(matches!(posted[0].state, MessageState::Unprocessed), "the run has it");
}
