//! Several execution replicas on one PostgreSQL, as separate processes:
//! each drives the executions it holds a lease on; when the replica that
//! drives a run is killed (kill -9) another takes the run over once the
//! lease lapses, and when it stops gracefully the other takes over at once.
//! Either way every step completes exactly once and the notifier hears of
//! every event once. Calls that act on a run reach the replica that drives
//! it from any replica, and so do the workers and tools connected to any
//! replica.

use std::{
    collections::{HashMap, HashSet},
    time::Duration,
};

use muster::worker::{AgentCredential, Endpoint};
use muster_proto::{
    common::v1::{EventType, ExecutionStatus, StepEvent},
    execution::v1::{
        CancelExecutionRequest, GetExecutionRequest, InvokeToolRequest, ListExecutionsRequest,
        ListInboxMessagesRequest, ListWorkersRequest, MessageState, PostToInboxRequest, PublishProcessRequest,
        StepStatus, SubmitApprovalRequest, WatchExecutionRequest, WorkerInfo,
        execution_service_client::ExecutionServiceClient,
    },
    notifier::v1::{SubscribeRequest, notifier_service_client::NotifierServiceClient, subscribe_response},
    roster::v1::{Agent, PutRoleDefinitionRequest, RoleDefinition},
};
use muster_tests::{
    Backend, ExecutionClient, TestCluster, agent, as_agent, chain_process, events_until_finished, publish_and_start,
    spawn_sample_worker,
};

/// The replicas' lease in these tests: a crashed replica's runs are taken
/// over within about this time.
const LEASE_MS: &str = "2000";
const STEPS: usize = 600;

/// Waits until `count` steps of the execution completed, watching through `execution`.
async fn wait_for_completed_steps(client: &mut ExecutionClient, execution_id: &str, count: usize) {
    let mut stream = client
        .watch_execution(WatchExecutionRequest { execution_id: execution_id.to_owned(), after_sequence: 0 })
        .await
        .unwrap()
        .into_inner();
    let mut completed = 0;
    while completed < count {
        let event = stream.message().await.unwrap().unwrap().event.unwrap();
        completed += usize::from(event.event_type == EventType::StepCompleted as i32);
    }
}

/// The run completed, each step once, its events without gap or repeat,
/// and the notifier delivered each event to the informed agent once.
async fn assert_completed_once(test: &TestCluster, replica: &Endpoint, execution_id: &str, steps: usize) {
    assert_completed_once_through(&test.operator("notifier"), replica, execution_id, steps).await;
}

/// [`assert_completed_once`], reading the inbox through `notifier`; the
/// watcher's inbox, for the run, as (cursor, event id).
async fn assert_completed_once_through(
    notifier: &Endpoint,
    replica: &Endpoint,
    execution_id: &str,
    steps: usize,
) -> Vec<(u64, String)> {
    let events: Vec<StepEvent> = events_until_finished(replica, execution_id).await;
    let finished = events.last().unwrap();
    assert_eq!(finished.execution_status, ExecutionStatus::Completed as i32, "{}", finished.detail);
    for (position, event) in events.iter().enumerate() {
        assert_eq!(event.sequence, position as u64 + 1, "event sequences have no gap and no repeat");
    }
    for index in 0..steps {
        let step = format!("s{index}");
        let completions = events
            .iter()
            .filter(|event| event.event_type == EventType::StepCompleted as i32 && event.step_id == step)
            .count();
        assert_eq!(completions, 1, "step {step} completed once");
    }
    muster::inbox::wait_for_event(notifier, "watcher", &finished.event_id, Duration::from_secs(120)).await.unwrap();
    let notified = muster::inbox::all(notifier, "watcher").await.unwrap();
    let mut seen = HashSet::new();
    let mut inbox = Vec::new();
    for notification in &notified {
        let event = notification.event.as_ref().unwrap();
        if event.execution_id == execution_id {
            assert!(seen.insert(event.event_id.clone()), "event {} notified twice", event.event_id);
            inbox.push((notification.cursor, event.event_id.clone()));
        }
    }
    assert_eq!(seen.len(), events.len(), "the lead hears of every event of the run once");
    inbox
}

