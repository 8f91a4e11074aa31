//! Every service serves Prometheus metrics at `/metrics` on its gRPC port, and
//! the gauges follow the roster's delegation queue and the notifier's live
//! subscribers.

use std::time::Duration;

use muster::worker::AgentCredential;
use muster_proto::{
    common::v1::{EventType, ExecutionStatus, StepEvent, StepRoles},
    execution::v1::{GetExecutionRequest, PublishProcessRequest, StartExecutionRequest, WatchExecutionRequest},
    notifier::v1::{
        IngestEventsRequest, ListNotificationsRequest, SubscribeRequest, notifier_service_client::NotifierServiceClient,
    },
    roster::v1::{Agent, AgentStatus, DecisionKind, DelegateRequest, ReleaseTaskRequest, SetAgentStatusRequest},
    validator::v1::{ValidateProcessRequest, validator_service_client::ValidatorServiceClient},
};
use muster_tests::{Backend, TestCluster, spawn_sample_worker};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A plain HTTP/1.1 GET, as Prometheus scrapes.
async fn scrape(url: &str) -> String {
    let address = url.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    stream
        .write_all(format!("GET /metrics HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.contains("application/openmetrics-text; version=1.0.0"), "{response}");
    assert!(response.ends_with("# EOF\n"), "{response}");
    response
}

/// The value of one series (name and labels exactly as rendered) in a scrape.
fn gauge(scraped: &str, series: &str) -> Option<f64> {
    scraped.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// Scrapes `url` until `series` has `expected`, for up to ten seconds.
async fn wait_for_gauge(url: &str, series: &str, expected: f64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let scraped = scrape(url).await;
        if gauge(&scraped, series) == Some(expected) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{series} never became {expected}:\n{scraped}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_service_serves_its_metrics() {
    let Some(test) = TestCluster::start(Backend::Sqlite).await else { return };
    let member = |id: &str| Agent {
        id: id.to_owned(),
        name: id.to_owned(),
        team: "core".to_owned(),
        expertise: vec!["rust".to_owned()],
        ..Default::default()
    };
    let tokens = test.register_agents(&[member("lead"), member("dev")]).await;
    let credentials = vec![
        AgentCredential { agent_id: "lead".to_owned(), token: tokens[0].clone() },
        AgentCredential { agent_id: "dev".to_owned(), token: tokens[1].clone() },
    ];
    let (stop, worker) = spawn_sample_worker(test.operator("execution"), credentials);
    let mut client = test.execution();
    let source = "name: measured\nlead: lead\nsteps:\n  - id: named\n    type: agent_task\n    agent: dev\n    message: m\n    roles: {executor: dev, informed: [lead]}\n  - id: broken\n    type: agent_task\n    agent: dev\n    message: m\n    inputs: {fail: no}\n  - id: delegated\n    type: agent_task\n    message: m\n    delegate: {expertise: [rust], team: core}\n";
    // Checked with the validator, as a client would, then published.
    ValidatorServiceClient::new(test.operator("validator").channel().unwrap())
        .validate_process(ValidateProcessRequest { source: source.to_owned(), ..Default::default() })
        .await
        .unwrap();
    client
        .publish_process(PublishProcessRequest { source: source.to_owned(), file_name: String::new() })
        .await
        .unwrap();
    let execution = client
        .start_execution(StartExecutionRequest { process_name: "measured".to_owned(), ..Default::default() })
        .await
        .unwrap()
        .into_inner()
        .execution
        .unwrap();
    let mut events = client
        .watch_execution(WatchExecutionRequest { execution_id: execution.id, after_sequence: 0 })
        .await
        .unwrap()
        .into_inner();
    while let Some(message) = events.message().await.unwrap() {
        let event = message.event.unwrap();
        if event.event_type == EventType::ExecutionFinished as i32 {
            assert_eq!(event.execution_status, ExecutionStatus::Failed as i32);
            break;
        }
    }

    // A refusal is counted under its canonical code name.
    let missing = client.get_execution(GetExecutionRequest { id: "no-such-execution".to_owned() }).await.unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound);

    let execution = scrape(&test.cluster().execution_url()).await;
    for expected in [
        "muster_rpc_requests_total{method=\"/muster.execution.v1.ExecutionService/GetExecution\",code=\"NOT_FOUND\"} 1",
        // The standard gRPC server metrics.
        "grpc_server_handled_total{grpc_type=\"unary\",grpc_service=\"muster.execution.v1.ExecutionService\",grpc_method=\"GetExecution\",grpc_code=\"NotFound\"} 1",
        "grpc_server_started_total{grpc_type=\"server_stream\",grpc_service=\"muster.execution.v1.ExecutionService\",grpc_method=\"WatchExecution\"} 1",
        "grpc_server_handling_seconds_count{grpc_type=\"unary\",grpc_service=\"muster.execution.v1.ExecutionService\",grpc_method=\"PublishProcess\"} 1",
        "muster_execution_outbox_events ",
        "# TYPE muster_steps counter",
        "muster_steps_total{outcome=\"completed\"} 2",
        "muster_steps_total{outcome=\"failed\"} 1",
        // Runs by process and how they ended.
        // The execution service's own calls of the roster, as a client.
        "grpc_client_started_total{grpc_type=\"bidi_stream\",grpc_service=\"muster.roster.v1.RosterService\",grpc_method=\"PlaceTasks\"} ",
        "grpc_client_started_total{grpc_type=\"bidi_stream\",grpc_service=\"muster.notifier.v1.NotifierService\",grpc_method=\"IngestEvents\"} ",
        "# TYPE grpc_client_handling_seconds histogram",
        "muster_process_runs_total{process=\"measured\",status=\"failed\"} 1",
        "muster_process_run_duration_seconds_count{process=\"measured\",status=\"failed\"} 1",
        "muster_process_run_duration_seconds_bucket{le=\"14400.0\",process=\"measured\",status=\"failed\"} 1",
        "muster_rpc_requests_total{method=\"/muster.execution.v1.ExecutionService/StartExecution\",code=\"OK\"} 1",
        "# TYPE muster_rpc_duration_seconds histogram",
        "muster_build_info{version=\"0.1.0\"} 1",
        "# TYPE process_cpu_seconds counter",
        "muster_executions_running 0",
        "muster_execution_workers 1",
        "muster_rpc_duration_seconds_count{method=\"/muster.execution.v1.ExecutionService/PublishProcess\",code=\"OK\"} 1",
    ] {
        assert!(execution.contains(expected), "{expected} missing from:\n{execution}");
    }
    // Every step went to the worker as soon as it was ready: each sending timed.
    let dispatched = gauge(&execution, "muster_execution_step_dispatch_seconds_count").unwrap_or_default();
    assert!(dispatched >= 3.0, "{dispatched} steps' dispatch timed:\n{execution}");
    let roster = scrape(&test.cluster().roster_url()).await;
    assert!(roster.contains("muster_delegation_decisions_total{tier=\""), "{roster}");
    assert!(
        roster.contains(
            "muster_rpc_requests_total{method=\"/muster.roster.v1.RosterService/RegisterAgent\",code=\"OK\"} 2"
        ),
        "{roster}"
    );
    let validator = scrape(&test.cluster().validator_url()).await;
    assert!(validator.contains("/muster.validator.v1.ValidatorService/ValidateProcess"), "{validator}");
    for scraped in [&execution, &roster, &validator] {
        let resident = gauge(scraped, "process_resident_memory_bytes").expect("process_resident_memory_bytes");
        assert!(resident > 1_000_000.0, "{resident} bytes resident");
        assert!(gauge(scraped, "process_open_fds").is_some_and(|open| open > 0.0), "{scraped}");
    }
    // The notifier's count grows as the outbox drains: wait for the lead's notifications.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let notifier = scrape(&test.cluster().notifier_url()).await;
        if notifier.contains("# TYPE muster_notifications counter") && notifier.contains("muster_events_ingested_total")
        {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{notifier}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // Notifications handed to the lead, counted by how they were read.
    let mut notifier = test.notifier();
    let listed = notifier
        .list_notifications(ListNotificationsRequest { agent_id: "lead".to_owned(), ..Default::default() })
        .await
        .unwrap()
        .into_inner()
        .notifications;
    assert!(!listed.is_empty());
    let scraped = scrape(&test.cluster().notifier_url()).await;
    let delivered = |scraped: &str, via: &str| {
        gauge(scraped, &format!("muster_notifications_delivered_total{{via=\"{via}\"}}")).unwrap_or(0.0)
    };
    assert_eq!(delivered(&scraped, "list"), listed.len() as f64, "{scraped}");
    let mut stream = notifier
        .subscribe(SubscribeRequest { agent_id: "lead".to_owned(), after_cursor: 0 })
        .await
        .unwrap()
        .into_inner();
    for _ in &listed {
        stream.message().await.unwrap().unwrap();
    }
    // Counted once handed to the stream, which may be just after the client read it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let scraped = scrape(&test.cluster().notifier_url()).await;
        if delivered(&scraped, "backlog") + delivered(&scraped, "live") >= listed.len() as f64 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{} read, {scraped}", listed.len());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(stream);

    let _ = stop.send(());
    worker.await.unwrap().unwrap();
    test.shutdown().await;
}

const QUEUED: &str = "muster_roster_queued_tasks";
const SUBSCRIBERS: &str = "muster_notifier_subscribers";
const WATCHER_LAG: &str = "muster_notifier_subscriber_lag{agent_id=\"watcher\"}";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gauges_follow_the_delegation_queue_and_the_live_subscribers() {
    // A sweeper fast enough for the escalation below, slow enough that the
    // gauge after each call shows the call's own refresh, not a sweep's.
    let environment = vec![("MUSTER_ROSTER_QUEUE_SWEEP_INTERVAL_MS".to_owned(), "1000".to_owned())];
    let Some(mut test) = TestCluster::start_with_environment(Backend::Sqlite, environment).await else { return };
    let boss = Agent {
        id: "boss".to_owned(),
        name: "Boss".to_owned(),
        team: "core".to_owned(),
        expertise: vec!["management".to_owned()],
        ..Default::default()
    };
    // The only go expert, with one slot: a second go task waits for it.
    let solo = Agent {
        id: "solo".to_owned(),
        name: "Solo".to_owned(),
        team: "core".to_owned(),
        senior_id: "boss".to_owned(),
        expertise: vec!["go".to_owned()],
        workload_capacity: 1,
        ..Default::default()
    };
    test.register_agents(&[boss, solo]).await;
    let roster_url = test.cluster().roster_url();
    let mut roster = test.roster();
    let go_task = |task_id: &str| DelegateRequest {
        task_id: task_id.to_owned(),
        requester_id: "boss".to_owned(),
        required_expertise: vec!["go".to_owned()],
        ..Default::default()
    };
    let decision = |response: tonic::Response<muster_proto::roster::v1::DelegateResponse>| {
        DecisionKind::try_from(response.into_inner().decision.unwrap().decision).unwrap()
    };
    assert_eq!(gauge(&scrape(&roster_url).await, QUEUED), Some(0.0), "set at startup");

    assert_eq!(decision(roster.delegate(go_task("first")).await.unwrap()), DecisionKind::Delegate);
    assert_eq!(decision(roster.delegate(go_task("second")).await.unwrap()), DecisionKind::Queue);
    assert_eq!(gauge(&scrape(&roster_url).await, QUEUED), Some(1.0), "a delegation that queues");
    let dry_run = DelegateRequest { dry_run: true, ..go_task("third") };
    assert_eq!(decision(roster.delegate(dry_run).await.unwrap()), DecisionKind::Queue);
    assert_eq!(gauge(&scrape(&roster_url).await, QUEUED), Some(1.0), "a dry run queues nothing");

    // A new process starts from the queue in the database.
    test.cluster_mut().stop("roster").await.unwrap();
    test.cluster_mut().restart("roster").await.unwrap();
    assert_eq!(gauge(&scrape(&roster_url).await, QUEUED), Some(1.0), "after a restart");
    roster = test.roster();

    // The freed slot goes to the queued task.
    roster.release_task(ReleaseTaskRequest { task_id: "first".to_owned() }).await.unwrap();
    assert_eq!(gauge(&scrape(&roster_url).await, QUEUED), Some(0.0), "resolved when a slot freed");
    // A task released while queued leaves the queue.
    assert_eq!(decision(roster.delegate(go_task("withdrawn")).await.unwrap()), DecisionKind::Queue);
    assert_eq!(gauge(&scrape(&roster_url).await, QUEUED), Some(1.0));
    roster.release_task(ReleaseTaskRequest { task_id: "withdrawn".to_owned() }).await.unwrap();
    assert_eq!(gauge(&scrape(&roster_url).await, QUEUED), Some(0.0), "released while queued");
    // The sweeper escalates what waits for an expert who went offline.
    assert_eq!(decision(roster.delegate(go_task("escalated")).await.unwrap()), DecisionKind::Queue);
    assert_eq!(gauge(&scrape(&roster_url).await, QUEUED), Some(1.0));
    roster
        .set_agent_status(SetAgentStatusRequest {
            id: "solo".to_owned(),
            status: AgentStatus::Offline as i32,
            availability_until: None,
        })
        .await
        .unwrap();
    wait_for_gauge(&roster_url, QUEUED, 0.0).await;

    // Live subscribers: a watcher that reads nothing yet, through a flow-control
    // window so small that the notifier soon cannot write to its stream.
    let notifier_url = test.cluster().notifier_url();
    let scraped = scrape(&notifier_url).await;
    assert_eq!(gauge(&scraped, SUBSCRIBERS), Some(0.0), "{scraped}");
    assert_eq!(gauge(&scraped, WATCHER_LAG), None, "{scraped}");
    let narrow = tonic::transport::Endpoint::from_shared(notifier_url.clone())
        .unwrap()
        .initial_stream_window_size(1024)
        .connect()
        .await
        .unwrap();
    let narrow = muster_runtime::auth::client::with_credentials(
        narrow,
        muster_runtime::auth::client::Credentials::bearer(&test.cluster().credentials.operator_token).unwrap(),
    );
    let mut stream = NotifierServiceClient::new(narrow)
        .subscribe(SubscribeRequest { agent_id: "watcher".to_owned(), after_cursor: 0 })
        .await
        .unwrap()
        .into_inner();
    wait_for_gauge(&notifier_url, SUBSCRIBERS, 1.0).await;
    assert_eq!(gauge(&scrape(&notifier_url).await, WATCHER_LAG), Some(0.0), "nothing created for it yet");

    // Fewer than a subscriber's buffer (4096), so it is not cut off.
    const EVENTS: usize = 3000;
    let events = (0..EVENTS).map(|index| IngestEventsRequest {
        event: Some(StepEvent {
            event_id: format!("lag-{index}"),
            event_type: EventType::StepCompleted as i32,
            occurred_at: Some(muster_runtime::time::to_timestamp(muster_runtime::time::now_millis())),
            execution_id: "lagging-execution".to_owned(),
            step_id: format!("s{index}"),
            roles: Some(StepRoles {
                executor: "solo".to_owned(),
                monitors: vec!["watcher".to_owned()],
                ..Default::default()
            }),
            ..Default::default()
        }),
    });
    let mut acks = test
        .notifier_as(&test.service_token("execution"))
        .ingest_events(tokio_stream::iter(events.collect::<Vec<_>>()))
        .await
        .unwrap()
        .into_inner();
    for _ in 0..EVENTS {
        assert_eq!(acks.message().await.unwrap().unwrap().notifications, 1);
    }
    // Every notification was handed to the watcher's subscription before its
    // event was acknowledged; the stream could take only what its window, the
    // response stream's buffer and one encoded chunk hold.
    let scraped = scrape(&notifier_url).await;
    let lag = gauge(&scraped, WATCHER_LAG).unwrap_or_else(|| panic!("no lag for the watcher:\n{scraped}"));
    assert!((EVENTS as f64 / 2.0..=EVENTS as f64).contains(&lag), "lag {lag} of {EVENTS}:\n{scraped}");

    for index in 0..EVENTS {
        let message = stream.message().await.unwrap().unwrap();
        assert!(message.message.is_some(), "notification {index}");
    }
    wait_for_gauge(&notifier_url, WATCHER_LAG, 0.0).await;
    assert_eq!(gauge(&scrape(&notifier_url).await, SUBSCRIBERS), Some(1.0));
    drop(stream);
    wait_for_gauge(&notifier_url, SUBSCRIBERS, 0.0).await;
    assert_eq!(gauge(&scrape(&notifier_url).await, WATCHER_LAG), Some(0.0), "an agent gone has no lag");

    test.shutdown().await;
}
