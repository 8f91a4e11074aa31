//! Large inputs and outputs travel by reference: an assignment names them
//! (`payload_refs`) and stays small, the worker reads them in chunks with
//! `ReadPayload`, and the agent sees them whole — on both databases, through
//! real gRPC to the four real processes. An output over its limit fails its
//! step and leaves the worker's stream alone.

use muster::worker::{AgentCredential, read_payload};
use muster_proto::{
    common::v1::ExecutionStatus,
    execution::v1::{
        ConnectWorkerRequest, GetExecutionRequest, ListWorkersRequest, PayloadKind, PublishProcessRequest,
        ReadPayloadRequest, ServedAgent, StartExecutionRequest, StepResult, StepStatus, WorkerHello,
        connect_worker_request, connect_worker_response,
    },
};
use muster_tests::{Backend, ExecutionClient, TestCluster, agent, events_until_finished, spawn_sample_worker};
use prost::Message as _;
use serde_json::Value;
use tonic::Code;

const PARTS: usize = 5;
/// Each part's padding: five of them are more than one message holds.
const PART_BYTES: usize = 800_000;

/// Five parts of ~870 KB each feed two joins: `join`, run by the sample
/// worker, and `join_raw`, run by a worker speaking the protocol by hand.
fn fan_in() -> String {
    let mut source = "name: big-fan-in\nlead: lead\nsteps:\n".to_owned();
    let parts: Vec<String> = (0..PARTS).map(|index| format!("part{index}")).collect();
    for part in &parts {
        source.push_str(&format!(
            "  - id: {part}\n    type: agent_task\n    agent: maker\n    message: make\n    inputs: {{output_bytes: {PART_BYTES}}}\n"
        ));
    }
    let own_text = "y".repeat(100_000);
    for (id, agent) in [("join", "joiner"), ("join_raw", "raw")] {
        source.push_str(&format!(
            "  - id: {id}\n    type: agent_task\n    agent: {agent}\n    message: join\n    inputs: {{text: {own_text}}}\n    depends_on: [{}]\n",
            parts.join(", ")
        ));
    }
    source
}

async fn start(client: &mut ExecutionClient, source: &str, inputs_json: String) -> String {
    let process = client
        .publish_process(PublishProcessRequest { source: source.to_owned(), file_name: String::new() })
        .await
        .unwrap_or_else(|status| panic!("publish: {status}"))
        .into_inner()
        .process
        .expect("a process");
    let request = StartExecutionRequest {
        process_name: process.name,
        inputs: muster_tests::object(&inputs_json),
        ..Default::default()
    };
    client
        .start_execution(request)
        .await
        .unwrap_or_else(|status| panic!("start: {status}"))
        .into_inner()
        .execution
        .unwrap()
        .id
}