/// The memory files of `agent` hold exactly one line per event of the run
/// it heard of (`events`: every event, for the lead), by kind and step.
fn assert_one_memory_line_each(test: &TestCluster, agent: &str, execution_id: &str, events: &[StepEvent]) {
    let mut written: Vec<(String, String)> =
        muster_tests::ndjson_lines(&test.cluster().memory_dir().join(agent).join("events"))
            .iter()
            .filter(|line| line["execution_id"] == serde_json::json!(execution_id))
            .map(|line| {
                let text = |field: &str| line[field].as_str().unwrap_or_default().to_owned();
                (text("event_type"), text("step_id"))
            })
            .collect();
    let mut expected: Vec<(String, String)> = events
        .iter()
        .map(|event| {
            let kind = EventType::try_from(event.event_type).unwrap().as_str_name();
            (kind.trim_start_matches("EVENT_TYPE_").to_lowercase(), event.step_id.clone())
        })
        .collect();
    written.sort();
    expected.sort();
    assert_eq!(written.len(), expected.len(), "one memory line per notification");
    assert_eq!(written, expected, "a line for each event, none twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_dies_or_stops_hands_its_runs_over() {
    let environment = vec![("MUSTER_REPLICA_LEASE_MS".to_owned(), LEASE_MS.to_owned())];
    let Some(mut test) = TestCluster::start_with_environment(Backend::Postgres, environment).await else { return };
    let tokens = test.register_agents(&[agent("doer", "worker", "team"), agent("watcher", "worker", "team")]).await;
    let credentials: Vec<AgentCredential> = ["doer", "watcher"]
        .iter()
        .zip(tokens)
        .map(|(id, token)| AgentCredential { agent_id: (*id).to_owned(), token })
        .collect();
    let second = test.cluster_mut().add_replica("execution").await.unwrap();
    let second = Endpoint::new(format!("http://{second}"), test.cluster().credentials.operator_token.clone());
    // A worker on each replica, serving the same agents.
    let (stop_first, first_worker) = spawn_sample_worker(test.operator("execution"), credentials.clone());
    let (stop_second, second_worker) = spawn_sample_worker(second.clone(), credentials);

    // Kill -9 of the replica that drives the run, a third of the way in:
    // the other takes the run over when the lease lapses.
    let mut first = test.execution();
    let crashed = publish_and_start(&mut first, &chain_process("crashed", STEPS, "doer", "watcher", "{}")).await;
    wait_for_completed_steps(&mut first, &crashed, STEPS / 3).await;
    test.cluster_mut().kill("execution").await.unwrap();
    assert_completed_once(&test, &second, &crashed, STEPS).await;

    // The killed replica comes back (a new replica); a run it starts is
    // handed over at once when it stops gracefully.
    test.cluster_mut().restart("execution").await.unwrap();
    let mut first = test.execution();
    let stopped = publish_and_start(&mut first, &chain_process("stopped", STEPS, "doer", "watcher", "{}")).await;
    wait_for_completed_steps(&mut first, &stopped, STEPS / 3).await;
    let stopping = tokio::time::Instant::now();
    test.cluster_mut().stop("execution").await.unwrap();
    // Watched on the other replica from before it takes the run over.
    assert_completed_once(&test, &second, &stopped, STEPS).await;
    eprintln!("a run given back by a stopping replica finished {:?} after the stop began", stopping.elapsed());

    let _ = stop_first.send(());
    let _ = stop_second.send(());
    let _ = first_worker.await;
    second_worker.await.unwrap().unwrap();
    test.shutdown().await;
}

/// Polls (through `client`) until the step reaches `status`.
async fn wait_for_step(client: &mut ExecutionClient, execution_id: &str, step_id: &str, status: StepStatus) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let execution =
            client.get_execution(GetExecutionRequest { id: execution_id.to_owned() }).await.unwrap().into_inner();
        if execution.execution.unwrap().steps.iter().any(|step| step.step_id == step_id && step.status == status as i32)
        {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "step {step_id} never reached {status:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_about_a_run_reach_the_replica_that_drives_it() {
    let Some(mut test) = TestCluster::start(Backend::Postgres).await else { return };
    let tokens = test.register_agents(&[agent("doer", "worker", "team"), agent("boss", "worker", "team")]).await;
    let boss = tokens[1].clone();
    let credentials = vec![AgentCredential { agent_id: "doer".to_owned(), token: tokens[0].clone() }];
    let (stop, worker) = spawn_sample_worker(test.operator("execution"), credentials);
    let second = test.cluster_mut().add_replica("execution").await.unwrap();
    let second = Endpoint::new(format!("http://{second}"), test.cluster().credentials.operator_token.clone());
    let mut on_second: ExecutionClient = ExecutionServiceClient::new(second.channel().unwrap());
    let source = |name: &str| {
        format!(
            "name: {name}\nsteps:\n  - id: prepare\n    type: agent_task\n    agent: doer\n    message: prepare\n  - id: sign-off\n    type: human_approval\n    title: Sign off\n    depends_on: [prepare]\n    roles:\n      executor: boss\n  - id: ship\n    type: agent_task\n    agent: doer\n    message: ship\n    depends_on: [sign-off]\n"
        )
    };

    // Started on the first replica, approved through the second.
    let mut on_first = test.execution();
    let approved = publish_and_start(&mut on_first, &source("approved")).await;
    wait_for_step(&mut on_second, &approved, "sign-off", StepStatus::WaitingApproval).await;
    let decision = |execution_id: &str| SubmitApprovalRequest {
        execution_id: execution_id.to_owned(),
        step_id: "sign-off".to_owned(),
        approved: true,
        comment: "ship it".to_owned(),
    };
    // A call another replica handed over is answered where it arrives.
    let mut handed = as_agent(decision(&approved), &boss);
    handed.metadata_mut().insert("x-muster-handed-over-by", "elsewhere".parse().unwrap());
    let refused = on_second.submit_approval(handed).await.expect_err("not handed on twice");
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    // The approver's own rights apply on the replica that drives the run.
    let denied = on_second.submit_approval(decision(&approved)).await.expect_err("operators do not decide");
    assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied:?}");
    let step =
        on_second.submit_approval(as_agent(decision(&approved), &boss)).await.unwrap().into_inner().step.unwrap();
    assert_eq!((step.status, step.executor.as_str()), (StepStatus::Completed as i32, "boss"));
    let events = events_until_finished(&second, &approved).await;
    assert_eq!(events.last().unwrap().execution_status, ExecutionStatus::Completed as i32);

    // Started on the first replica, cancelled through the second.
    let cancelled = publish_and_start(&mut on_first, &source("cancelled")).await;
    wait_for_step(&mut on_second, &cancelled, "sign-off", StepStatus::WaitingApproval).await;
    let execution = on_second
        .cancel_execution(CancelExecutionRequest { id: cancelled.clone(), reason: "changed our minds".to_owned() })
        .await
        .unwrap()
        .into_inner()
        .execution
        .unwrap();
    assert_eq!(execution.status, ExecutionStatus::Cancelled as i32);

    let _ = stop.send(());
    worker.await.unwrap().unwrap();
    test.shutdown().await;
}

