//! Every service serves Prometheus metrics at `/metrics` on its gRPC port.

use muster::worker::AgentCredential;
use muster_proto::{
    common::v1::{EventType, ExecutionStatus},
    execution::v1::{
        PublishProcessRequest, StartExecutionRequest, WatchExecutionRequest,
        execution_service_client::ExecutionServiceClient,
    },
    roster::v1::Agent,
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
    assert!(response.contains("text/plain; version=0.0.4"), "{response}");
    response
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
    let (stop, worker) = spawn_sample_worker(test.cluster().execution_url(), credentials);
    let mut client = ExecutionServiceClient::connect(test.cluster().execution_url()).await.unwrap();
    let source = "name: measured\nlead: lead\nsteps:\n  - id: named\n    type: agent_task\n    agent: dev\n    message: m\n    roles: {executor: dev, informed: [lead]}\n  - id: broken\n    type: agent_task\n    agent: dev\n    message: m\n    inputs: {fail: no}\n  - id: delegated\n    type: agent_task\n    message: m\n    delegate: {expertise: [rust], team: core}\n";
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
        if event.r#type == EventType::ExecutionFinished as i32 {
            assert_eq!(event.execution_status, ExecutionStatus::Failed as i32);
            break;
        }
    }

    let execution = scrape(&test.cluster().execution_url()).await;
    for expected in [
        "# TYPE muster_steps_total counter",
        "muster_steps_total{outcome=\"completed\"} 2",
        "muster_steps_total{outcome=\"failed\"} 1",
        "muster_rpc_requests_total{method=\"/muster.execution.v1.ExecutionService/StartExecution\",code=\"Ok\"} 1",
        "# TYPE muster_rpc_duration_seconds histogram",
        "muster_rpc_duration_seconds_count{method=\"/muster.execution.v1.ExecutionService/PublishProcess\",code=\"Ok\"} 1",
    ] {
        assert!(execution.contains(expected), "{expected} missing from:\n{execution}");
    }
    let roster = scrape(&test.cluster().roster_url()).await;
    assert!(roster.contains("muster_delegation_decisions_total{tier=\""), "{roster}");
    assert!(
        roster.contains(
            "muster_rpc_requests_total{method=\"/muster.roster.v1.RosterService/RegisterAgent\",code=\"Ok\"} 2"
        ),
        "{roster}"
    );
    let validator = scrape(&test.cluster().validator_url()).await;
    assert!(validator.contains("/muster.validator.v1.ValidatorService/ValidateProcess"), "{validator}");
    // The notifier's count grows as the outbox drains: wait for the lead's notifications.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let notifier = scrape(&test.cluster().notifier_url()).await;
        if notifier.contains("# TYPE muster_notifications_total counter")
            && notifier.contains("muster_events_ingested_total")
        {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{notifier}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }

    let _ = stop.send(());
    worker.await.unwrap().unwrap();
    test.shutdown().await;
}
