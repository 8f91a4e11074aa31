//! The sample process end to end: four real service processes, a worker
//! serving the sample agents, real gRPC, on SQLite and on PostgreSQL.

use std::{
    collections::{BTreeSet, HashMap},
    sync::Arc,
    time::Duration,
};

use muster::{
    sample::SampleBehaviour,
    worker::{self, AgentCredential},
};
use muster_proto::{
    common::v1::{EventType, ExecutionStatus, Severity},
    execution::v1::{GetExecutionRequest, PublishProcessRequest, StartExecutionRequest, StepStatus},
    roster::v1::{PutRoleDefinitionRequest, RoleDefinition},
};
use muster_tests::{Backend, TestCluster, agent, events_until_finished};

const SAMPLE_PROCESS: &str = include_str!("../../../examples/process.yaml");

/// The agents of the sample process, with a role and team each.
const SAMPLE_AGENTS: &[(&str, &str, &str)] = &[
    ("manager-agent", "manager", "content"),
    ("research-agent", "researcher", "research"),
    ("analyst-agent", "researcher", "research"),
    ("writer-agent", "writer", "content"),
    ("seo-agent", "writer", "content"),
    ("editor-agent", "reviewer", "content"),
    ("quality-agent", "reviewer", "content"),
    ("publisher-agent", "writer", "content"),
    ("archive-agent", "archivist", "operations"),
    ("learning-agent", "archivist", "operations"),
];