/// Waits until `client`'s replica lists a worker offered by another replica; it.
async fn relayed_worker(client: &mut ExecutionClient) -> WorkerInfo {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let workers = client.list_workers(ListWorkersRequest::default()).await.unwrap().into_inner().workers;
        if let Some(worker) = workers.into_iter().find(|worker| !worker.relayed_by.is_empty()) {
            return worker;
        }
        assert!(tokio::time::Instant::now() < deadline, "no replica offered its workers");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_on_one_replica_serve_the_runs_of_another() {
    const RELAYED_STEPS: usize = 300;
    let environment = vec![("MUSTER_REPLICA_LEASE_MS".to_owned(), LEASE_MS.to_owned())];
    let Some(mut test) = TestCluster::start_with_environment(Backend::Postgres, environment).await else { return };
    let writer =
        RoleDefinition { name: "writer".to_owned(), tools: vec!["word_count".to_owned()], ..Default::default() };
    test.roster().put_role_definition(PutRoleDefinitionRequest { role: Some(writer) }).await.unwrap();
    let tokens = test
        .register_agents(&[
            Agent { allow_delegation: true, ..agent("doer", "writer", "team") },
            agent("watcher", "worker", "team"),
            Agent { allow_delegation: true, ..agent("helper", "worker", "team") },
        ])
        .await;
    let credentials = vec![
        AgentCredential { agent_id: "doer".to_owned(), token: tokens[0].clone() },
        AgentCredential { agent_id: "helper".to_owned(), token: tokens[2].clone() },
    ];
    let second = test.cluster_mut().add_replica("execution").await.unwrap();
    let second = Endpoint::new(format!("http://{second}"), test.cluster().credentials.operator_token.clone());
    let mut on_second: ExecutionClient = ExecutionServiceClient::new(second.channel().unwrap());
    // The only worker connects to the first replica; the second sees it as
    // a worker the first offers.
    let (stop, worker) = spawn_sample_worker(test.operator("execution"), credentials);
    let offered = relayed_worker(&mut on_second).await;
    assert_eq!(offered.agents, ["doer", "helper"]);
    assert!(offered.tools.contains(&"word_count".to_owned()), "{:?}", offered.tools);

    // A tool provided on the first replica, invoked through the second.
    let request = InvokeToolRequest {
        tool: "word_count".to_owned(),
        input: muster_tests::object(r#"{"text": "counted one replica away"}"#),
        execution_id: String::new(),
    };
    let output = on_second.invoke_tool(as_agent(request, &tokens[0])).await.unwrap().into_inner().output.unwrap();
    assert_eq!((output.status_code, output.error.as_str()), (200, ""));
    assert_eq!(muster_tests::json_of(&output.output), serde_json::json!({"words": 4}));

    // A worker hands a relayed step onward, and hears the answers: doer's
    // hand-off to helper is accepted, helper's back to doer refused (a loop).
    let source = "name: handed\nsteps:\n  - id: handed\n    type: agent_task\n    agent: doer\n    message: pass it on\n    inputs: {delegate: {doer: helper, helper: doer}}\n";
    let handed = publish_and_start(&mut on_second, source).await;
    let events = events_until_finished(&second, &handed).await;
    assert_eq!(events.last().unwrap().execution_status, ExecutionStatus::Completed as i32);
    let execution =
        on_second.get_execution(GetExecutionRequest { id: handed }).await.unwrap().into_inner().execution.unwrap();
    let step = &execution.steps[0];
    assert_eq!(step.executor, "helper");
    let output: serde_json::Value = muster_tests::json_of(&step.output);
    assert_eq!(output["delegation_refused"], "delegation loop: doer -> helper -> doer; the step stays with helper");

    // A run the second replica drives, whose steps all go to the worker on
    // the first; that replica is killed (kill -9) a third of the way in and
    // comes back: the worker connects again and the run completes, each
    // step once.
    let relayed =
        publish_and_start(&mut on_second, &chain_process("relayed", RELAYED_STEPS, "doer", "watcher", "{}")).await;
    wait_for_completed_steps(&mut on_second, &relayed, RELAYED_STEPS / 3).await;
    test.cluster_mut().kill("execution").await.unwrap();
    test.cluster_mut().restart("execution").await.unwrap();
    assert_completed_once(&test, &second, &relayed, RELAYED_STEPS).await;
    // The relayed assignments carried their shared memory whole: the last
    // step saw the latest hundred outputs of the steps before it.
    let execution =
        on_second.get_execution(GetExecutionRequest { id: relayed }).await.unwrap().into_inner().execution.unwrap();
    let last: serde_json::Value = muster_tests::json_of(&execution.steps.last().unwrap().output);
    assert_eq!(last["memory_steps"], 100, "{last}");
    assert_eq!(last["memory_keys"][0], format!("s{}", RELAYED_STEPS - 101), "{last}");

    let _ = stop.send(());
    worker.await.unwrap().unwrap();
    test.shutdown().await;
}

/// A live subscription's notifications of one run, in the order they came,
/// until the run's last event arrives.
async fn subscribe_until(
    notifier: Endpoint,
    agent_id: &str,
    last_event: tokio::sync::watch::Receiver<Option<String>>,
) -> tokio::task::JoinHandle<Vec<(u64, String)>> {
    let mut stream = NotifierServiceClient::new(notifier.channel().unwrap())
        .subscribe(SubscribeRequest { agent_id: agent_id.to_owned(), after_cursor: 0 })
        .await
        .unwrap()
        .into_inner();
    let mut last_event = last_event;
    tokio::spawn(async move {
        let mut received: Vec<(u64, String)> = Vec::new();
        loop {
            // The last event may have arrived before it was known to be the last.
            let known_last = last_event.borrow_and_update().clone();
            if known_last.is_some_and(|last| received.iter().any(|(_, event_id)| *event_id == last)) {
                return received;
            }
            let frame = tokio::select! {
                frame = tokio::time::timeout(Duration::from_secs(120), stream.message()) => frame
                    .expect("notifications keep coming")
                    .expect("the subscription holds")
                    .expect("the stream stays open"),
                _ = last_event.changed() => continue,
            };
            let Some(subscribe_response::Message::Notification(notification)) = frame.message else {
                panic!("the subscriber fell behind: {frame:?}");
            };
            received.push((notification.cursor, notification.event.unwrap().event_id));
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifier_replicas_share_inboxes_live_delivery_and_memory_files() {
    const RUN_STEPS: usize = 300;
    let Some(mut test) = TestCluster::start(Backend::Postgres).await else { return };
    let tokens = test.register_agents(&[agent("doer", "worker", "team"), agent("watcher", "worker", "team")]).await;
    let credentials = vec![AgentCredential { agent_id: "doer".to_owned(), token: tokens[0].clone() }];
    let operator = test.cluster().credentials.operator_token.clone();
    let second = test.cluster_mut().add_replica("notifier").await.unwrap();
    let third = test.cluster_mut().add_replica("notifier").await.unwrap();
    // The execution service sends its events to any of the three.
    let first = test.cluster().service("notifier").url();
    test.cluster_mut().set_environment("MUSTER_NOTIFIER_URL", &format!("{first},http://{second},http://{third}"));
    test.cluster_mut().stop("execution").await.unwrap();
    test.cluster_mut().restart("execution").await.unwrap();
    let (stop, worker) = spawn_sample_worker(test.operator("execution"), credentials);

    // The watcher subscribes on the second and the third replica.
    let (last_event, last_event_seen) = tokio::sync::watch::channel(None);
    let on_second =
        subscribe_until(Endpoint::new(format!("http://{second}"), &operator), "watcher", last_event_seen.clone()).await;
    let on_third =
        subscribe_until(Endpoint::new(format!("http://{third}"), &operator), "watcher", last_event_seen).await;

    // The first replica is killed (kill -9) a third of the way in.
    let mut client = test.execution();
    let run = publish_and_start(&mut client, &chain_process("noticed", RUN_STEPS, "doer", "watcher", "{}")).await;
    wait_for_completed_steps(&mut client, &run, RUN_STEPS / 3).await;
    test.cluster_mut().kill("notifier").await.unwrap();
    let events = events_until_finished(&test.operator("execution"), &run).await;
    assert_eq!(events.last().unwrap().execution_status, ExecutionStatus::Completed as i32);
    let _ = last_event.send(Some(events.last().unwrap().event_id.clone()));

    // The inbox holds every event of the run once, and each surviving
    // replica's subscriber received exactly the inbox, in cursor order.
    let second_endpoint = Endpoint::new(format!("http://{second}"), &operator);
    let last = events.last().unwrap().event_id.clone();
    muster::inbox::wait_for_event(&second_endpoint, "watcher", &last, Duration::from_secs(60)).await.unwrap();
    let inbox: Vec<(u64, String)> = muster::inbox::all(&second_endpoint, "watcher")
        .await
        .unwrap()
        .into_iter()
        .map(|notification| (notification.cursor, notification.event.unwrap().event_id))
        .collect();
    let expected: HashSet<&str> = events.iter().map(|event| event.event_id.as_str()).collect();
    let stored: HashSet<&str> = inbox.iter().map(|(_, event_id)| event_id.as_str()).collect();
    assert_eq!(stored, expected, "the lead hears of every event of the run");
    assert_eq!(inbox.len(), expected.len(), "and of each once");
    for subscriber in [on_second, on_third] {
        let received = tokio::time::timeout(Duration::from_secs(60), subscriber).await.unwrap().unwrap();
        assert_eq!(received, inbox, "a subscriber on a surviving replica misses nothing and repeats nothing");
    }

    // The memory files, written by whichever replica stored each batch,
    // hold one line per notification.
    assert_one_memory_line_each(&test, "watcher", &run, &events);

    let _ = stop.send(());
    worker.await.unwrap().unwrap();
    test.shutdown().await;
}

/// An endpoint for each replica of a service, as the operator.
fn replicas_of(test: &TestCluster, service: &str) -> Vec<Endpoint> {
    let operator = &test.cluster().credentials.operator_token;
    test.cluster().replica_urls(service).split(',').map(|url| Endpoint::new(url, operator)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_of_each_service_lose_nothing_to_a_crash_or_a_rolling_restart() {
    const RUN_STEPS: usize = 1000;
    let environment = vec![("MUSTER_REPLICA_LEASE_MS".to_owned(), LEASE_MS.to_owned())];
    let Some(mut test) = TestCluster::start_with_environment(Backend::Postgres, environment).await else { return };
    let tokens = test.register_agents(&[agent("doer", "worker", "team"), agent("watcher", "worker", "team")]).await;
    let credentials = vec![AgentCredential { agent_id: "doer".to_owned(), token: tokens[0].clone() }];

    // Three of each; every client balances over every replica of what it calls.
    let cluster = test.cluster_mut();
    for service in ["roster", "validator", "notifier"] {
        for _ in 0..2 {
            cluster.add_replica(service).await.unwrap();
        }
    }
    let (rosters, notifiers) = (cluster.replica_urls("roster"), cluster.replica_urls("notifier"));
    cluster.set_environment("MUSTER_ROSTER_URL", &rosters);
    cluster.set_environment("MUSTER_NOTIFIER_URL", &notifiers);
    for (service, count) in [("validator", 3), ("notifier", 3), ("execution", 1)] {
        for index in 0..count {
            cluster.stop_replica(service, index).await.unwrap();
            cluster.restart_replica(service, index).await.unwrap();
        }
    }
    for _ in 0..2 {
        cluster.add_replica("execution").await.unwrap();
    }
    let executions = replicas_of(&test, "execution");
    let notifiers = replicas_of(&test, "notifier");
    // A worker on each execution replica, serving the same agent.
    let workers: Vec<_> =
        executions.iter().map(|replica| spawn_sample_worker(replica.clone(), credentials.clone())).collect();

    // The watcher subscribes on the notifier replicas that will survive.
    let (last_event, last_event_seen) = tokio::sync::watch::channel(None);
    let mut subscribers = Vec::new();
    for notifier in &notifiers[1..] {
        subscribers.push(subscribe_until(notifier.clone(), "watcher", last_event_seen.clone()).await);
    }

    // A third of the way in, the first replica of every service is killed
    // (kill -9), among them the execution replica driving the run.
    let mut first = test.execution();
    let mut second: ExecutionClient = ExecutionServiceClient::new(executions[1].channel().unwrap());
    let crashed = publish_and_start(&mut first, &chain_process("crashed", RUN_STEPS, "doer", "watcher", "{}")).await;
    wait_for_completed_steps(&mut second, &crashed, RUN_STEPS / 3).await;
    for service in ["roster", "validator", "notifier", "execution"] {
        test.cluster_mut().kill_replica(service, 0).await.unwrap();
    }
    let inbox = assert_completed_once_through(&notifiers[1], &executions[1], &crashed, RUN_STEPS).await;
    let events = events_until_finished(&executions[1], &crashed).await;
    let _ = last_event.send(Some(events.last().unwrap().event_id.clone()));
    for subscriber in subscribers {
        let received = tokio::time::timeout(Duration::from_secs(60), subscriber).await.unwrap().unwrap();
        let received: Vec<(u64, String)> =
            received.into_iter().filter(|(cursor, _)| inbox.iter().any(|(known, _)| known == cursor)).collect();
        assert_eq!(received, inbox, "a subscriber on a surviving replica misses nothing and repeats nothing");
    }
    assert_one_memory_line_each(&test, "watcher", &crashed, &events);

    // The killed replicas come back; then every replica of every service
    // restarts, one at a time, during a second run.
    for service in ["roster", "validator", "notifier", "execution"] {
        test.cluster_mut().restart_replica(service, 0).await.unwrap();
    }
    let rolled = publish_and_start(&mut second, &chain_process("rolled", RUN_STEPS, "doer", "watcher", "{}")).await;
    wait_for_completed_steps(&mut second, &rolled, 50).await;
    for service in ["roster", "validator", "notifier", "execution"] {
        for index in 0..3 {
            test.cluster_mut().stop_replica(service, index).await.unwrap();
            test.cluster_mut().restart_replica(service, index).await.unwrap();
        }
    }
    assert_completed_once_through(&notifiers[2], &executions[2], &rolled, RUN_STEPS).await;
    let events = events_until_finished(&executions[2], &rolled).await;
    assert_one_memory_line_each(&test, "watcher", &rolled, &events);

    for (stop, worker) in workers {
        let _ = stop.send(());
        let _ = worker.await;
    }
    test.shutdown().await;
}

/// Posts to one inbox through two replicas at the same instant: the run
/// each post triggers is decided in one replica, but its claim of the
/// messages is checked in the database, so a replica whose run would take
/// a message another replica's run took first starts no run. Every message
/// is in exactly one run, which completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simultaneous_posts_through_two_replicas_run_each_message_once() {
    const ROUNDS: usize = 4;
    const POSTS_PER_ROUND: usize = 8;
    let Some(mut test) = TestCluster::start(Backend::Postgres).await else { return };
    let tokens = test.register_agents(&[agent("reviewer", "worker", "team")]).await;
    let credentials = vec![AgentCredential { agent_id: "reviewer".to_owned(), token: tokens[0].clone() }];
    let second = test.cluster_mut().add_replica("execution").await.unwrap();
    let second = Endpoint::new(format!("http://{second}"), test.cluster().credentials.operator_token.clone());
    let (stop_first, first_worker) = spawn_sample_worker(test.operator("execution"), credentials.clone());
    let (stop_second, second_worker) = spawn_sample_worker(second.clone(), credentials);
    let source = "name: review\ntriggers: {inbox: race}\nsteps:\n  - {id: read, type: agent_task, agent: reviewer, message: read them}\n";
    let mut first = test.execution();
    first.publish_process(PublishProcessRequest { source: source.to_owned(), file_name: String::new() }).await.unwrap();
    let replicas = [test.operator("execution"), second.clone()];

    let mut posted = Vec::new();
    for round in 0..ROUNDS {
        let mut posts = tokio::task::JoinSet::new();
        for index in 0..POSTS_PER_ROUND {
            let mut client: ExecutionClient = ExecutionServiceClient::new(replicas[index % 2].channel().unwrap());
            let request = PostToInboxRequest {
                inbox: "race".to_owned(),
                body: format!("round {round}, post {index}"),
                ..Default::default()
            };
            posts.spawn(async move { client.post_to_inbox(request).await.unwrap().into_inner().message.unwrap().id });
        }
        while let Some(id) = posts.join_next().await {
            posted.push(id.unwrap());
        }
    }

    // Every message is processed, in time.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let messages = loop {
        let request = ListInboxMessagesRequest { inbox: "race".to_owned(), page_size: 100, ..Default::default() };
        let messages = first.list_inbox_messages(request).await.unwrap().into_inner().messages;
        if messages.len() == posted.len()
            && messages.iter().all(|message| message.state == MessageState::Processed as i32)
        {
            break messages;
        }
        assert!(tokio::time::Instant::now() < deadline, "messages left unprocessed: {messages:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    // Each in the inputs of exactly one run, the one that processed it.
    let request = ListExecutionsRequest { process_name: "review".to_owned(), limit: 100, ..Default::default() };
    let runs = first.list_executions(request).await.unwrap().into_inner().executions;
    let mut runs_of: HashMap<String, Vec<String>> = HashMap::new();
    for run in &runs {
        let run = first.get_execution(GetExecutionRequest { id: run.id.clone() }).await.unwrap().into_inner();
        let run = run.execution.unwrap();
        assert_eq!(run.status, ExecutionStatus::Completed as i32, "run {} completed", run.id);
        let inputs = prost_types::Value { kind: Some(prost_types::value::Kind::StructValue(run.inputs.unwrap())) };
        for message in muster_tests::json_of(&Some(inputs))["inbox_messages"].as_array().unwrap() {
            runs_of.entry(message["id"].as_str().unwrap().to_owned()).or_default().push(run.id.clone());
        }
    }
    let twice: Vec<_> = runs_of.iter().filter(|(_, runs)| runs.len() > 1).collect();
    assert_eq!(twice, Vec::<(&String, &Vec<String>)>::new(), "messages in more than one run");
    for message in &messages {
        assert_eq!(runs_of.get(&message.id), Some(&vec![message.processed_by_execution_id.clone()]), "{message:?}");
    }
    eprintln!("{} messages in {} runs", messages.len(), runs.len());

    let _ = stop_first.send(());
    let _ = stop_second.send(());
    let _ = first_worker.await;
    let _ = second_worker.await;
    test.shutdown().await;
}
