//! `muster mcp` with the official MCP Python SDK as the client
//! (`tests/mcp/scenarios.py`), over stdio and streamable HTTP, against a
//! real cluster: the tools and their schemas, a whole run taken step by step
//! through `next_assignment` and `complete_step`, malformed arguments and a
//! refusal as tool errors, a notification arriving as a resource update, two
//! HTTP clients that see only their own steps and notifications, and a
//! client that goes away mid-step, whose step the cluster takes back (after
//! the server's idle timeout) and gives to another worker.
//!
//! Needs `MUSTER_PYTHON` with the `mcp` package (`.ci/run` installs it):
//! without it the test says so and passes, except under `CI=true`.

use std::{process::Stdio, time::Duration};

use muster_proto::{
    common::v1::ExecutionStatus,
    execution::v1::{
        Execution, GetExecutionRequest, ListMemoryRequest, MemoryScope, PublishProcessRequest, RoleAssignment,
        SessionTask, StartSessionRequest, StepStatus,
    },
};
use muster_tests::{Backend, StubBehaviour, TestCluster, agent, chain_process, publish_and_start, spawn_worker};
use tokio::io::{AsyncBufReadExt as _, BufReader};

use super::clients::{repository, tool};

/// A session's process: one approval its lead decides.
const SESSION: &str = "name: mcp-session\nsteps:\n  - id: gate\n    type: human_approval\n    roles: {executor: mcp-third}\n    approvers: [mcp-third]\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_client_is_a_member_of_the_team() {
    let Some(python) = tool("MUSTER_PYTHON", "python3", &["-c", "import mcp, httpx2"]) else { return };
    let Some(test) = TestCluster::start(Backend::Sqlite).await else { return };
    let agents = [
        agent("mcp-writer", "writer", "mcp-team"),
        agent("mcp-third", "writer", "mcp-team"),
        agent("mcp-reader", "reader", "mcp-team"),
    ];
    let tokens = test.register_agents(&agents).await;
    let mut execution = test.execution();
    let first =
        publish_and_start(&mut execution, &chain_process("mcp-first", 3, "mcp-writer", "mcp-reader", "{}")).await;
    let second =
        publish_and_start(&mut execution, &chain_process("mcp-second", 2, "mcp-third", "mcp-reader", "{}")).await;
    execution
        .publish_process(PublishProcessRequest { source: SESSION.to_owned(), file_name: String::new() })
        .await
        .unwrap();
    let session = muster_tests::start_session(
        &mut execution,
        StartSessionRequest {
            process_name: "mcp-session".into(),
            lead_agent_id: "mcp-third".into(),
            participants: vec![RoleAssignment {
                agent_id: "mcp-writer".into(),
                role: "analyst".into(),
                subtask: "measure it".into(),
                ..Default::default()
            }],
            task: Some(SessionTask { title: "measure".into(), description: String::new() }),
            ..Default::default()
        },
    )
    .await;

    // Over HTTP each client brings its own token: one given to the server is refused.
    let mut environment = test.command_environment();
    environment.push(("MUSTER_TOKEN".to_owned(), tokens[0].clone()));
    let refused =
        muster_tests::command::run(["mcp", "--listen", "127.0.0.1:0"].map(String::from).to_vec(), environment).await;
    let said = muster_tests::command::text(&refused);
    assert!(!refused.status.success() && said.contains("refused with --listen"), "{said}");

    // The HTTP server, letting an agent go after 2 s without a call.
    let mut server = tokio::process::Command::new(muster_tests::command::muster());
    server
        .args(["mcp", "--listen", "127.0.0.1:0", "--idle-timeout", "2"])
        .envs(test.command_environment())
        .env("MUSTER_CONFIG_DIR", "")
        .env_remove("MUSTER_TOKEN")
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut server = server.spawn().expect("starting muster mcp --listen");
    let mut said = BufReader::new(server.stderr.take().unwrap()).lines();
    let serving = tokio::time::timeout(Duration::from_secs(30), said.next_line()).await;
    let serving = serving.expect("muster mcp says where it serves").unwrap().unwrap_or_default();
    let url = serving.strip_prefix("muster mcp: serving ").unwrap_or_else(|| panic!("{serving}")).to_owned();
    tokio::spawn(async move {
        while let Ok(Some(line)) = said.next_line().await {
            eprintln!("muster mcp: {line}")
        }
    });

    let mut scenarios = tokio::process::Command::new(python);
    scenarios
        .arg(repository().join("tests/mcp/scenarios.py"))
        .envs(test.command_environment())
        .env("MUSTER", muster_tests::command::muster())
        .env("MUSTER_CONFIG_DIR", "")
        .env("MCP_URL", &url)
        .env("WRITER_TOKEN", &tokens[0])
        .env("THIRD_TOKEN", &tokens[1])
        .env("READER_TOKEN", &tokens[2])
        .env("FIRST_EXECUTION", &first)
        .env("SECOND_EXECUTION", &second)
        .env("SESSION", &session)
        .stdout(Stdio::piped())
        .kill_on_drop(true);
    let mut scenarios = scenarios.spawn().expect("starting the scenarios");
    let mut lines = BufReader::new(scenarios.stdout.take().unwrap()).lines();
    let mut printed = String::new();
    let read = tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            eprintln!("scenarios: {line}");
            printed.push_str(&line);
            printed.push('\n');
        }
        scenarios.wait().await.unwrap()
    });
    let status = read.await.unwrap_or_else(|_| panic!("the scenarios end within two minutes; they said:\n{printed}"));
    assert!(status.success(), "the MCP scenarios failed:\n{printed}");
    assert!(printed.lines().filter(|line| line.starts_with("ok: ")).count() >= 25, "{printed}");

    // The run taken step by step over stdio: the step the client held when it
    // went away goes back to the cluster and to another worker of the agent.
    let run = finished(&test, &tokens[0], "mcp-writer", &first).await;
    let outputs: Vec<_> = run.steps.iter().take(2).map(|step| muster_tests::json_of(&step.output)).collect();
    assert_eq!(outputs, [serde_json::json!({"text": "done s0"}), serde_json::json!({"text": "done s1"})]);
    assert!(run.steps.iter().take(2).all(|step| step.tokens_used == 7), "{:?}", run.steps);
    let memory = execution
        .list_memory(ListMemoryRequest { scope: MemoryScope::Global as i32, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    let notes: Vec<&str> = memory.entries.iter().map(|entry| entry.text.as_str()).collect();
    assert!(notes.contains(&"s0 was done over MCP") && notes.contains(&"s1 was done over MCP"), "{notes:?}");

    // The step the vanished client held goes back to the cluster and to another worker.
    let abandoned = printed.lines().filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok()).next();
    assert!(abandoned.is_some_and(|line| line["abandoned"].is_string()), "{printed}");
    let run = finished(&test, &tokens[1], "mcp-third", &second).await;
    assert_eq!(run.steps[1].status(), StepStatus::Completed, "{run:?}");
    let _ = server.kill().await;
    test.shutdown().await;
}

/// The execution once a stub worker of `agent_id` has taken what the MCP
/// clients left: it completes only if their held steps were given back.
async fn finished(test: &TestCluster, token: &str, agent_id: &str, execution_id: &str) -> Execution {
    let credentials = vec![muster::worker::AgentCredential { agent_id: agent_id.to_owned(), token: token.to_owned() }];
    let (stop, worker) = spawn_worker(test.caller("execution", token), credentials, StubBehaviour);
    let mut execution = test.execution();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let run = loop {
        let run = execution.get_execution(GetExecutionRequest { id: execution_id.to_owned() }).await.unwrap();
        let run = run.into_inner().execution.unwrap();
        if run.status() == ExecutionStatus::Completed || tokio::time::Instant::now() > deadline {
            break run;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let _ = stop.send(());
    let _ = worker.await;
    assert_eq!(run.status(), ExecutionStatus::Completed, "the abandoned step was given back: {run:?}");
    run
}
