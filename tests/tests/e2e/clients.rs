//! The cluster driven from outside Rust: the Python client generated from
//! `proto/` (a Python worker runs the sample process and reads notifications),
//! the TypeScript client `buf generate` makes, the README's grpcurl and
//! `buf curl` recipes, and muster's error details as each of them decodes.
//!
//! They need `python3` with grpcio, grpcio-tools and grpcio-status (or
//! `MUSTER_PYTHON` pointing at such an interpreter), `grpcurl` on the PATH
//! (or `MUSTER_GRPCURL`), `buf` on the PATH (or `MUSTER_BUF`) and Node.js
//! with `npm` (or `MUSTER_NPM`); `.ci/run` installs all but Node.js, which
//! the machine has. Without them the tests say so and pass, except under
//! `CI=true`, where that is a failure.

use std::{path::PathBuf, process::Command};

use muster::cluster::{Cluster, Ports};
use muster_tests::{Backend, TestCluster, agent};
use tokio::io::AsyncBufReadExt as _;

pub(super) fn repository() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A tool, or `None` (after saying why) when it is missing outside CI.
pub(super) fn tool(variable: &str, default: &str, probe: &[&str]) -> Option<String> {
    let program = std::env::var(variable).unwrap_or_else(|_| default.to_owned());
    let works = Command::new(&program).args(probe).output().is_ok_and(|output| output.status.success());
    if works {
        return Some(program);
    }
    let message = format!("{program} {} does not work; set {variable} or install it (see .ci/run)", probe.join(" "));
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{message}");
    eprintln!("skipping: {message}");
    None
}

const SAMPLE_AGENTS: &[(&str, &str)] = &[
    ("manager-agent", "content"),
    ("research-agent", "research"),
    ("analyst-agent", "research"),
    ("writer-agent", "content"),
    ("seo-agent", "content"),
    ("editor-agent", "content"),
    ("quality-agent", "content"),
    ("publisher-agent", "content"),
    ("archive-agent", "operations"),
    ("learning-agent", "operations"),
];

/// The sample roster imported as the README does; its tokens file.
async fn import_sample_roster(test: &TestCluster) -> PathBuf {
    let tokens_file = test.data_dir.join("tokens.json");
    let arguments = ["roster", "import", "examples/roster.yaml", "--tokens-file"].map(String::from);
    let arguments = arguments.into_iter().chain([tokens_file.display().to_string()]).collect();
    let imported = muster_tests::command::run(arguments, test.command_environment()).await;
    assert!(imported.status.success(), "{}", muster_tests::command::text(&imported));
    tokens_file
}

