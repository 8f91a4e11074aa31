//! One execution is one trace: the four services and a `muster agent`
//! worker export their spans over OTLP to a sink, and the spans of an
//! execution share its trace id and hang together by parent links — from
//! the client's calls (checking the process with the validator, publishing
//! it, which asks the roster for the references), through the roster's
//! delegation, the worker's stream and the notifier.

use std::{collections::BTreeSet, path::PathBuf, process::Stdio, time::Duration};

use muster::credentials::Endpoint;
use muster_proto::{
    common::v1::ExecutionStatus,
    execution::v1::{Execution, GetExecutionRequest, PublishProcessRequest, StartExecutionRequest},
    roster::v1::Agent,
    validator::v1::{ValidateProcessRequest, validator_service_client::ValidatorServiceClient},
};
use muster_tests::{
    Backend, ExecutionClient, TestCluster, events_until_finished,
    otlp::{ReceivedSpan, TraceSink},
};

const PROCESS: &str = "\
name: traced
lead: lead
steps:
  - id: named
    type: agent_task
    agent: dev
    message: write it
    roles: {executor: dev, informed: [lead]}
  - id: delegated
    type: agent_task
    message: review it
    depends_on: [named]
    delegate: {expertise: [rust], team: core}
";

/// The client's own trace, which the execution joins.
const CLIENT_TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

fn traced<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    let traceparent = format!("00-{CLIENT_TRACE_ID}-00f067aa0ba902b7-01");
    request.metadata_mut().insert("traceparent", traceparent.parse().unwrap());
    request
}

async fn run_to_end(
    client: &mut ExecutionClient,
    execution: &Endpoint,
    request: tonic::Request<StartExecutionRequest>,
) -> Execution {
    let started = client.start_execution(request).await.unwrap().into_inner().execution.unwrap();
    let finished = events_until_finished(execution, &started.id).await;
    assert_eq!(finished.last().unwrap().execution_status, ExecutionStatus::Completed as i32, "{finished:#?}");
    client.get_execution(GetExecutionRequest { id: started.id }).await.unwrap().into_inner().execution.unwrap()
}

fn services_in(spans: &[ReceivedSpan], trace_id: &str) -> BTreeSet<String> {
    spans.iter().filter(|span| span.trace_id == trace_id).map(|span| span.service.clone()).collect()
}