async fn large_values_travel_by_reference(backend: Backend) {
    let Some(test) = TestCluster::start(backend).await else { return };
    let ids = ["lead", "maker", "joiner", "raw", "outsider"];
    let agents: Vec<_> = ids.iter().map(|id| agent(id, "member", "core")).collect();
    let tokens = test.register_agents(&agents).await;
    let token = |id: &str| tokens[ids.iter().position(|known| *known == id).unwrap()].clone();
    let credentials = ["maker", "joiner"]
        .into_iter()
        .map(|id| AgentCredential { agent_id: id.to_owned(), token: token(id) })
        .collect();
    let (stop, worker) = spawn_sample_worker(test.operator("execution"), credentials);

    // A worker for `raw`, by hand: the assignment it gets names the large values.
    let (raw_sender, raw_receiver) = tokio::sync::mpsc::channel(4);
    raw_sender
        .send(ConnectWorkerRequest {
            message: Some(connect_worker_request::Message::Hello(WorkerHello {
                worker_name: "by-hand".to_owned(),
                agents: vec![ServedAgent { agent_id: "raw".to_owned(), token: token("raw") }],
                tools: Vec::new(),
                max_concurrency: 1,
                keeps_windows: 0,
            })),
        })
        .await
        .unwrap();
    let mut raw_stream = test
        .execution_as(&token("raw"))
        .connect_worker(tokio_stream::wrappers::ReceiverStream::new(raw_receiver))
        .await
        .unwrap()
        .into_inner();
    let welcome = raw_stream.message().await.unwrap().unwrap();
    assert!(matches!(welcome.message, Some(connect_worker_response::Message::Welcome(_))), "{welcome:?}");

    // The execution's own inputs are 70 KB: every step's inputs go by reference.
    let note = "z".repeat(70_000);
    let mut client = test.execution();
    let id = start(&mut client, &fan_in(), serde_json::json!({ "note": note }).to_string()).await;

    let assignment = loop {
        let message = raw_stream.message().await.unwrap().expect("the stream stays open");
        if let Some(connect_worker_response::Message::Assignment(assignment)) = message.message {
            break assignment;
        }
    };
    assert_eq!(assignment.step_id, "join_raw");
    assert!(assignment.encoded_len() < 300_000, "an assignment stays small: {} bytes", assignment.encoded_len());
    assert!(assignment.upstream_outputs.is_empty(), "{:?}", assignment.upstream_outputs.keys());
    assert_eq!(assignment.inputs, None, "the inputs are too large to travel inline");
    let mut kinds: Vec<(String, i32)> =
        assignment.payload_refs.iter().map(|reference| (reference.step_id.clone(), reference.kind)).collect();
    kinds.sort();
    let mut expected: Vec<(String, i32)> =
        (0..PARTS).map(|index| (format!("part{index}"), PayloadKind::Output as i32)).collect();
    expected.push(("join_raw".to_owned(), PayloadKind::Inputs as i32));
    expected.sort();
    assert_eq!(kinds, expected);
    let mut raw_reader = test.execution_as(&token("raw"));
    let mut part_sizes = serde_json::Map::new();
    for reference in &assignment.payload_refs {
        let kind = PayloadKind::try_from(reference.kind).unwrap();
        let value = read_payload(&mut raw_reader, &id, &reference.step_id, kind).await.expect("ReadPayload");
        assert_eq!(value.len() as u64, reference.size_bytes, "{}", reference.step_id);
        let parsed: Value = serde_json::from_str(&value).expect("a whole JSON value");
        if kind == PayloadKind::Inputs {
            assert_eq!(parsed["note"], note.as_str());
            assert_eq!(parsed["text"].as_str().map(str::len), Some(100_000));
        } else {
            assert_eq!(parsed["padding"].as_str().map(str::len), Some(PART_BYTES));
            part_sizes.insert(reference.step_id.clone(), value.len().into());
        }
    }
    let result = StepResult {
        assignment_id: assignment.assignment_id.clone(),
        output: muster_tests::value(&serde_json::json!({ "read": part_sizes }).to_string()),
        iterations: 1,
        ..Default::default()
    };
    raw_sender
        .send(ConnectWorkerRequest { message: Some(connect_worker_request::Message::Result(result)) })
        .await
        .unwrap();

    let events = events_until_finished(&test.operator("execution"), &id).await;
    assert_eq!(events.last().unwrap().execution_status, ExecutionStatus::Completed as i32, "{events:#?}");

    // The sample worker's agent saw every value whole: the library read them.
    let join = events.iter().rev().find(|event| event.step_id == "join" && event.output.is_some()).unwrap();
    let join: Value = muster_tests::json_of(&join.output);
    assert_eq!(join["upstream_bytes"], Value::Object(part_sizes.clone()));
    assert_eq!(join["inputs"]["note"], note.as_str());
    assert_eq!(join["inputs"]["text"].as_str().map(str::len), Some(100_000));

    // GetExecution holds what fits and says which outputs it left out;
    // ReadPayload has them, from any offset.
    let execution = client.get_execution(GetExecutionRequest { id: id.clone() }).await.unwrap().into_inner();
    let steps = execution.execution.unwrap().steps;
    let omitted: Vec<&str> =
        steps.iter().filter(|step| step.output_omitted).map(|step| step.step_id.as_str()).collect();
    assert!(!omitted.is_empty(), "4 MB of outputs do not fit in one answer");
    let mut operator_reader = test.execution();
    for step_id in omitted {
        let whole = read_payload(&mut operator_reader, &id, step_id, PayloadKind::Output).await.unwrap();
        if let Some(size) = part_sizes.get(step_id) {
            assert_eq!(Some(whole.len() as u64), size.as_u64(), "{step_id}");
        }
        let request = ReadPayloadRequest {
            execution_id: id.clone(),
            step_id: step_id.to_owned(),
            kind: PayloadKind::Output as i32,
            offset: 300_000,
        };
        let mut stream = operator_reader.read_payload(request).await.unwrap().into_inner();
        let mut rest = Vec::new();
        let mut chunks = 0;
        while let Some(chunk) = stream.message().await.unwrap() {
            assert_eq!(chunk.offset, 300_000 + rest.len() as u64);
            assert!(chunk.chunk.len() <= 256 * 1024);
            assert_eq!(chunk.size_bytes, whole.len() as u64);
            rest.extend_from_slice(&chunk.chunk);
            chunks += 1;
        }
        assert_eq!(rest, whole.as_bytes()[300_000..], "{step_id} from an offset");
        assert!(chunks >= 2, "{step_id} came in chunks");
    }

    // Refusals: past the end, no kind, no such step, someone who takes no part.
    let read = |step_id: &str, kind: PayloadKind, offset: u64| ReadPayloadRequest {
        execution_id: id.clone(),
        step_id: step_id.to_owned(),
        kind: kind as i32,
        offset,
    };
    let status = operator_reader.read_payload(read("part0", PayloadKind::Output, 10_000_000)).await.unwrap_err();
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    assert!(status.message().contains("past the end"), "{}", status.message());
    let status = operator_reader.read_payload(read("part0", PayloadKind::Unspecified, 0)).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    let status = operator_reader.read_payload(read("nothing", PayloadKind::Output, 0)).await.unwrap_err();
    assert_eq!(
        (status.code(), status.message()),
        (Code::NotFound, &*format!("execution '{id}' has no step 'nothing'"))
    );
    let status =
        test.execution_as(&token("outsider")).read_payload(read("part0", PayloadKind::Output, 0)).await.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");

    // An output over its limit fails its step, for good, with the reason;
    // the worker's stream goes on and runs the next execution.
    let workers = || async {
        let mut client = test.execution();
        let workers = client.list_workers(ListWorkersRequest::default()).await.unwrap().into_inner().workers;
        workers.into_iter().find(|worker| worker.name == "test-worker").expect("the sample worker").worker_id
    };
    let before = workers().await;
    let too_big = "name: too-big\nsteps:\n  - id: huge\n    type: agent_task\n    agent: maker\n    message: m\n    inputs: {output_bytes: 2000000}\n    retries: 2\n";
    let failed = start(&mut client, too_big, String::new()).await;
    let events = events_until_finished(&test.operator("execution"), &failed).await;
    assert_eq!(events.last().unwrap().execution_status, ExecutionStatus::Failed as i32);
    let huge = client.get_execution(GetExecutionRequest { id: failed.clone() }).await.unwrap().into_inner();
    let huge = &huge.execution.unwrap().steps[0];
    assert_eq!(huge.status, StepStatus::Failed as i32);
    let error = huge.error.as_ref().unwrap();
    assert_eq!(error.code, "OUTPUT_TOO_LARGE", "{}", error.message);
    assert!(error.message.contains("result.output"), "{}", error.message);
    assert_eq!(huge.attempt, 1, "a result too large is not retried");
    // A step without an output has nothing to read.
    let request = ReadPayloadRequest {
        execution_id: failed,
        step_id: "huge".to_owned(),
        kind: PayloadKind::Output as i32,
        offset: 0,
    };
    let status = operator_reader.read_payload(request).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");

    let next = start(
        &mut client,
        "name: small\nsteps:\n  - id: s\n    type: agent_task\n    agent: maker\n    message: m\n",
        String::new(),
    )
    .await;
    let events = events_until_finished(&test.operator("execution"), &next).await;
    assert_eq!(events.last().unwrap().execution_status, ExecutionStatus::Completed as i32);
    assert_eq!(workers().await, before, "the worker had to reconnect");

    drop(raw_sender);
    let _ = stop.send(());
    worker.await.unwrap().unwrap();
    test.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_values_travel_by_reference_on_sqlite() {
    large_values_travel_by_reference(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_values_travel_by_reference_on_postgres() {
    large_values_travel_by_reference(Backend::Postgres).await;
}