/// A README example worker (`program`, already given its arguments but
/// `--tokens`) against the sample roster: with every agent's token it is
/// welcomed (it prints `serving 10 agents`, then is stopped); with only the
/// token of an agent whose role grants none of the tools it offers, it ends
/// at once with the service's refusal and its reason.
async fn example_worker_serves_the_sample_roster(
    mut program: impl FnMut() -> tokio::process::Command,
    tokens_file: &std::path::Path,
) {
    let mut worker = program()
        .arg("--tokens")
        .arg(tokens_file)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(worker.stdout.take().unwrap()).lines();
    let served = tokio::time::timeout(std::time::Duration::from_secs(60), lines.next_line()).await;
    let served = served.ok().and_then(Result::ok).flatten();
    if served.as_deref() != Some("serving 10 agents") {
        let _ = worker.start_kill();
        let output = worker.wait_with_output().await.unwrap();
        panic!("the example worker was not welcomed ({served:?}): {}", String::from_utf8_lossy(&output.stderr));
    }
    worker.kill().await.unwrap();

    let tokens: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(tokens_file).unwrap()).unwrap();
    let archivist = tokens_file.with_file_name("archivist.json");
    std::fs::write(&archivist, serde_json::json!({"archive-agent": tokens["archive-agent"]}).to_string()).unwrap();
    let refused = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        program().arg("--tokens").arg(&archivist).kill_on_drop(true).output(),
    )
    .await
    .expect("a refused worker ends")
    .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(
        stderr.contains("the execution service refused the worker") && stderr.contains("word_count"),
        "the refusal reaches the user with its reason: {stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_runs_the_sample_process() {
    let Some(python) = tool("MUSTER_PYTHON", "python3", &["-c", "import grpc, grpc_tools, setuptools"]) else { return };
    let Some(test) = TestCluster::start(Backend::Sqlite).await else { return };
    let tokens_file = import_sample_roster(&test).await;

    let examples = repository().join("examples/python");
    let python_path = python_client(&test, &python);

    let address = |url: String| url.trim_start_matches("http://").to_owned();
    let operator_token_file = test.data_dir.join(muster::credentials::OPERATOR_TOKEN_FILE);
    let output = tokio::task::spawn_blocking({
        let (execution, notifier) = (address(test.cluster().execution_url()), address(test.cluster().notifier_url()));
        let (python, examples, python_path, tokens_file) =
            (python.clone(), examples.clone(), python_path.clone(), tokens_file.clone());
        move || {
            Command::new(&python)
                .arg(examples.join("run_process.py"))
                .args(["--execution", &execution, "--notifier", &notifier, "--read-notifications-of", "archive-agent"])
                .arg("--tokens")
                .arg(&tokens_file)
                .arg("--operator-token-file")
                .arg(operator_token_file)
                .arg("--process")
                .arg(repository().join("examples/process.yaml"))
                // Inputs of 70 KB: every step's inputs travel by reference.
                // Each step remembers a line in the global memory.
                .arg("--inputs")
                .arg(serde_json::json!({ "brief": "b".repeat(70_000), "remember": "python was here" }).to_string())
                .env("PYTHONPATH", format!("{}:{}", python_path.display(), examples.display()))
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the Python client failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("execution completed; the Python worker ran 6 steps"), "{stdout}");
    assert!(stdout.contains("notification") && stdout.contains("EVENT_TYPE_STEP_COMPLETED research"), "{stdout}");

    // The worker read each step's inputs (`ReadPayload`) before its behaviour ran.
    let id = stdout.split_whitespace().skip_while(|word| *word != "execution").nth(1).expect("the execution's id");
    let request = muster_proto::execution::v1::GetExecutionRequest { id: id.to_owned() };
    let execution = test.execution().get_execution(request).await.unwrap().into_inner().execution.unwrap();
    for step in &execution.steps {
        let output: serde_json::Value = muster_tests::json_of(&step.output);
        assert!(output["inputs_bytes"].as_u64().unwrap() > 70_000, "{}: {output}", step.step_id);
    }
    // What the Python worker asked to remember, one entry per step, written by its agents.
    let global = muster_proto::execution::v1::MemoryScope::Global as i32;
    let request = muster_proto::execution::v1::ListMemoryRequest { scope: global, ..Default::default() };
    let entries = test.execution().list_memory(request).await.unwrap().into_inner().entries;
    assert_eq!(entries.len(), execution.steps.len(), "{entries:?}");
    for entry in &entries {
        assert_eq!((entry.text.as_str(), entry.execution_id.as_str()), ("python was here", id));
        assert!(execution.steps.iter().any(|step| step.executor == entry.author), "{entry:?}");
    }

    // The README's example worker serves the sample roster; refused, it says why.
    let execution = address(test.cluster().execution_url());
    let worker = || {
        let mut command = tokio::process::Command::new(&python);
        command
            .arg(examples.join("serve_agents.py"))
            .args(["--execution", &execution])
            .env("PYTHONPATH", python_path.display().to_string());
        command
    };
    example_worker_serves_the_sample_roster(worker, &tokens_file).await;
    test.shutdown().await;
}

/// The TypeScript client that `buf generate` makes from `proto/` (Connect-ES,
/// in `clients/typescript`) publishes and runs the sample process, served by
/// the Rust sample worker, and reads an agent's notifications as that agent.
/// It is generated, type-checked and built in a copy of the folder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typescript_client_runs_the_sample_process() {
    let Some(npm) = tool("MUSTER_NPM", "npm", &["--version"]) else { return };
    let Some(buf) = tool("MUSTER_BUF", "buf", &["--version"]) else { return };
    let Some(test) = TestCluster::start(Backend::Sqlite).await else { return };
    let tokens_file = import_sample_roster(&test).await;
    let tokens: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&tokens_file).unwrap()).unwrap();
    let credentials = tokens
        .iter()
        .map(|(agent_id, token)| muster::worker::AgentCredential {
            agent_id: agent_id.clone(),
            token: token.as_str().unwrap().to_owned(),
        })
        .collect();
    let (stop_worker, worker) = muster_tests::spawn_sample_worker(test.operator("execution"), credentials);

    let client = typescript_client(&test, npm, buf).await;
    let address = |url: String| url.trim_start_matches("http://").to_owned();
    let (execution, notifier) = (address(test.cluster().execution_url()), address(test.cluster().notifier_url()));
    let operator_token_file = test.data_dir.join(muster::credentials::OPERATOR_TOKEN_FILE);
    let output = tokio::task::spawn_blocking({
        let (client, tokens_file) = (client.clone(), tokens_file.clone());
        move || {
            Command::new("node")
                .arg(client.join("dist/run-process.js"))
                .args(["--execution", &execution, "--notifier", &notifier, "--read-notifications-of", "archive-agent"])
                .arg("--tokens")
                .arg(&tokens_file)
                .arg("--operator-token-file")
                .arg(&operator_token_file)
                .arg("--process")
                .arg(repository().join("examples/process.yaml"))
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "the TypeScript client failed:\n{stdout}\n{stderr}");
    let summary = json(&stdout);
    assert_eq!(
        (&summary["process"], &summary["status"]),
        (&"content-pipeline".into(), &"COMPLETED".into()),
        "{summary}"
    );
    assert_eq!(summary["firstEvent"], "EXECUTION_STARTED", "{summary}");
    assert!(summary["events"].as_u64().unwrap() > 10, "{summary}");
    assert!(summary["notifications"].as_u64().unwrap() > 0, "{summary}");
    // The execution it names is the one that ran.
    let id = summary["executionId"].as_str().unwrap().to_owned();
    let execution = test.execution().get_execution(muster_proto::execution::v1::GetExecutionRequest { id }).await;
    let execution = execution.unwrap().into_inner().execution.unwrap();
    assert_eq!(execution.status, muster_proto::common::v1::ExecutionStatus::Completed as i32);
    let _ = stop_worker.send(());
    worker.await.unwrap().unwrap();

    // The README's example worker serves the sample roster; refused, it says why.
    let execution = address(test.cluster().execution_url());
    let worker = || {
        let mut command = tokio::process::Command::new("node");
        command.arg(client.join("dist/serve-agents.js")).args(["--execution", &execution]);
        command
    };
    example_worker_serves_the_sample_roster(worker, &tokens_file).await;
    test.shutdown().await;
}

/// The Python package of `clients/python` (`muster-client`: the client its
/// `generate.sh` makes from `proto/`, and the worker library), built from a
/// copy in the test's folder and installed into a folder of its own, which
/// the Python programs then import from: that folder.
pub(super) fn python_client(test: &TestCluster, python: &str) -> PathBuf {
    let source = repository().join("clients/python");
    let package = test.data_dir.join("python-package");
    std::fs::create_dir_all(package.join("muster_worker")).unwrap();
    for file in ["pyproject.toml", "README.md"] {
        std::fs::copy(source.join(file), package.join(file)).unwrap();
    }
    for entry in std::fs::read_dir(source.join("muster_worker")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|extension| extension == "py" || extension == "json") {
            std::fs::copy(&path, package.join("muster_worker").join(path.file_name().unwrap())).unwrap();
        }
    }
    let status = Command::new("bash")
        .arg(source.join("generate.sh"))
        .env("PYTHON", python)
        .env("MUSTER_PYTHON_OUT", &package)
        .status()
        .unwrap();
    assert!(status.success(), "generating the Python client failed");
    let installed = test.data_dir.join("python");
    let status = Command::new(python)
        .args(["-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--target"])
        .arg(&installed)
        .arg(&package)
        .status()
        .unwrap();
    assert!(status.success(), "installing the Python package failed");
    installed
}

