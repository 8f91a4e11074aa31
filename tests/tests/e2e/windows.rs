//! A worker that keeps its executions' windows (`WorkerHello.keeps_windows`)
//! is sent, for each next step of a chain, the one output and history entry
//! the step before added, and the counts of what it keeps of the window
//! before; made whole from them, every step's window is the one a worker
//! keeping none is sent. The Rust worker library keeps windows: its sample
//! behaviour sees them whole.

use muster::worker::AgentCredential;
use muster_proto::{
    common::v1::ExecutionStatus,
    execution::v1::{
        ConnectWorkerRequest, GetExecutionRequest, ServedAgent, StepResult, WorkerHello, connect_worker_request,
        connect_worker_response,
    },
};
use muster_tests::{
    Backend, TestCluster, agent, chain_process, events_until_finished, publish_and_start, spawn_sample_worker,
};
use prost_types::value::Kind;

/// Steps of each chain: past the hundred outputs a window holds.
const STEPS: usize = 120;
/// Most outputs in a window, and entries in a history.
const WINDOW: usize = 100;

/// The ids of the steps before `index`, oldest first, the nearest `WINDOW`.
fn before(index: usize) -> Vec<String> {
    (index.saturating_sub(WINDOW)..index).map(|step| format!("s{step}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_keeps_windows_is_sent_what_changed_and_sees_every_window_whole() {
    let Some(test) = TestCluster::start(Backend::Sqlite).await else { return };
    let tokens = test.register_agents(&[agent("keeper", "worker", "team"), agent("library", "worker", "team")]).await;

    // A worker by hand, keeping four executions' windows.
    let (sender, receiver) = tokio::sync::mpsc::channel(8);
    let hello = WorkerHello {
        worker_name: "keeper".to_owned(),
        agents: vec![ServedAgent { agent_id: "keeper".to_owned(), token: tokens[0].clone() }],
        tools: Vec::new(),
        max_concurrency: 1,
        keeps_windows: 4,
    };
    let say = |message| ConnectWorkerRequest { message: Some(message) };
    sender.send(say(connect_worker_request::Message::Hello(hello))).await.unwrap();
    let mut stream = test
        .execution_as(&tokens[0])
        .connect_worker(tokio_stream::wrappers::ReceiverStream::new(receiver))
        .await
        .unwrap()
        .into_inner();
    let welcome = stream.message().await.unwrap().unwrap();
    assert!(matches!(welcome.message, Some(connect_worker_response::Message::Welcome(_))), "{welcome:?}");

    let mut client = test.execution();
    let id = publish_and_start(&mut client, &chain_process("kept", STEPS, "keeper", "keeper", "{}")).await;
    // The window as the worker keeps it: outputs (the latest first) and history.
    let (mut memory, mut history): (Vec<(String, String)>, Vec<String>) = (Vec::new(), Vec::new());
    for index in 0..STEPS {
        let assignment = loop {
            let message = stream.message().await.unwrap().expect("the stream stays open");
            if let Some(connect_worker_response::Message::Assignment(assignment)) = message.message {
                break assignment;
            }
        };
        assert_eq!(assignment.step_id, format!("s{index}"));
        let carried = assignment.shared_memory.clone().unwrap_or_default().fields;
        let carried_history: Vec<String> = assignment.history.iter().map(|entry| entry.step_id.clone()).collect();
        let (memory_reused, history_reused) =
            (assignment.shared_memory_reused as usize, assignment.history_reused as usize);
        if index >= 2 {
            // Only the step before's output and history entry travel.
            assert_eq!(carried.keys().collect::<Vec<_>>(), [&format!("s{}", index - 1)], "s{index}");
            assert_eq!(carried_history, [format!("s{}", index - 1)], "s{index}");
            assert_eq!((memory_reused, history_reused), (index.min(WINDOW) - 1, index.min(WINDOW) - 1), "s{index}");
        } else {
            assert_eq!((memory_reused, history_reused), (0, 0), "s{index}: nothing kept yet");
        }
        let text = |value: &prost_types::Value| match &value.kind {
            Some(Kind::StructValue(output)) => format!("{:?}", output.fields.get("n")),
            other => panic!("an output is an object: {other:?}"),
        };
        let mut whole: Vec<(String, String)> =
            carried.iter().map(|(step, value)| (step.clone(), text(value))).collect();
        whole.extend(memory[..memory_reused].iter().cloned());
        let mut whole_history = history[history.len() - history_reused..].to_vec();
        whole_history.extend(carried_history);
        // Made whole, the window is the step's: the latest hundred, with their outputs.
        let mut expected = before(index);
        assert_eq!(whole_history, expected, "s{index}'s history");
        expected.reverse();
        assert_eq!(whole.iter().map(|(step, _)| step.clone()).collect::<Vec<_>>(), expected, "s{index}'s memory");
        for (step, output) in &whole {
            let n: f64 = step[1..].parse().unwrap();
            assert_eq!(*output, format!("{:?}", Some(prost_types::Value { kind: Some(Kind::NumberValue(n)) })));
        }
        (memory, history) = (whole, whole_history);
        let result = StepResult {
            assignment_id: assignment.assignment_id.clone(),
            output: muster_tests::value(&format!(r#"{{"n": {index}}}"#)),
            iterations: 1,
            ..Default::default()
        };
        sender.send(say(connect_worker_request::Message::Result(result))).await.unwrap();
    }
    let events = events_until_finished(&test.operator("execution"), &id).await;
    assert_eq!(events.last().unwrap().execution_status, ExecutionStatus::Completed as i32);
    drop(sender);

    // The library keeps windows by default; its behaviour sees them whole.
    let credentials = vec![AgentCredential { agent_id: "library".to_owned(), token: tokens[1].clone() }];
    let (stop, worker) = spawn_sample_worker(test.operator("execution"), credentials);
    let id = publish_and_start(&mut client, &chain_process("library", STEPS, "library", "library", "{}")).await;
    let events = events_until_finished(&test.operator("execution"), &id).await;
    assert_eq!(events.last().unwrap().execution_status, ExecutionStatus::Completed as i32);
    let execution = client.get_execution(GetExecutionRequest { id }).await.unwrap().into_inner().execution.unwrap();
    for (index, step) in execution.steps.iter().enumerate() {
        let output: serde_json::Value = muster_tests::json_of(&step.output);
        let mut keys = before(index);
        keys.sort();
        keys.truncate(10);
        assert_eq!(output["memory_steps"], index.min(WINDOW), "s{index}: {output}");
        assert_eq!(output["memory_keys"], serde_json::json!(keys), "s{index}: {output}");
        assert_eq!(output["history_steps"], index.min(WINDOW), "s{index}: {output}");
    }
    let _ = stop.send(());
    worker.await.unwrap().unwrap();
    test.shutdown().await;
}