/// The spans of `service` named `name` in the trace, each with the span it hangs from.
fn with_parents<'a>(
    spans: &'a [ReceivedSpan],
    trace_id: &str,
    service: &str,
    name: &str,
) -> Vec<(&'a ReceivedSpan, Option<&'a ReceivedSpan>)> {
    spans
        .iter()
        .filter(|span| span.trace_id == trace_id && span.service == service && span.name == name)
        .map(|span| (span, spans.iter().find(|parent| parent.span_id == span.parent_span_id)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_execution_is_one_trace_across_the_cluster() {
    let sink = TraceSink::start().await;
    let otel = vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(), sink.endpoint.clone()),
        ("OTEL_BSP_SCHEDULE_DELAY".to_owned(), "100".to_owned()),
    ];
    let Some(test) = TestCluster::start_with_environment(Backend::Sqlite, otel.clone()).await else { return };
    let member = |id: &str| Agent {
        id: id.to_owned(),
        name: id.to_owned(),
        team: "core".to_owned(),
        expertise: vec!["rust".to_owned()],
        ..Default::default()
    };
    let tokens = test.register_agents(&[member("lead"), member("dev")]).await;
    let tokens_file = test.data_dir.join("tokens.json");
    std::fs::write(&tokens_file, serde_json::json!({"lead": tokens[0], "dev": tokens[1]}).to_string()).unwrap();

    // The worker is a `muster agent` process exporting its own spans.
    let muster: PathBuf = muster::cluster::default_binary_dir().unwrap().join("muster");
    let mut agent = tokio::process::Command::new(muster)
        .args(["agent", "--tokens-file"])
        .arg(&tokens_file)
        .env("MUSTER_EXECUTION_URL", test.cluster().execution_url())
        .env("MUSTER_DATA_DIR", &test.data_dir)
        .envs(otel)
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();

    let url = test.operator("execution");
    let mut client = test.execution();
    // Checked, published and started under the client's trace.
    let validator = test.operator("validator").channel().unwrap();
    let checked = ValidatorServiceClient::new(validator)
        .validate_process(traced(ValidateProcessRequest { source: PROCESS.to_owned(), ..Default::default() }))
        .await
        .unwrap()
        .into_inner();
    assert!(checked.valid, "{checked:?}");
    client
        .publish_process(traced(PublishProcessRequest { source: PROCESS.to_owned(), file_name: String::new() }))
        .await
        .unwrap();
    let joined = run_to_end(
        &mut client,
        &url,
        traced(StartExecutionRequest { process_name: "traced".to_owned(), ..Default::default() }),
    )
    .await;
    assert_eq!(joined.trace_id, CLIENT_TRACE_ID);
    // Started without a trace: the execution has a trace of its own.
    let own = run_to_end(
        &mut client,
        &url,
        tonic::Request::new(StartExecutionRequest { process_name: "traced".to_owned(), ..Default::default() }),
    )
    .await;
    assert_eq!(own.trace_id.len(), 32, "{own:?}");
    assert_ne!(own.trace_id, CLIENT_TRACE_ID);

    // The worker's spans arrive while it runs; the services send their last ones as they stop.
    sink.wait_for(Duration::from_secs(60), |spans| {
        spans.iter().filter(|span| span.service == "muster-agent" && span.name == "assignment").count() == 4
    })
    .await;
    // Each JSON log line written in a traced span starts with its ids: the
    // start of the client's execution is found by the client's trace id.
    let log = std::fs::read_to_string(test.data_dir.join("logs/execution.log")).unwrap();
    let started = log
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .find(|line| line["fields"]["message"] == "execution started" && line["fields"]["execution_id"] == joined.id)
        .unwrap_or_else(|| panic!("no start of {} in the log:\n{log}", joined.id));
    assert_eq!(started["trace_id"], CLIENT_TRACE_ID, "{started}");
    assert_eq!(started["span_id"].as_str().map(str::len), Some(16), "{started}");

    let _ = agent.start_kill();
    test.shutdown().await;
    let spans = sink.spans();

    let everyone = ["muster-agent", "muster-execution", "muster-notifier", "muster-roster", "muster-validator"];

    // The client's trace holds the check (validator), the publication and the whole execution.
    assert_eq!(services_in(&spans, CLIENT_TRACE_ID), everyone.map(str::to_owned).into(), "{spans:#?}");
    // A trace started by muster has everything but the check, which came before it.
    assert_eq!(services_in(&spans, &own.trace_id), everyone[..4].iter().map(|s| s.to_string()).collect(), "{spans:#?}");

    for trace_id in [CLIENT_TRACE_ID, own.trace_id.as_str()] {
        // Every step has its span under the execution's.
        let steps = with_parents(&spans, trace_id, "muster-execution", "step");
        assert_eq!(steps.len(), 2, "{spans:#?}");
        for (_, parent) in &steps {
            assert_eq!(parent.map(|parent| parent.name.as_str()), Some("execution"), "{spans:#?}");
        }
        // The roster placed each step (the named one and the delegated one) inside that step's span.
        let delegations = with_parents(&spans, trace_id, "muster-roster", "placement");
        assert_eq!(delegations.len(), 2, "{spans:#?}");
        for (_, parent) in &delegations {
            assert_eq!(parent.map(|parent| parent.name.as_str()), Some("step"), "{spans:#?}");
        }
        // The worker ran each assignment in the span of its step, across the worker stream.
        let assignments = with_parents(&spans, trace_id, "muster-agent", "assignment");
        assert_eq!(assignments.len(), 2, "{spans:#?}");
        for (_, parent) in &assignments {
            assert_eq!(
                parent.map(|parent| (parent.service.as_str(), parent.name.as_str())),
                Some(("muster-execution", "step"))
            );
        }
        // The notifier handled every event in the span that recorded it.
        let notified = with_parents(&spans, trace_id, "muster-notifier", "notify");
        assert!(notified.len() >= 6, "started, 2 × (started, completed), finished: {notified:#?} {spans:#?}");
        for (span, parent) in &notified {
            assert_eq!(parent.map(|parent| parent.service.as_str()), Some("muster-execution"), "{span:?}");
        }
    }
    // The validator checked the process in the client's trace, under the client's call.
    let validations = spans
        .iter()
        .filter(|span| span.service == "muster-validator" && span.trace_id == CLIENT_TRACE_ID)
        .collect::<Vec<_>>();
    assert!(!validations.is_empty());
    // Publishing asked the roster for the agents and roles the process
    // refers to, under the execution service's call.
    let references = spans
        .iter()
        .filter(|span| {
            span.service == "muster-roster"
                && span.trace_id == CLIENT_TRACE_ID
                && span.name == "muster.roster.v1.RosterService/ListAgents"
        })
        .collect::<Vec<_>>();
    assert!(!references.is_empty(), "{spans:#?}");
    for reference in references {
        let parent = spans.iter().find(|span| span.span_id == reference.parent_span_id).unwrap();
        assert_eq!(parent.name, "muster.execution.v1.ExecutionService/PublishProcess", "{spans:#?}");
    }
}