/// A copy of `clients/typescript` in the test's folder, its dependencies
/// installed (`npm ci`), the client generated there by the repository's
/// `buf.gen.yaml`, and built (`tsc`, which type-checks it): its folder.
pub(super) async fn typescript_client(test: &TestCluster, npm: String, buf: String) -> PathBuf {
    let client = test.data_dir.join("clients/typescript");
    let output_base = test.data_dir.join("proto");
    let source = repository().join("clients/typescript");
    std::fs::create_dir_all(client.join("src")).unwrap();
    for file in ["package.json", "package-lock.json", "tsconfig.json"] {
        std::fs::copy(source.join(file), client.join(file)).unwrap();
    }
    for entry in std::fs::read_dir(source.join("src")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|extension| extension == "ts" || extension == "json") {
            std::fs::copy(&path, client.join("src").join(path.file_name().unwrap())).unwrap();
        }
    }
    let folder = client.clone();
    tokio::task::spawn_blocking(move || {
        let run = |command: &mut Command, what: &str| {
            let output = command.output().unwrap();
            assert!(
                output.status.success(),
                "{what} failed:\n{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        };
        run(Command::new(&npm).args(["ci", "--no-audit", "--no-fund"]).current_dir(&folder), "npm ci");
        // The repository's generation template, writing into the copy.
        let path =
            format!("{}:{}", folder.join("node_modules/.bin").display(), std::env::var("PATH").unwrap_or_default());
        run(
            Command::new(&buf)
                .arg("generate")
                .arg("-o")
                .arg(&output_base)
                .current_dir(repository().join("proto"))
                .env("PATH", path),
            "buf generate",
        );
        run(Command::new(folder.join("node_modules/.bin/tsc")).args(["-p", "."]).current_dir(&folder), "tsc");
    })
    .await
    .unwrap();
    client
}

/// The TypeScript worker (`clients/typescript/src/worker.ts`, on the
/// generated client) serves the sample process across a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typescript_worker_serves_the_sample_process_across_a_restart() {
    let Some(npm) = tool("MUSTER_NPM", "npm", &["--version"]) else { return };
    let Some(buf) = tool("MUSTER_BUF", "buf", &["--version"]) else { return };
    let Some(mut test) = TestCluster::start(Backend::Sqlite).await else { return };
    let tokens_file = sample_agents(&test).await;
    let client = typescript_client(&test, npm, buf).await;
    let mut worker = tokio::process::Command::new("node");
    worker.arg(client.join("dist/serve-agents.js"));
    serves_the_sample_process_across_a_restart(&mut test, worker, &tokens_file, "typescript").await;
    test.shutdown().await;
}

/// The Python worker (`muster_worker`, in `clients/python`) serves the sample
/// process across a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_worker_serves_the_sample_process_across_a_restart() {
    let Some(python) = tool("MUSTER_PYTHON", "python3", &["-c", "import grpc, grpc_tools, setuptools"]) else { return };
    let Some(mut test) = TestCluster::start(Backend::Sqlite).await else { return };
    let tokens_file = sample_agents(&test).await;
    let python_path = python_client(&test, &python);
    let examples = repository().join("examples/python");
    let mut worker = tokio::process::Command::new(python);
    worker
        .arg(examples.join("serve_agents.py"))
        .env("PYTHONPATH", format!("{}:{}", python_path.display(), examples.display()));
    serves_the_sample_process_across_a_restart(&mut test, worker, &tokens_file, "python").await;
    test.shutdown().await;
}

/// The sample process's agents, registered, allowed to hand steps onward,
/// their role permitting the tool `word_count`; the file of their tokens.
async fn sample_agents(test: &TestCluster) -> PathBuf {
    let member = muster_proto::roster::v1::RoleDefinition {
        name: "member".to_owned(),
        tools: vec!["word_count".to_owned()],
        ..Default::default()
    };
    let request = muster_proto::roster::v1::PutRoleDefinitionRequest { role: Some(member) };
    test.roster().put_role_definition(request).await.unwrap();
    let agents: Vec<_> = SAMPLE_AGENTS
        .iter()
        .map(|(id, team)| muster_proto::roster::v1::Agent { allow_delegation: true, ..agent(id, "member", team) })
        .collect();
    let tokens = test.register_agents(&agents).await;
    let tokens: serde_json::Map<String, serde_json::Value> =
        agents.iter().zip(tokens).map(|(agent, token)| (agent.id.clone(), token.into())).collect();
    let tokens_file = test.data_dir.join("tokens.json");
    std::fs::write(&tokens_file, serde_json::Value::Object(tokens).to_string()).unwrap();
    tokens_file
}

