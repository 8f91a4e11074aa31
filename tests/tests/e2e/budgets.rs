//! Chained runs and budgets end to end, through real gRPC to the four real
//! processes and the `muster` command, on both databases: two processes
//! whose steps post their output to each other's inbox run in a loop until
//! a budget stops it; the refused run leaves its message waiting with a note;
//! a direct start past the budget gets RESOURCE_EXHAUSTED with a
//! QuotaFailure; an operator's budget replaces the declared one and removing
//! it brings the declared one back; bad input and the command line. A run
//! that goes over a limit of one run is stopped, paused or only warned as
//! the budget says, and its monitors and lead are told. Throttles hold
//! under a burst of 100 triggers (coalesced into few runs, none lost) and of
//! 100 starts (never more runs underway than allowed).

use std::time::Duration;

use muster_proto::{
    common::v1::{EventType, ExecutionStatus},
    execution::v1::{
        Budget, BudgetAction, BudgetScope, GetExecutionRequest, InterveneRequest, InterventionAction,
        ListBudgetsRequest, ListExecutionsRequest, ListInboxMessagesRequest, MessageState, PostToInboxRequest,
        PublishProcessRequest, SetBudgetRequest, StartExecutionRequest,
    },
    notifier::v1::ListNotificationsRequest,
};
use muster_tests::{
    Backend, ExecutionClient, TestCluster, agent,
    command::{run, text},
    events_until_finished, spawn_sample_worker,
};
use tonic::Code;
use tonic_types::StatusExt as _;

/// A process started by `inbox`, whose one step posts its output to `next`.
fn process(name: &str, inbox: &str, next: &str, budget: &str) -> String {
    format!(
        "name: {name}\nlead: lead\ntriggers:\n  inbox: {inbox}\n{budget}steps:\n  - id: work\n    type: agent_task\n    \
         agent: worker\n    message: carry on\n    post_to_inbox: {next}\n"
    )
}

async fn runs(client: &mut ExecutionClient, process_name: &str) -> usize {
    let request = ListExecutionsRequest { process_name: process_name.to_owned(), ..Default::default() };
    client.list_executions(request).await.unwrap().into_inner().executions.len()
}

async fn waiting(client: &mut ExecutionClient, inbox: &str) -> Vec<muster_proto::execution::v1::InboxMessage> {
    let request = ListInboxMessagesRequest {
        inbox: inbox.to_owned(),
        state: MessageState::Unprocessed as i32,
        ..Default::default()
    };
    client.list_inbox_messages(request).await.unwrap().into_inner().messages
}