/// Steps of the sample process: id, dependencies, informed agents.
fn sample_steps() -> Vec<(&'static str, Vec<&'static str>, Vec<&'static str>)> {
    vec![
        ("research", vec![], vec!["archive-agent"]),
        ("draft", vec!["research"], vec!["learning-agent"]),
        ("fact-check", vec!["research"], vec!["learning-agent", "archive-agent"]),
        ("keywords", vec!["research"], vec!["archive-agent"]),
        ("review", vec!["draft", "fact-check", "keywords"], vec!["archive-agent", "learning-agent"]),
        ("publish", vec!["review"], vec!["archive-agent", "manager-agent"]),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sample_process_on_sqlite() {
    sample_process(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sample_process_on_postgres() {
    sample_process(Backend::Postgres).await;
}

async fn sample_process(backend: Backend) {
    let Some(test) = TestCluster::start(backend).await else { return };
    let mut roster = test.roster();
    let reviewer =
        RoleDefinition { name: "reviewer".to_owned(), description: "Reviews".to_owned(), ..Default::default() };
    roster.put_role_definition(PutRoleDefinitionRequest { role: Some(reviewer) }).await.unwrap();
    let agents: Vec<_> = SAMPLE_AGENTS.iter().map(|(id, role, team)| agent(id, role, team)).collect();
    let tokens = test.register_agents(&agents).await;
    let credentials: Vec<AgentCredential> =
        agents.iter().zip(tokens).map(|(agent, token)| AgentCredential { agent_id: agent.id.clone(), token }).collect();
    let (stop_worker, worker_stopped) = tokio::sync::oneshot::channel::<()>();
    let worker = tokio::spawn(worker::serve(
        test.operator("execution"),
        "e2e-worker".to_owned(),
        credentials,
        Arc::new(SampleBehaviour),
        async move {
            let _ = worker_stopped.await;
        },
    ));

    let mut execution_client = test.execution();
    let published = execution_client
        .publish_process(PublishProcessRequest {
            source: SAMPLE_PROCESS.to_owned(),
            file_name: "process.yaml".to_owned(),
        })
        .await
        .expect("the sample process is valid")
        .into_inner();
    let process = published.process.unwrap();
    assert_eq!(process.name, "content-pipeline");
    assert_eq!(process.version, 1);

    let execution = execution_client
        .start_execution(StartExecutionRequest {
            process_name: process.name.clone(),
            // Each step takes a moment, so the fan-out's three steps overlap.
            inputs: muster_tests::object(r#"{"sleep_ms": 300}"#),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .execution
        .unwrap();
    let events = events_until_finished(&test.operator("execution"), &execution.id).await;

    // The execution completed, and so did every step.
    let finished = events.last().unwrap();
    assert_eq!(finished.event_type, EventType::ExecutionFinished as i32);
    assert_eq!(finished.execution_status, ExecutionStatus::Completed as i32, "{}", finished.detail);
    let stored = execution_client
        .get_execution(GetExecutionRequest { id: execution.id.clone() })
        .await
        .unwrap()
        .into_inner()
        .execution
        .unwrap();
    assert_eq!(stored.status, ExecutionStatus::Completed as i32);
    assert_eq!(stored.steps.len(), 6);
    for step in &stored.steps {
        assert_eq!(step.status, StepStatus::Completed as i32, "step {}", step.step_id);
        let output: serde_json::Value = muster_tests::json_of(&step.output);
        assert_eq!(output["step"], step.step_id.as_str());
        assert!(output["system_prompt_chars"].as_u64().unwrap() > 0, "every assignment carries the rendered prompt");
    }
    // The join step saw its upstream outputs, the shared memory, the history and its role definition.
    let review = stored.steps.iter().find(|step| step.step_id == "review").unwrap();
    let review: serde_json::Value = muster_tests::json_of(&review.output);
    assert_eq!(review["built_on"], serde_json::json!(["draft", "fact-check", "keywords"]));
    assert_eq!(review["memory_keys"], serde_json::json!(["draft", "fact-check", "keywords", "research"]));
    assert_eq!(review["history_steps"], 4);
    assert_eq!(review["role"], "reviewer");

    // Sequences are gapless, and each step started only after its dependencies completed.
    for (position, event) in events.iter().enumerate() {
        assert_eq!(event.sequence, position as u64 + 1);
    }
    let sequence_of = |kind: EventType, step: &str| {
        events
            .iter()
            .find(|event| event.event_type == kind as i32 && event.step_id == step)
            .map(|event| event.sequence)
            .unwrap_or_else(|| panic!("no {kind:?} event for {step}"))
    };
    for (step, dependencies, _) in sample_steps() {
        let started = sequence_of(EventType::StepStarted, step);
        for dependency in dependencies {
            assert!(
                sequence_of(EventType::StepCompleted, dependency) < started,
                "{step} started before {dependency} completed"
            );
        }
    }
    // The fan-out really ran in parallel: all three started before any of them completed.
    let fan_out = ["draft", "fact-check", "keywords"];
    let last_start = fan_out.iter().map(|step| sequence_of(EventType::StepStarted, step)).max().unwrap();
    let first_completion = fan_out.iter().map(|step| sequence_of(EventType::StepCompleted, step)).min().unwrap();
    assert!(last_start < first_completion, "the fan-out steps did not run in parallel");

    // The lead hears of every event; once the last one reached its inbox, the notifier has them all.
    muster::inbox::wait_for_event(
        &test.operator("notifier"),
        "manager-agent",
        &finished.event_id,
        Duration::from_secs(60),
    )
    .await
    .unwrap();

    // Each informed agent has exactly one NDJSON line per step it is informed of, with the memory format's fields.
    let mut expected: HashMap<&str, BTreeSet<&str>> = HashMap::new();
    for (step, _, informed) in sample_steps() {
        for agent in informed {
            expected.entry(agent).or_default().insert(step);
        }
    }
    for (agent, steps) in &expected {
        let lines = muster_tests::ndjson_lines(&test.data_dir.join("agents").join(agent).join("events"));
        let lines: Vec<&serde_json::Value> =
            lines.iter().filter(|line| line["event_type"] != "execution_finished").collect();
        let informed_lines: Vec<&&serde_json::Value> = lines
            .iter()
            .filter(|line| line["event_type"] == "step_completed" && steps.contains(line["step_id"].as_str().unwrap()))
            .collect();
        assert_eq!(informed_lines.len(), steps.len(), "{agent}: {lines:#?}");
        let seen: BTreeSet<&str> = informed_lines.iter().map(|line| line["step_id"].as_str().unwrap()).collect();
        assert_eq!(&seen, steps, "{agent}");
        for line in informed_lines {
            let keys: BTreeSet<&str> = line.as_object().unwrap().keys().map(String::as_str).collect();
            assert_eq!(
                keys,
                BTreeSet::from([
                    "event_type",
                    "process_name",
                    "execution_id",
                    "step_id",
                    "step_name",
                    "output_summary",
                    "timestamp",
                    "metadata"
                ]),
                "{agent}"
            );
            assert_eq!(line["process_name"], "content-pipeline");
            assert_eq!(line["execution_id"], execution.id.as_str());
            assert!(line["timestamp"].as_str().unwrap().ends_with('Z'));
            assert!(line["metadata"]["duration_seconds"].is_u64(), "{line}");
            assert!(line["metadata"]["cost"].is_string(), "{line}");
        }
    }

    // A step with roles but no executor is refused, at the line and column of its roles.
    let invalid = "name: broken\nsteps:\n  - id: only\n    type: agent_task\n    agent: writer-agent\n    message: Write\n    roles:\n      monitors: [editor-agent]\n";
    let status = execution_client
        .publish_process(PublishProcessRequest { source: invalid.to_owned(), file_name: "broken.yaml".to_owned() })
        .await
        .expect_err("a step without an executor is refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    let diagnostics = muster_runtime::status::diagnostics(&status);
    let missing_executor = diagnostics
        .iter()
        .find(|diagnostic| diagnostic.message.contains("executor") && diagnostic.severity == Severity::Error as i32)
        .unwrap_or_else(|| panic!("no missing-executor error in {diagnostics:#?}"));
    assert_eq!((missing_executor.line, missing_executor.column), (7, 5), "{missing_executor:?}");
    assert_eq!(missing_executor.code, "EMI002");
    assert_eq!(missing_executor.path, "steps[0].roles");

    let _ = stop_worker.send(());
    worker.await.unwrap().unwrap();
    test.shutdown().await;
}