/// A worker of another language (`worker`, a command that takes
/// `--execution` and `--tokens`) serves every step of the sample process
/// after connecting again by itself when the execution service restarts; it
/// reads inputs too large for an assignment (`ReadPayload`) as its agents,
/// reports memory notes, provides the tool `word_count` and invokes it from
/// its behaviour, hands a step onward (and reports it itself when the
/// service refuses a loop), stops a step the service withdraws, and stops
/// cleanly on SIGTERM, saying what it did.
async fn serves_the_sample_process_across_a_restart(
    test: &mut TestCluster,
    mut worker: tokio::process::Command,
    tokens_file: &std::path::Path,
    language: &str,
) {
    let execution = test.cluster().execution_url().trim_start_matches("http://").to_owned();
    let mut worker = worker
        .args(["--execution", &execution])
        .arg("--tokens")
        .arg(tokens_file)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut printed = tokio::io::BufReader::new(worker.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(std::time::Duration::from_secs(60), printed.next_line()).await;
    assert_eq!(first.unwrap().unwrap().as_deref(), Some("serving 10 agents"));

    // The worker connects again by itself.
    test.cluster_mut().stop("execution").await.unwrap();
    test.cluster_mut().restart("execution").await.unwrap();
    let source = std::fs::read_to_string(repository().join("examples/process.yaml")).unwrap();
    let mut execution_client = test.execution();
    let process = execution_client
        .publish_process(muster_proto::execution::v1::PublishProcessRequest { source, file_name: String::new() })
        .await
        .unwrap()
        .into_inner()
        .process
        .unwrap();
    // Inputs of 70 KB: every step's inputs travel by reference.
    let remembered = format!("{language} was here");
    let inputs =
        serde_json::json!({ "brief": "b".repeat(70_000), "remember": remembered, "count_words": true }).to_string();
    let request = muster_proto::execution::v1::StartExecutionRequest {
        process_name: process.name,
        inputs: muster_tests::object(&inputs),
        ..Default::default()
    };
    let started = execution_client.start_execution(request).await.unwrap().into_inner().execution.unwrap();
    let events = muster_tests::events_until_finished(&test.operator("execution"), &started.id).await;
    let last = events.last().unwrap();
    assert_eq!(last.execution_status, muster_proto::common::v1::ExecutionStatus::Completed as i32, "{events:#?}");
    let request = muster_proto::execution::v1::GetExecutionRequest { id: started.id.clone() };
    let execution = execution_client.get_execution(request).await.unwrap().into_inner().execution.unwrap();
    assert_eq!(execution.steps.len(), 6);
    for step in &execution.steps {
        let output = muster_tests::json_of(&step.output);
        let text = output["text"].as_str().unwrap_or_default();
        assert!(text.starts_with(&format!("{} ({language}) did: ", step.executor)), "{}: {output}", step.step_id);
        assert_eq!((step.tokens_used, step.cost), (42, 0.02), "{}: the tokens and cost reported", step.step_id);
        assert!(output["inputs_bytes"].as_u64().unwrap() > 70_000, "{}: {output}", step.step_id);
        // Counted by the tool the worker provides, invoked from its behaviour.
        assert!(output["words"].as_u64().is_some_and(|words| words > 0), "{}: {output}", step.step_id);
    }
    // The tool answers an agent's InvokeTool, from the worker.
    let tokens: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(tokens_file).unwrap()).unwrap();
    let mut request = tonic::Request::new(muster_proto::execution::v1::InvokeToolRequest {
        tool: "word_count".to_owned(),
        input: muster_tests::object(r#"{"text": "three little words"}"#),
        execution_id: String::new(),
    });
    let token = tokens["writer-agent"].as_str().unwrap();
    request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
    let counted = execution_client.invoke_tool(request).await.unwrap().into_inner().output.unwrap();
    assert_eq!(
        (counted.status_code, muster_tests::json_of(&counted.output)),
        (200, serde_json::json!({ "words": 3 })),
        "{counted:?}"
    );
    let global = muster_proto::execution::v1::MemoryScope::Global as i32;
    let request = muster_proto::execution::v1::ListMemoryRequest { scope: global, ..Default::default() };
    let entries = execution_client.list_memory(request).await.unwrap().into_inner().entries;
    assert_eq!(entries.len(), 6, "{entries:?}");
    assert!(entries.iter().all(|entry| entry.text == remembered && entry.execution_id == started.id));

    // Onward delegation: the writer hands the step to the editor, whose
    // attempt to hand it back is a loop, refused: the editor does it.
    let relay = "name: relay\nsteps:\n  - id: relay\n    type: agent_task\n    agent: writer-agent\n    message: pass it on\n    inputs: {delegate: {writer-agent: editor-agent, editor-agent: writer-agent}}\n";
    let id = muster_tests::publish_and_start(&mut execution_client, relay).await;
    let events = muster_tests::events_until_finished(&test.operator("execution"), &id).await;
    let last = events.last().unwrap();
    assert_eq!(last.execution_status, muster_proto::common::v1::ExecutionStatus::Completed as i32, "{events:#?}");
    let request = muster_proto::execution::v1::GetExecutionRequest { id };
    let relayed = execution_client.get_execution(request).await.unwrap().into_inner().execution.unwrap();
    let step = &relayed.steps[0];
    let output = muster_tests::json_of(&step.output);
    assert_eq!(step.executor, "editor-agent", "{output}");
    assert!(output["text"].as_str().unwrap().starts_with(&format!("editor-agent ({language}) did: ")), "{output}");
    let refused = output["delegation_refused"].as_str().unwrap_or_default();
    assert!(refused.starts_with("delegation loop: writer-agent -> editor-agent -> writer-agent"), "{output}");

    // Cancelling the execution withdraws a running step from the worker,
    // which stops its behaviour and reports nothing.
    let nap = "name: nap\nsteps:\n  - id: nap\n    type: agent_task\n    agent: writer-agent\n    message: wait\n    inputs: {sleep_ms: 120000}\n";
    let id = muster_tests::publish_and_start(&mut execution_client, nap).await;
    let line = tokio::time::timeout(std::time::Duration::from_secs(30), printed.next_line()).await.unwrap().unwrap();
    assert_eq!(line.as_deref(), Some("napping nap"));
    let cancel = muster_proto::execution::v1::CancelExecutionRequest { id, reason: "enough".to_owned() };
    execution_client.cancel_execution(cancel).await.unwrap();
    let line = tokio::time::timeout(std::time::Duration::from_secs(30), printed.next_line()).await.unwrap().unwrap();
    assert_eq!(line.as_deref(), Some("withdrawn nap"));

    // SIGTERM stops it cleanly, saying what it did.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(worker.id().unwrap() as i32), nix::sys::signal::Signal::SIGTERM)
        .unwrap();
    let last = tokio::time::timeout(std::time::Duration::from_secs(30), printed.next_line()).await.unwrap().unwrap();
    let last = last.unwrap_or_default();
    // The six steps, the relay's accepted delegation and the editor's step;
    // not the withdrawn nap.
    assert!(last.starts_with("stopped after 8 assignments and "), "{last}");
    let connections: u32 = last.split_whitespace().nth(5).unwrap().parse().unwrap();
    assert!(connections >= 2, "{last}");
    assert!(worker.wait().await.unwrap().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcurl_recipes_work_without_proto_files() {
    let Some(grpcurl) = tool("MUSTER_GRPCURL", "grpcurl", &["-version"]) else { return };
    let recipes = readme_recipes("grpcurl");
    assert!(recipes.len() >= 5, "the README's grpcurl recipes: {recipes:?}");
    let Some(test) = TestCluster::start(Backend::Sqlite).await else { return };
    let tokens = test.register_agents(&[agent("writer-agent", "writer", "content")]).await;
    let runner = RecipeRunner::new(grpcurl, test.cluster(), &tokens[0]);
    // The process the README starts, here with one step.
    let source = "name: content-pipeline\nsteps:\n  - id: draft\n    type: agent_task\n    agent: writer-agent\n    message: Write\n";
    let request =
        muster_proto::execution::v1::PublishProcessRequest { source: source.to_owned(), file_name: String::new() };
    test.execution().publish_process(request).await.unwrap();

    let mut checked = Vec::new();
    for recipe in &recipes {
        let target = runner.target(recipe);
        let position = recipe.iter().position(|word| *word == target.readme).unwrap();
        match recipe.get(position + 1).map(String::as_str) {
            Some("list") => {
                // Listed alike by every service: run against each.
                for service in &runner.services {
                    assert_lists_only(service, &runner.run(recipe, service));
                }
                checked.push("list");
            }
            Some("describe") => {
                let described = runner.run(recipe, target);
                assert!(described.contains(&format!("{} is a service", target.name)), "{described}");
                assert!(described.contains("rpc "), "{described}");
                checked.push("describe");
            }
            Some("grpc.health.v1.Health/Check") => {
                for service in &runner.services {
                    assert_serving(service, &runner.run(recipe, service));
                }
                checked.push("health");
            }
            Some("muster.roster.v1.RosterService/ListAgents") => {
                assert_only_writer_agent(&runner.run(recipe, target));
                checked.push("list agents");
            }
            Some("muster.validator.v1.ValidatorService/ValidateProcess") => {
                assert_empty_process_refused(&runner.run(recipe, target));
                checked.push("validate");
            }
            Some("muster.notifier.v1.NotifierService/ListNotifications") => {
                assert_own_inbox_read(&runner.run(recipe, target));
                checked.push("agent inbox");
            }
            Some("muster.execution.v1.ExecutionService/StartExecution") => {
                // JSON values travel as plain JSON, durations and types under their own names.
                let started = json(&runner.run(recipe, target));
                let execution = &started["execution"];
                assert_eq!(execution["inputs"], serde_json::json!({"topic": "rust", "words": 800}), "{started}");
                assert_eq!(execution["steps"][0]["stepType"], "agent_task", "{started}");
                checked.push("start with inputs");
            }
            _ => panic!("no check for the README recipe {recipe:?}: add one here"),
        }
    }
    assert_eq!(
        checked,
        ["list", "describe", "health", "list agents", "validate", "agent inbox", "start with inputs"],
        "the README's grpcurl recipes"
    );
    test.shutdown().await;
}

/// A service as the README's recipes call it and as it runs in the test cluster.
struct Service {
    name: &'static str,
    /// The gRPC services its server serves, as listed (sorted).
    serves: Vec<&'static str>,
    /// `127.0.0.1:<default port>`, as the README writes it.
    readme: String,
    /// `127.0.0.1:<port>` where it runs here.
    here: String,
}

/// Runs the README's recipes of one tool against the test cluster, each with
/// the README's address of a service swapped for where it runs here, and its
/// credentials for the test cluster's.
struct RecipeRunner {
    program: String,
    services: Vec<Service>,
    operator_token: String,
    agent_token: String,
}

impl RecipeRunner {
    fn new(program: String, cluster: &Cluster, agent_token: &str) -> Self {
        let defaults = Ports::default();
        let service = |name, port: u16, url: String| Service {
            name,
            serves: if name == "muster.roster.v1.RosterService" {
                vec!["muster.roster.v1.CredentialService", name]
            } else {
                vec![name]
            },
            readme: format!("127.0.0.1:{port}"),
            here: url.trim_start_matches("http://").to_owned(),
        };
        let services = vec![
            service("muster.execution.v1.ExecutionService", defaults.execution, cluster.execution_url()),
            service("muster.roster.v1.RosterService", defaults.roster, cluster.roster_url()),
            service("muster.validator.v1.ValidatorService", defaults.validator, cluster.validator_url()),
            service("muster.notifier.v1.NotifierService", defaults.notifier, cluster.notifier_url()),
        ];
        Self {
            program,
            services,
            operator_token: cluster.credentials.operator_token.clone(),
            agent_token: agent_token.to_owned(),
        }
    }

    /// The service a recipe calls, by the README's address in it.
    fn target(&self, recipe: &[String]) -> &Service {
        self.services
            .iter()
            .find(|service| recipe.iter().any(|word| word.contains(&service.readme)))
            .unwrap_or_else(|| panic!("{recipe:?} does not call one of the default addresses"))
    }

    /// Runs `recipe` against `on` (whichever service the recipe names) and returns what it printed.
    fn run(&self, recipe: &[String], on: &Service) -> String {
        let target = self.target(recipe);
        let arguments = recipe[1..].iter().map(|word| {
            word.replace(&target.readme, &on.here)
                .replace(OPERATOR_TOKEN, &self.operator_token)
                .replace(AGENT_TOKEN, &self.agent_token)
        });
        let output = Command::new(&self.program).args(arguments).output().unwrap();
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "{recipe:?} on {}: {text}{}",
            on.here,
            String::from_utf8_lossy(&output.stderr)
        );
        text
    }
}

/// A service lists health, both reflection versions and what it serves, nothing else.
fn assert_lists_only(service: &Service, listed: &str) {
    let mut expected = vec![
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    ];
    expected.extend(&service.serves);
    assert_eq!(listed.lines().collect::<Vec<_>>(), expected, "{}", service.here);
}

fn assert_serving(service: &Service, answer: &str) {
    let health = json(answer);
    assert_eq!(health["status"], "SERVING", "{}: {health}", service.here);
}

/// The test registers one agent, `writer-agent`.
fn assert_only_writer_agent(answer: &str) {
    let agents = json(answer);
    assert_eq!(agents["agents"][0]["id"], "writer-agent", "{agents}");
    assert_eq!(agents["agents"].as_array().map(Vec::len), Some(1), "{agents}");
}

/// The README validates `name: p` with no steps: refused with PRC006 at line 2.
fn assert_empty_process_refused(answer: &str) {
    let report = json(answer);
    assert_eq!(report["processName"], "p", "{report}");
    let diagnostic = &report["diagnostics"][0];
    assert_eq!(
        (&diagnostic["code"], &diagnostic["severity"], &diagnostic["line"]),
        (&"PRC006".into(), &"SEVERITY_ERROR".into(), &2.into()),
        "{report}"
    );
}

/// The writer reads its own inbox, empty in this test: an empty answer.
fn assert_own_inbox_read(answer: &str) {
    let inbox = json(answer);
    assert!(inbox.get("notifications").is_none_or(|notifications| notifications.as_array().is_some()), "{inbox}");
}

/// A tool's JSON answer.
fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|error| panic!("{error}: {text}"))
}

