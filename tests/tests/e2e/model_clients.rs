//! The model-driven agent of the Python and TypeScript worker libraries
//! (`muster_worker.model`, `clients/typescript/src/model-agent.ts`) end to
//! end: each language's scenario program (`clients/python/tests/model_scenarios.py`,
//! `clients/typescript/src/model-scenarios.ts`) starts its own scripted fake
//! model servers (real HTTP on loopback, each request recorded) and serves
//! agents of a real cluster with the library's agent; this drives the runs
//! and reads back what the servers received. The same checks as the Rust
//! agent's (`agents.rs`): what the model is told (system prompt, the context
//! file, the tools as the catalogue's JSON schemas, the key as a bearer token
//! or `x-api-key`), a loop through `InvokeTool` and every workspace tool,
//! confinement (`..`, an absolute path, links out: refused, the file never
//! sent), the iteration limit, usage as tokens and cost, a 429 honoured, and
//! a cancelled step aborting its HTTP call. And the three catalogues agree.
//!
//! Toolchains as in `clients.rs` (`MUSTER_PYTHON` with grpcio, openai and
//! anthropic; `MUSTER_NPM` and `MUSTER_BUF`): without them the tests say so
//! and pass, except under `CI=true`.

use std::{path::PathBuf, process::Stdio, time::Duration};

use muster_proto::{
    common::v1::{EventType, ExecutionStatus},
    execution::v1::{CancelExecutionRequest, GetExecutionRequest, StepStatus},
    roster::v1::{PutRoleDefinitionRequest, RoleDefinition},
};
use muster_tests::{
    Backend, ExecutionClient, Folder, TestCluster, agent, events_until_finished, json_of, publish_and_start,
};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader, Lines};

use muster_agent::catalogue::Tool as _;

use super::clients::{python_client, repository, tool, typescript_client};

const KEY_VARIABLE: &str = "MUSTER_TEST_MODEL_KEY";
const KEY: &str = "k-fake-model-key-456";

/// The Rust catalogue and the copies the other libraries ship are the same bytes.
#[test]
fn the_three_catalogues_agree() {
    let rust = muster_agent::catalogue::catalogue_json();
    for copy in
        ["agent/catalogue.json", "clients/python/muster_worker/catalogue.json", "clients/typescript/src/catalogue.json"]
    {
        let text = std::fs::read_to_string(repository().join(copy)).unwrap();
        assert!(
            text == rust,
            "{copy} is not the Rust catalogue: `MUSTER_WRITE_CATALOGUE=1 cargo test -p muster-agent --lib catalogue`"
        );
    }
}

/// A test cluster and a Python that has the package installed for it, with
/// the model extra; `None` (said) when the toolchain is missing outside CI.
async fn python_cluster() -> Option<(TestCluster, String, PathBuf)> {
    let python = tool("MUSTER_PYTHON", "python3", &["-c", "import grpc, grpc_tools, setuptools, openai, anthropic"])?;
    let test = TestCluster::start(Backend::Sqlite).await?;
    let installed = python_client(&test, &python);
    Some((test, python, installed))
}

