//! The cluster driven from outside Rust: the Python client generated from
//! `proto/` (a Python worker runs the sample process and reads notifications),
//! and the README's grpcurl recipes.
//!
//! They need `python3` with grpcio and grpcio-tools (or `MUSTER_PYTHON`
//! pointing at such an interpreter) and `grpcurl` on the PATH (or
//! `MUSTER_GRPCURL`); `.ci/run` installs both. Without them the tests say so
//! and pass, except under `CI=true`, where that is a failure.

use std::{path::PathBuf, process::Command};

use muster_tests::{Backend, TestCluster, agent};

fn repository() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A tool, or `None` (after saying why) when it is missing outside CI.
fn tool(variable: &str, default: &str, probe: &[&str]) -> Option<String> {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_runs_the_sample_process() {
    let Some(python) = tool("MUSTER_PYTHON", "python3", &["-c", "import grpc, grpc_tools"]) else { return };
    let Some(test) = TestCluster::start(Backend::Sqlite).await else { return };
    let agents: Vec<_> = SAMPLE_AGENTS.iter().map(|(id, team)| agent(id, "member", team)).collect();
    let tokens = test.register_agents(&agents).await;
    let tokens: serde_json::Map<String, serde_json::Value> =
        agents.iter().zip(tokens).map(|(agent, token)| (agent.id.clone(), token.into())).collect();
    let tokens_file = test.data_dir.join("tokens.json");
    std::fs::write(&tokens_file, serde_json::Value::Object(tokens).to_string()).unwrap();

    let examples = repository().join("examples/python");
    let generated = test.data_dir.join("python");
    let status = Command::new("bash")
        .arg(examples.join("generate.sh"))
        .env("PYTHON", &python)
        .env("MUSTER_PYTHON_OUT", &generated)
        .status()
        .unwrap();
    assert!(status.success(), "generating the Python client failed");

    let address = |url: String| url.trim_start_matches("http://").to_owned();
    let output = tokio::task::spawn_blocking({
        let (execution, notifier) = (address(test.cluster().execution_url()), address(test.cluster().notifier_url()));
        move || {
            Command::new(&python)
                .arg(examples.join("run_process.py"))
                .args(["--execution", &execution, "--notifier", &notifier, "--read-notifications-of", "archive-agent"])
                .arg("--tokens")
                .arg(&tokens_file)
                .arg("--process")
                .arg(repository().join("examples/process.yaml"))
                .env("PYTHONPATH", format!("{}:{}", generated.display(), examples.display()))
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
    test.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcurl_recipes_work_without_proto_files() {
    let Some(grpcurl) = tool("MUSTER_GRPCURL", "grpcurl", &["-version"]) else { return };
    let Some(test) = TestCluster::start(Backend::Sqlite).await else { return };
    test.register_agents(&[agent("writer-agent", "writer", "content")]).await;
    let run = |arguments: &[&str]| {
        let output = Command::new(&grpcurl).args(arguments).output().unwrap();
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(output.status.success(), "grpcurl {arguments:?}: {text}{}", String::from_utf8_lossy(&output.stderr));
        text
    };
    for (service, url) in [
        ("muster.execution.v1.ExecutionService", test.cluster().execution_url()),
        ("muster.roster.v1.RosterService", test.cluster().roster_url()),
        ("muster.validator.v1.ValidatorService", test.cluster().validator_url()),
        ("muster.notifier.v1.NotifierService", test.cluster().notifier_url()),
    ] {
        let address = url.trim_start_matches("http://").to_owned();
        let listed = run(&["-plaintext", &address, "list"]);
        let listed: Vec<&str> = listed.lines().collect();
        assert_eq!(
            listed,
            vec![
                "grpc.health.v1.Health",
                "grpc.reflection.v1.ServerReflection",
                "grpc.reflection.v1alpha.ServerReflection",
                service
            ],
            "{address}"
        );
        assert!(run(&["-plaintext", &address, "describe", service]).contains(&format!("{service} is a service")));
        let health = run(&["-plaintext", "-d", r#"{"service":""}"#, &address, "grpc.health.v1.Health/Check"]);
        assert!(health.contains("SERVING"), "{health}");
    }
    let roster = test.cluster().roster_url().trim_start_matches("http://").to_owned();
    let agents = run(&["-plaintext", &roster, "muster.roster.v1.RosterService/ListAgents"]);
    assert!(agents.contains("\"id\": \"writer-agent\""), "{agents}");
    let validator = test.cluster().validator_url().trim_start_matches("http://").to_owned();
    let report = run(&[
        "-plaintext",
        "-d",
        r#"{"source":"name: p\nsteps:\n  - id: a\n    type: agent_task\n    agent: x\n    message: m\n    roles:\n      monitors: [y]\n"}"#,
        &validator,
        "muster.validator.v1.ValidatorService/ValidateProcess",
    ]);
    assert!(report.contains("EMI002") && report.contains("\"line\": 7"), "{report}");
    test.shutdown().await;
}