/// How the README's recipes give a credential, and the words that stand for
/// it once read: the local operator's token, and an agent's.
const CREDENTIALS: [(&str, &str); 2] = [
    (r#""authorization: Bearer $(cat muster-data/operator.token)""#, "'authorization: Bearer @OPERATOR_TOKEN@'"),
    (r#""authorization: Bearer $AGENT_TOKEN""#, "'authorization: Bearer @AGENT_TOKEN@'"),
];
const OPERATOR_TOKEN: &str = "@OPERATOR_TOKEN@";
const AGENT_TOKEN: &str = "@AGENT_TOKEN@";

/// The README's recipes for `program`: every line of a `sh` block that starts
/// with `program` and a space, split into arguments as the shell would (the
/// recipes quote with single quotes only, but for the credentials of
/// [`CREDENTIALS`]; other shell syntax is refused, so a recipe this cannot
/// read fails the test instead of being misread).
fn readme_recipes(program: &str) -> Vec<Vec<String>> {
    let readme = std::fs::read_to_string(repository().join("README.md")).unwrap();
    let mut recipes = Vec::new();
    let mut in_shell_block = false;
    for line in readme.lines() {
        match line.trim() {
            "```sh" => in_shell_block = true,
            "```" => in_shell_block = false,
            recipe if in_shell_block && recipe.starts_with(&format!("{program} ")) => {
                let recipe =
                    CREDENTIALS.iter().fold(recipe.to_owned(), |recipe, (written, read)| recipe.replace(written, read));
                recipes.push(shell_words(&recipe));
            }
            _ => {}
        }
    }
    recipes
}

/// Splits a command line into words: blanks separate them, single quotes
/// keep everything up to the next single quote literally.
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut characters = line.chars();
    while let Some(character) = characters.next() {
        match character {
            ' ' | '\t' => words.extend(word.take()),
            '\'' => {
                let quoted: String = characters.by_ref().take_while(|&c| c != '\'').collect();
                word.get_or_insert_with(String::new).push_str(&quoted);
            }
            '"' | '\\' | '$' | '`' | '|' | '&' | ';' | '<' | '>' | '(' | ')' | '#' | '*' | '?' => {
                panic!("README recipe with shell syntax the test does not read ({character:?}): {line}")
            }
            other => word.get_or_insert_with(String::new).push(other),
        }
    }
    words.extend(word);
    words
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buf_curl_recipes_work_without_proto_files() {
    let Some(buf) = tool("MUSTER_BUF", "buf", &["--version"]) else { return };
    let recipes = readme_recipes("buf");
    assert!(recipes.len() >= 4, "the README's buf curl recipes: {recipes:?}");
    let Some(test) = TestCluster::start(Backend::Sqlite).await else { return };
    let tokens = test.register_agents(&[agent("writer-agent", "writer", "content")]).await;
    let runner = RecipeRunner::new(buf, test.cluster(), &tokens[0]);

    let mut checked = Vec::new();
    for recipe in &recipes {
        assert_eq!(recipe[..2], ["buf", "curl"], "{recipe:?}");
        let target = runner.target(recipe);
        let url = recipe.last().unwrap();
        if recipe.iter().any(|word| word == "--list-services") {
            // Listed alike by every service: run against each.
            for service in &runner.services {
                assert_lists_only(service, &runner.run(recipe, service));
            }
            checked.push("list services");
        } else if recipe.iter().any(|word| word == "--list-methods") {
            // Every listed service is described, each method named in full.
            for service in &runner.services {
                let methods = runner.run(recipe, service);
                let methods: Vec<&str> = methods.lines().collect();
                for expected in [
                    "grpc.health.v1.Health/Check",
                    "grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
                    "grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                ] {
                    assert!(methods.contains(&expected), "{}: {expected} missing from {methods:?}", service.here);
                }
                let own = methods.iter().filter(|method| method.starts_with(&format!("{}/", service.name))).count();
                assert!(own >= 3, "{}: the methods of {}: {methods:?}", service.here, service.name);
            }
            checked.push("list methods");
        } else if url.ends_with("/grpc.health.v1.Health/Check") {
            for service in &runner.services {
                assert_serving(service, &runner.run(recipe, service));
            }
            checked.push("health");
        } else if url.ends_with("/muster.roster.v1.RosterService/ListAgents") {
            assert_only_writer_agent(&runner.run(recipe, target));
            checked.push("list agents");
        } else if url.ends_with("/muster.validator.v1.ValidatorService/ValidateProcess") {
            assert_empty_process_refused(&runner.run(recipe, target));
            checked.push("validate");
        } else if url.ends_with("/muster.notifier.v1.NotifierService/ListNotifications") {
            assert_own_inbox_read(&runner.run(recipe, target));
            checked.push("agent inbox");
        } else {
            panic!("no check for the README recipe {recipe:?}: add one here");
        }
    }
    assert_eq!(
        checked,
        ["list services", "list methods", "health", "list agents", "validate", "agent inbox"],
        "the README's buf curl recipes"
    );
    test.shutdown().await;
}

#[test]
fn recipes_split_as_the_shell_splits_them() {
    assert_eq!(
        shell_words(r#"buf curl -d '{"source":"a: b\n"}'  http://h/x"#),
        ["buf", "curl", "-d", r#"{"source":"a: b\n"}"#, "http://h/x"]
    );
    assert_eq!(shell_words("grpcurl -d '' x'y z'"), ["grpcurl", "-d", "", "xy z"]);
}

/// A refusal, as each client is asked to show it: the status code's name
/// and the `google.rpc.Status` details it decoded, each with its `@type`.
struct Refusal {
    code: String,
    details: Vec<serde_json::Value>,
}

impl Refusal {
    /// The detail of type `name` (`google.rpc.BadRequest`).
    fn detail(&self, name: &str) -> &serde_json::Value {
        let type_url = format!("type.googleapis.com/{name}");
        self.details
            .iter()
            .find(|detail| detail["@type"] == type_url.as_str())
            .unwrap_or_else(|| panic!("no {name} among {:#?}", self.details))
    }
}

/// A call that muster refuses, and what its status must carry.
struct RefusedCall {
    service: &'static str,
    method: &'static str,
    request: serde_json::Value,
    /// The caller's token; `None` for a call without credentials.
    token: Option<String>,
    code: &'static str,
    check: fn(&Refusal),
}

/// The same refusals, decoded by grpcurl, buf curl and Python's
/// `grpc_status`: each sees the code and every standard detail (and the
/// findings of a refused document with their lines and columns).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_details_decode_in_grpcurl_buf_curl_and_python() {
    let Some(grpcurl) = tool("MUSTER_GRPCURL", "grpcurl", &["-version"]) else { return };
    let Some(buf) = tool("MUSTER_BUF", "buf", &["--version"]) else { return };
    let Some(python) = tool("MUSTER_PYTHON", "python3", &["-c", "import grpc, grpc_tools, grpc_status, setuptools"])
    else {
        return;
    };
    let Some(mut test) = TestCluster::start(Backend::Sqlite).await else { return };
    let tokens = test.register_agents(&[agent("writer-agent", "writer", "content")]).await;
    let operator = test.cluster().credentials.operator_token.clone();
    let process = muster_tests::chain_process("errors", 1, "writer-agent", "writer-agent", "{}");
    muster_tests::publish_and_start(&mut test.execution(), &process).await;
    // A process that has used the one run its budget allows.
    let limited = muster_tests::chain_process("limited", 1, "writer-agent", "writer-agent", "{}");
    muster_tests::publish_and_start(&mut test.execution(), &limited).await;
    let budget = muster_proto::execution::v1::Budget {
        scope: muster_proto::execution::v1::BudgetScope::Process as i32,
        name: "limited".to_owned(),
        period: Some(muster_runtime::time::seconds_to_duration(3600)),
        max_runs: 1,
        ..Default::default()
    };
    let request = muster_proto::execution::v1::SetBudgetRequest { budget: Some(budget) };
    test.execution().set_budget(request).await.unwrap();
    let python_path = python_client(&test, &python);

    let broken = "name: broken\nsteps:\n  - id: only\n    type: agent_task\n    agent: writer-agent\n    message: Write\n    roles:\n      monitors: [writer-agent]\n";
    let mut calls = vec![
        RefusedCall {
            service: "execution",
            method: "muster.execution.v1.ExecutionService/PublishProcess",
            request: serde_json::json!({ "source": broken, "fileName": "broken.yaml" }),
            token: Some(operator.clone()),
            code: "INVALID_ARGUMENT",
            check: |refusal| {
                let info = refusal.detail("google.rpc.ErrorInfo");
                assert_eq!((&info["reason"], &info["domain"]), (&"INVALID_PROCESS".into(), &"muster.dev".into()));
                let violations = refusal.detail("google.rpc.BadRequest")["fieldViolations"].as_array().unwrap().clone();
                let executor = violations.iter().find(|violation| violation["reason"] == "EMI002").unwrap();
                assert_eq!(executor["field"], "source");
                let description = executor["description"].as_str().unwrap();
                assert!(description.starts_with("line 7, column 5 (steps[0].roles): "), "{description}");
                let finding = refusal.detail("muster.common.v1.Diagnostic");
                assert_eq!((&finding["line"], &finding["column"]), (&7.into(), &5.into()), "{finding}");
            },
        },
        RefusedCall {
            service: "execution",
            method: "muster.execution.v1.ExecutionService/GetExecution",
            request: serde_json::json!({ "id": "no-such-execution" }),
            token: Some(operator.clone()),
            code: "NOT_FOUND",
            check: |refusal| {
                let resource = refusal.detail("google.rpc.ResourceInfo");
                assert_eq!(resource["resourceType"], "muster.execution.v1.Execution");
                assert_eq!(resource["resourceName"], "no-such-execution");
            },
        },
        RefusedCall {
            service: "roster",
            method: "muster.roster.v1.RosterService/RemoveTeam",
            request: serde_json::json!({ "name": "content" }),
            token: Some(operator.clone()),
            code: "FAILED_PRECONDITION",
            check: |refusal| {
                let violation = &refusal.detail("google.rpc.PreconditionFailure")["violations"][0];
                assert_eq!(
                    (&violation["type"], &violation["subject"]),
                    (&"TEAM_NOT_EMPTY".into(), &"team/content".into())
                );
            },
        },
        RefusedCall {
            service: "roster",
            method: "muster.roster.v1.RosterService/RegisterAgent",
            request: serde_json::json!({ "agent": { "id": "x".repeat(65), "team": "content" } }),
            token: Some(operator.clone()),
            code: "INVALID_ARGUMENT",
            check: |refusal| {
                let violation = &refusal.detail("google.rpc.BadRequest")["fieldViolations"][0];
                assert_eq!(violation["field"], "agent.id", "{violation}");
            },
        },
        RefusedCall {
            service: "execution",
            method: "muster.execution.v1.ExecutionService/StartExecution",
            request: serde_json::json!({ "processName": "limited" }),
            token: Some(operator.clone()),
            code: "RESOURCE_EXHAUSTED",
            check: |refusal| {
                let violation = &refusal.detail("google.rpc.QuotaFailure")["violations"][0];
                assert_eq!(violation["subject"], "process:limited", "{violation}");
                let description = violation["description"].as_str().unwrap_or_default();
                assert!(description.starts_with("1 of 1 runs in the last 3600 s"), "{violation}");
            },
        },
        RefusedCall {
            service: "roster",
            method: "muster.roster.v1.RosterService/ListAgents",
            request: serde_json::json!({}),
            token: None,
            code: "UNAUTHENTICATED",
            check: |refusal| assert_eq!(refusal.detail("google.rpc.ErrorInfo")["reason"], "CREDENTIAL_MISSING"),
        },
        RefusedCall {
            service: "roster",
            method: "muster.roster.v1.RosterService/RemoveAgent",
            request: serde_json::json!({ "id": "writer-agent" }),
            token: Some(tokens[0].clone()),
            code: "PERMISSION_DENIED",
            check: |refusal| {
                let info = refusal.detail("google.rpc.ErrorInfo");
                assert_eq!(info["reason"], "CALLER_KIND_NOT_ALLOWED", "{info}");
                assert_eq!(
                    (&info["metadata"]["caller"], &info["metadata"]["caller_kind"]),
                    (&"writer-agent".into(), &"agent".into())
                );
            },
        },
    ];
    check_refusals(&calls, &test, &grpcurl, &buf, &python, &python_path).await;

    // With the roster down, a start that needs it is UNAVAILABLE, to be retried.
    test.cluster_mut().stop("roster").await.unwrap();
    calls = vec![RefusedCall {
        service: "execution",
        method: "muster.execution.v1.ExecutionService/StartExecution",
        request: serde_json::json!({ "processName": "errors" }),
        token: Some(operator),
        code: "UNAVAILABLE",
        check: |refusal| {
            assert_eq!(refusal.detail("google.rpc.RetryInfo")["retryDelay"], "1s");
            let info = refusal.detail("google.rpc.ErrorInfo");
            assert_eq!(
                (&info["reason"], &info["metadata"]["dependency"]),
                (&"DEPENDENCY_UNAVAILABLE".into(), &"roster".into())
            );
        },
    }];
    check_refusals(&calls, &test, &grpcurl, &buf, &python, &python_path).await;
    test.shutdown().await;
}

async fn check_refusals(
    calls: &[RefusedCall],
    test: &TestCluster,
    grpcurl: &str,
    buf: &str,
    python: &str,
    python_path: &std::path::Path,
) {
    for call in calls {
        let url = match call.service {
            "execution" => test.cluster().execution_url(),
            "roster" => test.cluster().roster_url(),
            other => panic!("no service {other}"),
        };
        let address = url.trim_start_matches("http://").to_owned();
        let request = call.request.to_string();
        let header = call.token.as_ref().map(|token| format!("authorization: Bearer {token}"));

        let mut grpcurl = Command::new(grpcurl);
        grpcurl.args(["-plaintext", "-format-error", "-d", &request]);
        if let Some(header) = &header {
            grpcurl.args(["-H", header]);
        }
        let answer = refused_with(grpcurl.args([&address, call.method]), call.method, false);
        let refusal = Refusal {
            code: muster_runtime::status::code_name(tonic::Code::from_i32(
                answer["code"].as_i64().unwrap_or_default() as i32
            ))
            .to_owned(),
            details: answer["details"].as_array().cloned().unwrap_or_default(),
        };
        check_refusal(call, "grpcurl", &refusal);

        let mut buf = Command::new(buf);
        buf.args(["curl", "--protocol", "grpc", "--http2-prior-knowledge", "-d", &request]);
        if let Some(header) = &header {
            buf.args(["-H", header]);
        }
        let answer = refused_with(buf.arg(format!("{url}/{}", call.method)), call.method, false);
        // buf curl prints each detail as its type and its bytes (base64),
        // as the Connect protocol writes them: decoded here by type.
        let details = answer["details"].as_array().cloned().unwrap_or_default();
        let refusal = Refusal {
            code: answer["code"].as_str().unwrap_or_default().to_uppercase(),
            details: details
                .iter()
                .map(|detail| decode_detail(detail["type"].as_str().unwrap(), detail["value"].as_str().unwrap()))
                .collect(),
        };
        check_refusal(call, "buf curl", &refusal);

        let mut python = Command::new(python);
        python.arg(repository().join("examples/python/call.py")).args([&address, call.method, &request]);
        if let Some(token) = &call.token {
            python.args(["--token", token]);
        }
        python.env("PYTHONPATH", python_path);
        let answer = refused_with(&mut python, call.method, true);
        let refusal = Refusal {
            code: answer["code"].as_str().unwrap_or_default().to_owned(),
            details: answer["details"].as_array().cloned().unwrap_or_default(),
        };
        check_refusal(call, "python", &refusal);
    }
}

/// Runs a client that must fail, and reads the JSON status it printed (on
/// stdout for the Python client, on stderr for grpcurl and buf curl).
fn refused_with(command: &mut Command, method: &str, on_stdout: bool) -> serde_json::Value {
    let output = command.output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(!output.status.success(), "{method} was not refused: {stdout}{stderr}");
    let printed = if on_stdout { &stdout } else { &stderr };
    serde_json::from_str(printed).unwrap_or_else(|error| panic!("{method}: {error}: {stdout}{stderr}"))
}

fn check_refusal(call: &RefusedCall, client: &str, refusal: &Refusal) {
    assert_eq!(refusal.code, call.code, "{client}, {}: {:#?}", call.method, refusal.details);
    let unknown: Vec<_> =
        refusal.details.iter().filter(|detail| detail.get("undecoded").or(detail.get("@error")).is_some()).collect();
    assert!(unknown.is_empty(), "{client}, {}: details it could not decode: {unknown:?}", call.method);
    (call.check)(refusal);
}

/// A detail given by type name (`google.rpc.BadRequest`) and base64 bytes,
/// as JSON with its `@type`; `{"undecoded": ...}` when the bytes are not a
/// message of that type.
fn decode_detail(name: &str, value: &str) -> serde_json::Value {
    use base64::Engine as _;
    let mut pool = prost_reflect::DescriptorPool::global();
    pool.decode_file_descriptor_set(muster_proto::FILE_DESCRIPTOR_SET).unwrap();
    pool.decode_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET).unwrap();
    let type_url = format!("type.googleapis.com/{name}");
    let bytes = base64::engine::general_purpose::STANDARD_NO_PAD.decode(value.trim_end_matches('=')).unwrap();
    let decoded = pool
        .get_message_by_name(name)
        .and_then(|descriptor| prost_reflect::DynamicMessage::decode(descriptor, bytes.as_slice()).ok());
    match decoded {
        Some(message) => {
            let mut json = serde_json::to_value(&message).unwrap();
            json["@type"] = type_url.into();
            json
        }
        None => serde_json::json!({ "@type": type_url, "undecoded": value }),
    }
}