/// A test cluster and the TypeScript package built for it.
async fn typescript_cluster() -> Option<(TestCluster, PathBuf)> {
    let npm = tool("MUSTER_NPM", "npm", &["--version"])?;
    let buf = tool("MUSTER_BUF", "buf", &["--version"])?;
    let test = TestCluster::start(Backend::Sqlite).await?;
    let client = typescript_client(&test, npm, buf).await;
    Some((test, client))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_model_agent_runs_the_scenarios() {
    let Some((test, python, installed)) = python_cluster().await else { return };
    let scripts = repository().join("clients/python/tests");
    let mut program = tokio::process::Command::new(python);
    program
        .arg(scripts.join("model_scenarios.py"))
        .env("PYTHONPATH", format!("{}:{}", installed.display(), scripts.display()));
    run_scenarios(test, program, "python").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_typescript_model_agent_runs_the_scenarios() {
    let Some((test, client)) = typescript_cluster().await else { return };
    let mut program = tokio::process::Command::new("node");
    program.arg(client.join("dist/model-scenarios.js"));
    run_scenarios(test, program, "typescript").await;
}

/// A scenario program, spoken to line by line.
struct Scenarios {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: Lines<BufReader<tokio::process::ChildStdout>>,
}

impl Scenarios {
    async fn line(&mut self) -> Value {
        let line = tokio::time::timeout(Duration::from_secs(60), self.lines.next_line()).await;
        let line = line.expect("the scenario program answers within 60 s").unwrap();
        let line = line.unwrap_or_else(|| panic!("the scenario program ended: {:?}", self.child.try_wait()));
        serde_json::from_str(&line).unwrap_or_else(|error| panic!("{error}: {line}"))
    }

    async fn say(&mut self, line: &str) {
        self.stdin.write_all(format!("{line}\n").as_bytes()).await.unwrap();
        self.stdin.flush().await.unwrap();
    }

    /// What each fake server received so far, and how many held requests were abandoned.
    async fn requests(&mut self) -> Value {
        self.say("requests").await;
        self.line().await
    }
}

fn llm_config(config: Value) -> Option<prost_types::Struct> {
    muster_tests::object(&config.to_string())
}

async fn execution_of(client: &mut ExecutionClient, id: &str) -> muster_proto::execution::v1::Execution {
    client.get_execution(GetExecutionRequest { id: id.to_owned() }).await.unwrap().into_inner().execution.unwrap()
}

fn one_step(name: &str, agent: &str, message: &str) -> String {
    format!("name: {name}\nsteps:\n  - id: work\n    type: agent_task\n    agent: {agent}\n    message: {message}\n")
}

/// The tool results an OpenAI request carries, as JSON.
fn tool_results(request: &Value) -> Vec<Value> {
    request["body"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|message| message["role"] == "tool")
        .map(|message| serde_json::from_str(message["content"].as_str().unwrap()).unwrap())
        .collect()
}

async fn run_scenarios(test: TestCluster, mut program: tokio::process::Command, language: &str) {
    let outside = Folder::new("model-clients-outside");
    let secret = outside.0.join("secret.txt");
    std::fs::write(&secret, "TOP SECRET OUTSIDE THE WORKSPACE").unwrap();
    let workspace: PathBuf = test.data_dir.join("workspace");
    std::fs::create_dir_all(&workspace).unwrap();
    std::fs::write(workspace.join("brief.md"), "THE BRIEF: three paragraphs for the portal").unwrap();
    std::os::unix::fs::symlink(&secret, workspace.join("link-out")).unwrap();
    std::os::unix::fs::symlink(&outside.0, workspace.join("escape")).unwrap();

    let address = |url: String| url.trim_start_matches("http://").to_owned();
    let mut child = program
        .args(["--execution", &address(test.cluster().execution_url())])
        .args(["--roster", &address(test.cluster().roster_url())])
        .arg("--workspace")
        .arg(&workspace)
        .arg("--outside")
        .arg(&secret)
        .env(KEY_VARIABLE, KEY)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut scenarios = Scenarios {
        stdin: child.stdin.take().unwrap(),
        lines: BufReader::new(child.stdout.take().unwrap()).lines(),
        child,
    };
    let servers = scenarios.line().await["servers"].clone();
    let server = |name: &str| servers[name].as_str().unwrap().to_owned();

    for role in [
        RoleDefinition {
            name: "drafter".into(),
            mission: "Write clear drafts for the client".into(),
            tools: ["word_count", "read_file", "write_file", "append_file", "list_files", "move_file"]
                .map(str::to_owned)
                .to_vec(),
            context_files: vec!["brief.md".into()],
            ..Default::default()
        },
        RoleDefinition { name: "looper".into(), tools: vec!["list_files".into()], ..Default::default() },
    ] {
        test.roster().put_role_definition(PutRoleDefinitionRequest { role: Some(role) }).await.unwrap();
    }
    let openai = |url: String, extra: Value| {
        let mut config = json!({"provider": "openai", "base_url": format!("{url}/v1"), "model": "fake-gpt",
            "api_key_env": KEY_VARIABLE, "prices": {"input_per_million": 1000, "output_per_million": 2000}});
        config.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        llm_config(config)
    };
    let agents = vec![
        muster_proto::roster::v1::Agent {
            llm_config: openai(server("tools"), json!({})),
            backstory: "Ten years of technical writing and a dislike of jargon".into(),
            ..agent("wren", "drafter", "content")
        },
        muster_proto::roster::v1::Agent {
            llm_config: openai(server("looping"), json!({})),
            max_iterations: 3,
            ..agent("looper", "looper", "content")
        },
        muster_proto::roster::v1::Agent {
            llm_config: llm_config(json!({"provider": "anthropic", "base_url": server("limited"),
                "model": "fake-claude", "api_key_env": KEY_VARIABLE})),
            ..agent("claude", "", "content")
        },
        muster_proto::roster::v1::Agent {
            llm_config: openai(server("hanging"), json!({})),
            ..agent("waiter", "", "content")
        },
    ];
    let tokens = test.register_agents(&agents).await;
    let tokens: serde_json::Map<String, Value> =
        agents.iter().zip(tokens).map(|(agent, token)| (agent.id.clone(), token.into())).collect();
    scenarios.say(&Value::Object(tokens).to_string()).await;
    assert_eq!(scenarios.line().await, json!({"serving": 4}), "{language}");

    let mut client = test.execution();
    let drafting = publish_and_start(&mut client, &one_step("drafting", "wren", "Draft the portal note")).await;
    let looping = publish_and_start(&mut client, &one_step("looping", "looper", "Loop forever")).await;
    let waited = publish_and_start(&mut client, &one_step("waited", "claude", "Answer")).await;
    let mut drafting_events = Vec::new();
    for id in [&drafting, &looping, &waited] {
        let events = events_until_finished(&test.operator("execution"), id).await;
        if id == &drafting {
            drafting_events = events;
        }
    }

    // The loop through InvokeTool and the workspace: its answer, tokens and cost.
    let execution = execution_of(&mut client, &drafting).await;
    assert_eq!(execution.status, ExecutionStatus::Completed as i32, "{language}: {execution:?}");
    let step = &execution.steps[0];
    assert_eq!(json_of(&step.output), json!({"done": true, "summary": "drafted"}), "{language}");
    assert_eq!(step.tokens_used, 660, "{language}");
    assert!((step.cost - (600.0 * 1000.0 + 60.0 * 2000.0) / 1e6).abs() < 1e-9, "{language}: {}", step.cost);
    let calls = drafting_events.iter().filter(|event| event.event_type == EventType::StepProgress as i32).count();
    assert_eq!(calls, 3, "{language}: a STEP_PROGRESS event per model call: {drafting_events:?}");

    let received = scenarios.requests().await;
    let requests = received["requests"]["tools"].as_array().unwrap().clone();
    assert_eq!(requests.len(), 3, "{language}");
    let first = &requests[0];
    assert_eq!(first["path"], "/v1/chat/completions", "{language}");
    assert_eq!(first["headers"]["authorization"], format!("Bearer {KEY}"), "{language}");
    let system = first["body"]["messages"][0]["content"].as_str().unwrap();
    assert!(system.contains("Write clear drafts for the client"), "{language}: {system}");
    assert!(system.contains("Ten years of technical writing"), "{language}: {system}");
    let task = first["body"]["messages"][1]["content"].as_str().unwrap();
    for part in ["Draft the portal note", "### brief.md\n```\nTHE BRIEF: three paragraphs", "## How to answer"] {
        assert!(task.contains(part), "{language}: missing {part:?} in:\n{task}");
    }
    // The tools offered: the role's workspace tools, its provided tool with the
    // schema its provider registered, then the cluster's, each as the Rust
    // agent offers it.
    let offered: Vec<Value> = first["body"]["tools"].as_array().unwrap().clone();
    let names: Vec<&str> = offered.iter().map(|tool| tool["function"]["name"].as_str().unwrap()).collect();
    let mut expected: Vec<&str> =
        vec!["read_file", "write_file", "append_file", "list_files", "move_file", "word_count"];
    expected.extend(muster_agent::catalogue::ClusterTool::ALL.iter().map(|tool| tool.name()));
    assert_eq!(names, expected, "{language}");
    for tool in &offered {
        let name = tool["function"]["name"].as_str().unwrap();
        let definition = muster_agent::catalogue::ClusterTool::from_name(name)
            .map(|tool| tool.definition())
            .or_else(|| muster_agent::catalogue::WorkspaceTool::from_name(name).map(|tool| tool.definition()));
        match definition {
            Some(definition) => {
                assert_eq!(tool["function"]["description"], definition.description.as_str(), "{language}: {name}");
                assert_eq!(tool["function"]["parameters"], definition.parameters, "{language}: {name}");
            }
            None => assert_eq!(tool["function"]["parameters"]["required"], json!(["text"]), "{language}: {name}"),
        }
    }
    // The provider's tool, through InvokeTool; the ways out, each refused.
    let results = tool_results(&requests[1]);
    assert_eq!(results[0], json!({"words": 3}), "{language}");
    for (index, says) in [(1, "climbs out"), (2, "absolute"), (3, "leads out"), (4, "leads out")] {
        let message = results[index]["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{language}: result {index}: {}", results[index]);
    }
    assert!(!received.to_string().contains("TOP SECRET"), "{language}: a file outside the workspace reached the model");
    // The workspace tools did their work, on disk.
    let results = tool_results(&requests[2]);
    assert_eq!(results[7]["entries"][0]["name"], "draft.md", "{language}: {:?}", results[7]);
    assert_eq!(results[9]["content"], "draft and more", "{language}");
    assert_eq!(std::fs::read_to_string(workspace.join("final/draft.md")).unwrap(), "draft and more");
    assert!(!workspace.join("out/draft.md").exists(), "{language}");

    // The iteration limit.
    let step = execution_of(&mut client, &looping).await.steps.remove(0);
    assert_eq!(step.status, StepStatus::Failed as i32, "{language}");
    let error = step.error.unwrap();
    assert_eq!(error.code, "ITERATION_LIMIT", "{language}: {error:?}");
    assert!(error.message.contains("max_iterations"), "{language}: {error:?}");
    assert_eq!(received["requests"]["looping"].as_array().unwrap().len(), 3, "{language}: it stops at max_iterations");

    // A 429 with Retry-After, honoured; Anthropic's key as x-api-key.
    let execution = execution_of(&mut client, &waited).await;
    assert_eq!(execution.status, ExecutionStatus::Completed as i32, "{language}: {execution:?}");
    assert_eq!(json_of(&execution.steps[0].output), json!("fine after waiting"), "{language}");
    let limited = received["requests"]["limited"].as_array().unwrap();
    assert_eq!(limited.len(), 2, "{language}: one retry after the 429");
    assert_eq!(limited[1]["path"], "/v1/messages", "{language}");
    assert_eq!(limited[1]["headers"]["x-api-key"], KEY, "{language}");
    assert_eq!(limited[1]["headers"]["anthropic-version"], "2023-06-01", "{language}");
    assert!(limited[1]["headers"].get("authorization").is_none(), "{language}: {}", limited[1]["headers"]);
    let system = limited[1]["body"]["system"].as_str().unwrap_or_default();
    assert!(system.contains("You are: claude"), "{language}: the system prompt the roster rendered: {system}");

    // Cancelled while the model is thinking: the call in flight is aborted.
    let id = publish_and_start(&mut client, &one_step("waiting", "waiter", "Think")).await;
    let mut seen = false;
    for _ in 0..300 {
        if !scenarios.requests().await["requests"]["hanging"].as_array().unwrap().is_empty() {
            seen = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(seen, "{language}: the hanging server was never called");
    client.cancel_execution(CancelExecutionRequest { id, reason: "enough".into() }).await.unwrap();
    let mut abandoned = 0;
    for _ in 0..200 {
        abandoned = scenarios.requests().await["abandoned"]["hanging"].as_u64().unwrap();
        if abandoned == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(abandoned, 1, "{language}: the model call went on after the step was withdrawn");

    scenarios.say("stop").await;
    let ended = tokio::time::timeout(Duration::from_secs(30), scenarios.child.wait()).await;
    assert!(ended.expect("the scenario program stops").unwrap().success(), "{language}");
    test.shutdown().await;
}

/// The Python serve example, as its docstring runs it, with its own fake model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_serve_example_runs_a_step_on_its_fake_model() {
    let Some((test, python, installed)) = python_cluster().await else { return };
    let mut example = tokio::process::Command::new(python);
    example
        .arg(repository().join("examples/python/serve_model_agents.py"))
        .env("PYTHONPATH", installed.display().to_string());
    serve_example_runs_a_step(test, example, "py-reader").await;
}

/// The TypeScript serve example, likewise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_typescript_serve_example_runs_a_step_on_its_fake_model() {
    let Some((test, client)) = typescript_cluster().await else { return };
    let mut example = tokio::process::Command::new("node");
    example.arg(client.join("dist/serve-model-agents.js"));
    serve_example_runs_a_step(test, example, "ts-reader").await;
}

/// Serves one agent with an example (`--fake-model 0`: its own fake model on
/// a free port, which it names), points the agent's `llm_config` at that
/// model, and runs one step: the model lists the workspace and answers.
async fn serve_example_runs_a_step(test: TestCluster, mut example: tokio::process::Command, agent_id: &str) {
    // A role that lists the file tool the example's model calls.
    let role = RoleDefinition { name: "reader".to_owned(), tools: vec!["list_files".to_owned()], ..Default::default() };
    test.roster().put_role_definition(PutRoleDefinitionRequest { role: Some(role) }).await.unwrap();
    let token = test.register_agents(&[agent(agent_id, "reader", "examples")]).await.remove(0);
    let folder = Folder::new("serve-example");
    let tokens = folder.0.join("tokens.json");
    std::fs::write(&tokens, json!({ agent_id: token }).to_string()).unwrap();
    let workspace = folder.0.join("workspace");
    std::fs::create_dir_all(&workspace).unwrap();
    std::fs::write(workspace.join("notes.md"), "notes").unwrap();
    let address = |url: String| url.trim_start_matches("http://").to_owned();
    example
        .arg("--execution")
        .arg(address(test.cluster().execution_url()))
        .arg("--roster")
        .arg(address(test.cluster().roster_url()))
        .arg("--tokens")
        .arg(&tokens)
        .arg("--workspace")
        .arg(&workspace)
        .args(["--fake-model", "0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true);
    let mut child = example.spawn().expect("starting the example");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut model_url = None;
    loop {
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line()).await;
        let line = line.expect("the example speaks within 60 s").unwrap().expect("the example ended early");
        if let Some(url) = line.strip_prefix("fake model at ") {
            model_url = Some(url.trim().to_owned());
        }
        if line.starts_with("serving ") {
            break;
        }
    }
    let model_url = model_url.expect("the example names its fake model");
    let config = llm_config(json!({"provider": "openai", "base_url": model_url, "model": "fake"}));
    let update = muster_proto::roster::v1::UpdateAgentRequest {
        agent: Some(muster_proto::roster::v1::Agent {
            id: agent_id.to_owned(),
            llm_config: config,
            ..Default::default()
        }),
        update_mask: Some(prost_types::FieldMask { paths: vec!["llm_config".to_owned()] }),
    };
    test.roster().update_agent(update).await.unwrap();
    let mut client = test.execution();
    let id = publish_and_start(&mut client, &one_step("example-run", agent_id, "Look around")).await;
    events_until_finished(&test.operator("execution"), &id).await;
    let execution = execution_of(&mut client, &id).await;
    assert_eq!(execution.status, ExecutionStatus::Completed as i32, "{execution:?}");
    let output = json_of(&execution.steps[0].output);
    assert_eq!(output["summary"], "looked at the workspace", "{output}");
    assert!(output.to_string().contains("notes.md"), "{output}");
    drop(child);
    test.shutdown().await;
}