/// Waits until `inbox` holds a message that no run took, noted.
async fn refused_message(client: &mut ExecutionClient, inbox: &str) -> muster_proto::execution::v1::InboxMessage {
    for _ in 0..400 {
        let messages = waiting(client, inbox).await;
        if let Some(message) = messages.into_iter().find(|message| !message.note.is_empty()) {
            return message;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no refused message in inbox '{inbox}'");
}

async fn budgets(client: &mut ExecutionClient) -> Vec<Budget> {
    client.list_budgets(ListBudgetsRequest::default()).await.unwrap().into_inner().budgets
}

fn set(name: &str, max_runs: u32) -> SetBudgetRequest {
    SetBudgetRequest {
        budget: Some(Budget {
            scope: BudgetScope::Process as i32,
            name: name.to_owned(),
            period: Some(muster_runtime::time::seconds_to_duration(3600)),
            max_runs,
            ..Default::default()
        }),
    }
}

async fn budgets_stop_a_runaway_loop(backend: Backend) {
    let Some(test) = TestCluster::start(backend).await else { return };
    let tokens = test.register_agents(&[agent("lead", "member", "core"), agent("worker", "member", "core")]).await;
    let mut client = test.execution();
    let budget = "budget:\n  period_seconds: 3600\n  max_runs: 3\n";
    for source in [process("ping", "ping", "pong", budget), process("pong", "pong", "ping", "")] {
        client.publish_process(PublishProcessRequest { source, file_name: String::new() }).await.expect("publish");
    }
    let credentials = vec![muster::worker::AgentCredential { agent_id: "worker".into(), token: tokens[1].clone() }];
    let (stop, worker) = spawn_sample_worker(test.operator("execution"), credentials);

    // One message starts a loop: each run posts to the other's inbox. Ping's
    // budget stops it at its fourth run; the message waits, saying why.
    let request = PostToInboxRequest { inbox: "ping".into(), body: "go".into(), ..Default::default() };
    let first = client.post_to_inbox(request).await.expect("PostToInbox").into_inner();
    assert_eq!(first.triggered_execution_ids.len(), 1);
    let refused = refused_message(&mut client, "ping").await;
    assert_eq!(
        refused.note,
        "held: budget of process 'ping' exhausted: 3 of 3 runs in the last 3600 s (declared budget)"
    );
    assert_eq!(refused.sender, "worker", "a step posts as its executor");
    assert!(refused.subject.starts_with("step 'work' of pong ("), "{}", refused.subject);
    assert!(refused.body.contains("\"inputs\""), "the body is the step's output: {}", refused.body);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!((runs(&mut client, "ping").await, runs(&mut client, "pong").await), (3, 3), "the loop stopped");

    // The budget in force, with its use; a direct start past it is refused
    // with the limit it breaks.
    let listed = budgets(&mut client).await;
    let [ping] = listed.as_slice() else { panic!("one budget: {listed:?}") };
    assert_eq!((ping.name.as_str(), ping.source.as_str(), ping.max_runs, ping.used_runs), ("ping", "declared", 3, 3));
    let start = StartExecutionRequest { process_name: "ping".into(), ..Default::default() };
    let status = client.start_execution(start.clone()).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let quota = status.get_details_quota_failure().expect("a QuotaFailure detail");
    assert_eq!(quota.violations[0].subject, "process:ping");
    assert_eq!(quota.violations[0].description, "3 of 3 runs in the last 3600 s (declared budget)");

    // An operator's budget replaces the declared one: ping runs once more,
    // and pong's own budget (set now) stops the loop on pong's side.
    let answer = client.set_budget(set("pong", 3)).await.expect("SetBudget").into_inner().budget.unwrap();
    assert_eq!((answer.source.as_str(), answer.used_runs), ("operator", 3));
    client.set_budget(set("ping", 4)).await.expect("SetBudget");
    client.start_execution(start.clone()).await.expect("a run within the operator's budget");
    let refused = refused_message(&mut client, "pong").await;
    assert!(refused.note.contains("budget of process 'pong' exhausted: 3 of 3 runs"), "{}", refused.note);
    let listed = budgets(&mut client).await;
    let used: Vec<(&str, &str, u32)> =
        listed.iter().map(|budget| (budget.name.as_str(), budget.source.as_str(), budget.used_runs)).collect();
    assert_eq!(used, [("ping", "operator", 4), ("pong", "operator", 3)]);
    // Pages.
    let page = |page_token: String| ListBudgetsRequest { page_size: 1, page_token, ..Default::default() };
    let first = client.list_budgets(page(String::new())).await.unwrap().into_inner();
    assert_eq!((first.budgets.len(), first.budgets[0].name.as_str()), (1, "ping"));
    let second = client.list_budgets(page(first.next_page_token)).await.unwrap().into_inner();
    assert_eq!(second.budgets[0].name, "pong");
    assert!(
        client.list_budgets(page(second.next_page_token)).await.unwrap().into_inner().budgets.is_empty(),
        "no third page"
    );
    // Every limit 0 removes the operator's budget: ping's declared one is
    // back, pong has none.
    client.set_budget(set("ping", 0)).await.unwrap();
    let removed = client.set_budget(set("pong", 0)).await.unwrap().into_inner();
    assert_eq!(removed.budget, None);
    let listed = budgets(&mut client).await;
    assert_eq!(
        listed.iter().map(|budget| (budget.name.as_str(), budget.source.as_str())).collect::<Vec<_>>(),
        [("ping", "declared")]
    );
    assert_eq!(client.start_execution(start).await.unwrap_err().code(), Code::ResourceExhausted);

    // Bad input names what is wrong; agents may not set budgets.
    let mut role = set("ping", 1);
    role.budget.as_mut().unwrap().scope = BudgetScope::Role as i32;
    let status = client.set_budget(role).await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    assert!(status.message().starts_with("the role has no runs of its own (no process 'role-ping')"), "{status:?}");
    let status = client.set_budget(set("nothing", 1)).await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    let mut no_period = set("ping", 1);
    no_period.budget.as_mut().unwrap().period = None;
    let status = client.set_budget(no_period).await.unwrap_err();
    assert_eq!(
        (status.code(), status.message()),
        (Code::InvalidArgument, "budget.period must be from 1 to 31536000 seconds with a limit per period, not 0 s")
    );
    let mut fractional = set("ping", 1);
    fractional.budget.as_mut().unwrap().period = Some(prost_types::Duration { seconds: 60, nanos: 500_000_000 });
    let status = client.set_budget(fractional).await.unwrap_err();
    assert_eq!(
        (status.code(), status.message()),
        (Code::InvalidArgument, "budget.period must be whole seconds (it has 500000000 ns more)")
    );
    let mut negative = set("ping", 1);
    negative.budget.as_mut().unwrap().max_cost = -1.0;
    let status = client.set_budget(negative).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().starts_with("budget.max_cost must be from 0"), "{}", status.message());
    let status = client.set_budget(SetBudgetRequest { budget: None }).await.unwrap_err();
    assert_eq!((status.code(), status.message()), (Code::InvalidArgument, "budget is required"));
    let status = test.execution_as(&tokens[1]).set_budget(set("ping", 100)).await.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");

    // The command line: set and list.
    let environment = test.command_environment();
    let command = |words: &[&str]| words.iter().map(|word| (*word).to_owned()).collect::<Vec<_>>();
    let output =
        run(command(&["budget", "set", "pong", "--max-runs", "7", "--period-seconds", "60"]), environment.clone())
            .await;
    assert!(output.status.success(), "{}", text(&output));
    let output = run(command(&["budget", "list"]), environment).await;
    assert!(output.status.success(), "{}", text(&output));
    let listed = text(&output);
    assert!(
        listed.contains("ping  (declared, per 3600 s)  runs 4 of 3  cost $0.04 (no limit)  tokens 400 (no limit)"),
        "{listed}"
    );
    assert!(listed.contains("pong  (operator, per 60 s)  runs 3 of 7  "), "{listed}");

    let _ = stop.send(());
    worker.await.unwrap().unwrap();
    test.shutdown().await;
}

/// Three steps in a chain, watched by `quality`; each step of the sample
/// worker uses 100 tokens and $0.01.
const SPENDER: &str = "\
name: spender
lead: lead
budget:
  run_max_tokens: 150
steps:
  - {id: s0, type: agent_task, agent: worker, message: m, roles: {executor: worker, monitors: [quality]}}
  - {id: s1, type: agent_task, agent: worker, message: m, depends_on: [s0], roles: {executor: worker, monitors: [quality]}}
  - {id: s2, type: agent_task, agent: worker, message: m, depends_on: [s1], roles: {executor: worker, monitors: [quality]}}
";

async fn status_of(client: &mut ExecutionClient, id: &str) -> (i32, Vec<String>) {
    let execution = client.get_execution(GetExecutionRequest { id: id.to_owned() }).await.unwrap().into_inner();
    let execution = execution.execution.unwrap();
    (execution.status, execution.steps.iter().map(|step| format!("{}:{}", step.step_id, step.status)).collect())
}

async fn a_run_over_its_budget(backend: Backend) {
    let Some(test) = TestCluster::start(backend).await else { return };
    let ids = ["lead", "worker", "quality"];
    let tokens = test.register_agents(&ids.map(|id| agent(id, "member", "core"))).await;
    let mut client = test.execution();
    let source = SPENDER.to_owned();
    client.publish_process(PublishProcessRequest { source, file_name: String::new() }).await.expect("publish");
    let credentials = vec![muster::worker::AgentCredential { agent_id: "worker".into(), token: tokens[1].clone() }];
    let (stop, worker) = spawn_sample_worker(test.operator("execution"), credentials);
    let start = StartExecutionRequest { process_name: "spender".into(), ..Default::default() };

    // Declared: stop. The second step takes the run to 200 tokens: it is
    // cancelled, with the limit as its reason, before the third starts.
    let id = client.start_execution(start.clone()).await.unwrap().into_inner().execution.unwrap().id;
    let events = events_until_finished(&test.operator("execution"), &id).await;
    let last = events.last().unwrap();
    assert_eq!(last.execution_status, ExecutionStatus::Cancelled as i32);
    assert_eq!(last.detail, "budget exceeded: the run used 200 tokens, over its 150 (declared budget)");
    let over = events.iter().find(|event| event.event_type == EventType::BudgetExceeded as i32).expect("the event");
    assert_eq!(over.step_id, "s1");
    assert_eq!(over.detail, format!("{}; the run is stopped", last.detail));
    assert!(!events.iter().any(|event| event.step_id == "s2" && event.event_type == EventType::StepStarted as i32));
    // The monitor and the lead hear of it.
    for (agent, token) in [("quality", &tokens[2]), ("lead", &tokens[0])] {
        let request = ListNotificationsRequest { agent_id: agent.to_owned(), ..Default::default() };
        let mut found = None;
        for _ in 0..100 {
            let notifications = test.notifier_as(token).list_notifications(request.clone()).await.unwrap();
            found = notifications.into_inner().notifications.into_iter().find(|notification| {
                notification.event.as_ref().is_some_and(|event| event.event_type == EventType::BudgetExceeded as i32)
            });
            if found.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let found = found.unwrap_or_else(|| panic!("{agent} hears of the budget"));
        assert!(found.output_summary.starts_with("budget exceeded: the run used 200 tokens"), "{found:?}");
    }

    // An operator's budget says pause: the run waits after the second step
    // until its lead resumes it, then completes.
    let mut pause = set("spender", 0);
    let budget = pause.budget.as_mut().unwrap();
    (budget.period, budget.run_max_tokens, budget.on_exceed) = (None, 150, BudgetAction::Pause as i32);
    let answer = client.set_budget(pause).await.expect("SetBudget").into_inner().budget.unwrap();
    assert_eq!((answer.run_max_tokens, answer.on_exceed), (150, BudgetAction::Pause as i32));
    let id = client.start_execution(start.clone()).await.unwrap().into_inner().execution.unwrap().id;
    let mut paused = None;
    for _ in 0..400 {
        let (status, steps) = status_of(&mut client, &id).await;
        if status == ExecutionStatus::Paused as i32 {
            paused = Some(steps);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let paused = paused.expect("the run pauses");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(status_of(&mut client, &id).await, (ExecutionStatus::Paused as i32, paused), "nothing moves");
    let resume = InterveneRequest {
        execution_id: id.clone(),
        action: InterventionAction::Resume as i32,
        reason: "worth it".into(),
        ..Default::default()
    };
    test.execution_as(&tokens[0]).intervene(resume).await.expect("the lead resumes");
    let events = events_until_finished(&test.operator("execution"), &id).await;
    assert_eq!(events.last().unwrap().execution_status, ExecutionStatus::Completed as i32);
    let over: Vec<_> = events.iter().filter(|event| event.event_type == EventType::BudgetExceeded as i32).collect();
    assert_eq!(over.len(), 1, "acted on once");
    assert!(over[0].detail.ends_with("(operator budget); the run is paused until it is resumed"), "{}", over[0].detail);

    // Warn: the run completes, and says so.
    let output = run(
        ["budget", "set", "spender", "--run-max-tokens", "150", "--on-exceed", "warn"].map(String::from).to_vec(),
        test.command_environment(),
    )
    .await;
    assert!(output.status.success(), "{}", text(&output));
    assert!(text(&output).contains("per run 150 tokens  over a limit: warn"), "{}", text(&output));
    let id = client.start_execution(start).await.unwrap().into_inner().execution.unwrap().id;
    let events = events_until_finished(&test.operator("execution"), &id).await;
    assert_eq!(events.last().unwrap().execution_status, ExecutionStatus::Completed as i32);
    let over = events.iter().find(|event| event.event_type == EventType::BudgetExceeded as i32).expect("the warning");
    assert!(over.detail.ends_with("; the run goes on"), "{}", over.detail);

    let _ = stop.send(());
    worker.await.unwrap().unwrap();
    test.shutdown().await;
}

fn millis(timestamp: Option<&prost_types::Timestamp>) -> i64 {
    timestamp.map_or(i64::MAX, |at| at.seconds * 1000 + i64::from(at.nanos) / 1_000_000)
}

async fn throttles_hold_under_bursts(backend: Backend) {
    let Some(test) = TestCluster::start(backend).await else { return };
    let tokens = test.register_agents(&[agent("lead", "member", "core"), agent("worker", "member", "core")]).await;
    let mut client = test.execution();
    let digest = "name: digest\nlead: lead\ntriggers: {inbox: digest}\nthrottle: {min_interval_seconds: 2}\n\
                  steps:\n  - {id: read, type: agent_task, agent: worker, message: m}\n";
    let batch = "name: batch\nlead: lead\nthrottle: {max_concurrent: 2}\n\
                 steps:\n  - {id: work, type: agent_task, agent: worker, message: m, inputs: {sleep_ms: 200}}\n";
    for source in [digest, batch] {
        let request = PublishProcessRequest { source: source.to_owned(), file_name: String::new() };
        client.publish_process(request).await.expect("publish");
    }
    let credentials = vec![muster::worker::AgentCredential { agent_id: "worker".into(), token: tokens[1].clone() }];
    let (stop, worker) = spawn_sample_worker(test.operator("execution"), credentials);

    // 100 messages at once: the first starts a run, the others are
    // coalesced into the runs the interval allows; every message is
    // processed, by runs at least 2 s apart.
    let posts: Vec<_> = (0..100)
        .map(|index| {
            let mut client = test.execution();
            tokio::spawn(async move {
                let request =
                    PostToInboxRequest { inbox: "digest".into(), body: format!("news {index}"), ..Default::default() };
                client.post_to_inbox(request).await.expect("PostToInbox").into_inner().triggered_execution_ids.len()
            })
        })
        .collect();
    let mut started = 0;
    for post in posts {
        started += post.await.unwrap();
    }
    assert!(started >= 1, "the first message starts a run at once");
    // Ten more once that run has started (and claimed what it found): they
    // wait for the interval, whatever the first run took.
    for index in 100..110 {
        let request =
            PostToInboxRequest { inbox: "digest".into(), body: format!("news {index}"), ..Default::default() };
        client.post_to_inbox(request).await.expect("PostToInbox");
    }
    let mut processed = Vec::new();
    for _ in 0..400 {
        let request = ListInboxMessagesRequest {
            inbox: "digest".into(),
            state: MessageState::Processed as i32,
            page_size: 1000,
            ..Default::default()
        };
        processed = client.list_inbox_messages(request).await.unwrap().into_inner().messages;
        if processed.len() == 110 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(processed.len(), 110, "no message is lost");
    let request = ListExecutionsRequest { process_name: "digest".into(), limit: 1000, ..Default::default() };
    let mut starts: Vec<i64> = client
        .list_executions(request)
        .await
        .unwrap()
        .into_inner()
        .executions
        .iter()
        .map(|execution| millis(execution.started_at.as_ref()))
        .collect();
    starts.sort_unstable();
    assert!((2..=6).contains(&starts.len()), "coalesced into a few runs: {starts:?}");
    assert!(starts.windows(2).all(|pair| pair[1] - pair[0] >= 2000), "runs start 2 s apart: {starts:?}");

    // 100 starts at once: never more than two runs underway; the others are
    // refused with the limit, and may try again.
    let calls: Vec<_> = (0..100)
        .map(|_| {
            let mut client = test.execution();
            tokio::spawn(async move {
                client
                    .start_execution(StartExecutionRequest { process_name: "batch".into(), ..Default::default() })
                    .await
            })
        })
        .collect();
    let mut accepted = 0;
    for call in calls {
        match call.await.unwrap() {
            Ok(_) => accepted += 1,
            Err(status) => {
                assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                let quota = status.get_details_quota_failure().expect("a QuotaFailure");
                assert_eq!(quota.violations[0].subject, "process:batch");
                assert!(quota.violations[0].description.ends_with("of 2 runs underway"), "{quota:?}");
            }
        }
    }
    assert!(accepted >= 2, "{accepted}");
    let request = ListExecutionsRequest { process_name: "batch".into(), limit: 1000, ..Default::default() };
    let mut runs = Vec::new();
    for _ in 0..400 {
        runs = client.list_executions(request.clone()).await.unwrap().into_inner().executions;
        if runs.iter().all(|execution| execution.ended_at.is_some()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(runs.len(), accepted);
    let spans: Vec<(i64, i64)> =
        runs.iter().map(|run| (millis(run.started_at.as_ref()), millis(run.ended_at.as_ref()))).collect();
    for (start, _) in &spans {
        let underway =
            spans.iter().filter(|(other_start, other_end)| other_start <= start && start < other_end).count();
        assert!(underway <= 2, "{underway} runs underway at {start}: {spans:?}");
    }

    let _ = stop.send(());
    worker.await.unwrap().unwrap();
    test.shutdown().await;
}

/// Three steps in a chain, all by `worker`, with no budget of their own.
const WORKLOAD: &str = "\
name: workload
lead: lead
steps:
  - {id: s0, type: agent_task, agent: worker, message: m, roles: {executor: worker, monitors: [quality]}}
  - {id: s1, type: agent_task, agent: worker, message: m, depends_on: [s0], roles: {executor: worker, monitors: [quality]}}
  - {id: s2, type: agent_task, agent: worker, message: m, depends_on: [s1], roles: {executor: worker, monitors: [quality]}}
";

fn agent_budget(max_runs: u32, on_exceed: BudgetAction) -> SetBudgetRequest {
    SetBudgetRequest {
        budget: Some(Budget {
            scope: BudgetScope::Agent as i32,
            name: "worker".into(),
            period: Some(muster_runtime::time::seconds_to_duration(3600)),
            max_runs,
            on_exceed: on_exceed as i32,
            ..Default::default()
        }),
    }
}

/// An agent's budget: its steps past the limit are refused (the run fails
/// there), a start naming it is refused, `warn` lets the steps go on with
/// one warning; its use is listed; bad input is refused.
async fn an_agents_budget_limits_its_steps(backend: Backend) {
    let Some(test) = TestCluster::start(backend).await else { return };
    let ids = ["lead", "worker", "quality"];
    let tokens = test.register_agents(&ids.map(|id| agent(id, "member", "core"))).await;
    let mut client = test.execution();
    let source = WORKLOAD.to_owned();
    client.publish_process(PublishProcessRequest { source, file_name: String::new() }).await.expect("publish");
    let credentials = vec![muster::worker::AgentCredential { agent_id: "worker".into(), token: tokens[1].clone() }];
    let (stop, worker) = spawn_sample_worker(test.operator("execution"), credentials);
    let start = StartExecutionRequest { process_name: "workload".into(), ..Default::default() };

    // Two steps an hour: the third is refused and fails the run.
    let set = client.set_budget(agent_budget(2, BudgetAction::Stop)).await.unwrap().into_inner().budget.unwrap();
    assert_eq!((set.scope, set.name.as_str(), set.used_runs), (BudgetScope::Agent as i32, "worker", 0));
    let id = client.start_execution(start.clone()).await.unwrap().into_inner().execution.unwrap().id;
    let events = events_until_finished(&test.operator("execution"), &id).await;
    assert_eq!(events.last().unwrap().execution_status, ExecutionStatus::Failed as i32);
    let over = events.iter().find(|event| event.event_type == EventType::BudgetExceeded as i32).expect("the event");
    assert_eq!(over.step_id, "s2");
    assert_eq!(
        over.detail,
        "budget of agent 'worker' exhausted: 2 of 2 steps in the last 3600 s (operator budget); the step is refused"
    );
    let failed = events.iter().find(|event| event.event_type == EventType::StepFailed as i32).expect("s2 failed");
    let code = failed.error.as_ref().map(|error| error.code.as_str());
    assert_eq!((failed.step_id.as_str(), code), ("s2", Some("BUDGET_EXHAUSTED")));
    assert!(!events.iter().any(|event| event.step_id == "s2" && event.event_type == EventType::StepStarted as i32));

    // A start that names the agent is refused at once.
    let status = client.start_execution(start.clone()).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(
        status.message(),
        "budget of agent 'worker' exhausted: 2 of 2 steps in the last 3600 s (operator budget)"
    );
    let quota = status.get_details_quota_failure().expect("a QuotaFailure");
    assert_eq!(quota.violations[0].subject, "agent:worker");

    // Warn: the steps go on, with one warning for the run.
    client.set_budget(agent_budget(3, BudgetAction::Warn)).await.unwrap();
    let id = client.start_execution(start.clone()).await.unwrap().into_inner().execution.unwrap().id;
    let events = events_until_finished(&test.operator("execution"), &id).await;
    assert_eq!(events.last().unwrap().execution_status, ExecutionStatus::Completed as i32);
    let warnings: Vec<_> = events.iter().filter(|event| event.event_type == EventType::BudgetExceeded as i32).collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(
        (warnings[0].step_id.as_str(), warnings[0].detail.as_str()),
        (
            "s1",
            "budget of agent 'worker' exhausted: 3 of 3 steps in the last 3600 s (operator budget); the step goes on"
        )
    );
    let request = ListBudgetsRequest { scope: BudgetScope::Agent as i32, ..Default::default() };
    let listed = client.list_budgets(request).await.unwrap().into_inner().budgets;
    assert_eq!(
        listed.iter().map(|budget| (budget.name.as_str(), budget.used_runs)).collect::<Vec<_>>(),
        [("worker", 5)]
    );
    let output =
        run(["budget", "list", "--agents"].iter().map(|word| (*word).to_owned()).collect(), test.command_environment())
            .await;
    assert!(text(&output).contains("agent worker  (operator, per 3600 s)  steps 5 of 3  "), "{}", text(&output));

    // Bad input.
    let status = client.set_budget(agent_budget(3, BudgetAction::Pause)).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    let mut unknown = agent_budget(3, BudgetAction::Stop);
    unknown.budget.as_mut().unwrap().name = "nobody".into();
    assert_eq!(client.set_budget(unknown).await.unwrap_err().code(), Code::FailedPrecondition);
    let mut per_run = agent_budget(3, BudgetAction::Stop);
    per_run.budget.as_mut().unwrap().run_max_tokens = 10;
    assert_eq!(client.set_budget(per_run).await.unwrap_err().code(), Code::InvalidArgument);

    let _ = stop.send(());
    worker.await.unwrap().unwrap();
    test.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_budget_limits_its_steps_on_sqlite() {
    an_agents_budget_limits_its_steps(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_budget_limits_its_steps_on_postgres() {
    an_agents_budget_limits_its_steps(Backend::Postgres).await;
}

/// Two execution services on one PostgreSQL database admit the runs of a
/// throttled process one at a time: a burst of starts split between them
/// never has two runs underway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_hold_a_throttle_on_postgres() {
    let Some(mut test) = TestCluster::start(Backend::Postgres).await else { return };
    let replica = test.cluster_mut().add_replica("execution").await.expect("a replica");
    let tokens = test.register_agents(&[agent("lead", "member", "core"), agent("worker", "member", "core")]).await;
    let source = "name: single\nlead: lead\nthrottle: {max_concurrent: 1}\nsteps:\n  \
                  - {id: work, type: agent_task, agent: worker, message: m, inputs: {sleep_ms: 200}}\n"
        .to_owned();
    let mut first = test.execution();
    first.publish_process(PublishProcessRequest { source, file_name: String::new() }).await.expect("publish");
    let operator = test.cluster().credentials.operator_token.clone();
    let second_endpoint = muster::credentials::Endpoint::new(format!("http://{replica}"), operator);
    let second = ExecutionClient::new(second_endpoint.channel().unwrap());
    // A worker on each replica: a run is driven by the replica that starts it.
    let credentials = vec![muster::worker::AgentCredential { agent_id: "worker".into(), token: tokens[1].clone() }];
    let (stop, worker) = spawn_sample_worker(test.operator("execution"), credentials.clone());
    let (stop_second, second_worker) = spawn_sample_worker(second_endpoint.clone(), credentials);

    // Bursts of starts on both replicas at once, until a few runs went through.
    let start = StartExecutionRequest { process_name: "single".into(), ..Default::default() };
    let mut admitted = 0;
    for _ in 0..20 {
        let mut calls = Vec::new();
        for index in 0..8 {
            let mut client = if index % 2 == 0 { first.clone() } else { second.clone() };
            let start = start.clone();
            calls.push(tokio::spawn(async move { client.start_execution(start).await }));
        }
        for call in calls {
            match call.await.unwrap() {
                Ok(_) => admitted += 1,
                Err(status) => assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}"),
            }
        }
        if admitted >= 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(admitted >= 4, "{admitted} runs admitted");
    // Wait for them to end, then check that no two overlapped.
    let mut executions = Vec::new();
    for _ in 0..200 {
        let request = ListExecutionsRequest { process_name: "single".into(), limit: 1000, ..Default::default() };
        executions = first.list_executions(request).await.unwrap().into_inner().executions;
        if executions.iter().all(|execution| execution.ended_at.is_some()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let millis = |at: Option<&prost_types::Timestamp>| muster_runtime::time::from_timestamp(at.expect("a time"));
    let mut spans: Vec<(i64, i64)> = executions
        .iter()
        .map(|execution| (millis(execution.started_at.as_ref()), millis(execution.ended_at.as_ref())))
        .collect();
    spans.sort_unstable();
    assert_eq!(spans.len(), admitted);
    for pair in spans.windows(2) {
        assert!(pair[0].1 <= pair[1].0, "two runs underway at once: {spans:?}");
    }

    for (stop, worker) in [(stop, worker), (stop_second, second_worker)] {
        let _ = stop.send(());
        worker.await.unwrap().unwrap();
    }
    test.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttles_hold_under_bursts_on_sqlite() {
    throttles_hold_under_bursts(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttles_hold_under_bursts_on_postgres() {
    throttles_hold_under_bursts(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_over_its_budget_on_sqlite() {
    a_run_over_its_budget(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_over_its_budget_on_postgres() {
    a_run_over_its_budget(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budgets_stop_a_runaway_loop_on_sqlite() {
    budgets_stop_a_runaway_loop(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budgets_stop_a_runaway_loop_on_postgres() {
    budgets_stop_a_runaway_loop(Backend::Postgres).await;
}
