//! The `muster` command line against a running cluster: roster import with
//! tokens, the sample agents as a separate `muster agent` process, `run`,
//! `validate`, `delegate`, and an approval decided with `muster approve`.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
};

use muster_proto::execution::v1::{
    GetExecutionRequest, ListExecutionsRequest, StepStatus, execution_service_client::ExecutionServiceClient,
};
use muster_tests::{Backend, TestCluster};

fn muster() -> PathBuf {
    muster::cluster::default_binary_dir().unwrap().join("muster")
}

fn repository() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

async fn run(arguments: Vec<String>, environment: Vec<(String, String)>) -> Output {
    tokio::task::spawn_blocking(move || {
        Command::new(muster()).args(arguments).envs(environment).current_dir(repository()).output().unwrap()
    })
    .await
    .unwrap()
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_line_drives_the_cluster() {
    let Some(test) = TestCluster::start(Backend::Sqlite).await else { return };
    let environment = vec![
        ("MUSTER_EXECUTION_URL".to_owned(), test.cluster().execution_url()),
        ("MUSTER_ROSTER_URL".to_owned(), test.cluster().roster_url()),
    ];
    let tokens_file = test.data_dir.join("tokens.json");
    let path = |path: &Path| path.display().to_string();

    let imported = run(
        vec![
            "roster".into(),
            "import".into(),
            "examples/roster.yaml".into(),
            "--tokens-file".into(),
            path(&tokens_file),
        ],
        environment.clone(),
    )
    .await;
    assert!(imported.status.success(), "{}", text(&imported));
    assert!(text(&imported).contains("imported 10 agents, 3 teams, 5 roles"), "{}", text(&imported));

    let mut agents = Command::new(muster())
        .args(["agent", "--tokens-file", &path(&tokens_file)])
        .envs(environment.clone())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();

    let ran = run(vec!["run".into(), "examples/process.yaml".into()], environment.clone()).await;
    assert!(ran.status.success(), "{}", text(&ran));
    assert!(text(&ran).contains("execution completed"), "{}", text(&ran));

    let valid = run(vec!["validate".into(), "examples/process.yaml".into()], environment.clone()).await;
    assert_eq!(valid.status.code(), Some(0), "{}", text(&valid));
    let broken = test.data_dir.join("broken.yaml");
    std::fs::write(&broken, "name: broken\nsteps:\n  - id: a\n    type: agent_task\n    agent: x\n    message: m\n    roles:\n      monitors: [y]\n").unwrap();
    let invalid = run(vec!["validate".into(), path(&broken)], environment.clone()).await;
    assert_eq!(invalid.status.code(), Some(1), "{}", text(&invalid));
    assert!(text(&invalid).contains(":7:5: error[EMI002]"), "{}", text(&invalid));

    let delegated = run(
        vec![
            "delegate".into(),
            "t-1".into(),
            "--expertise".into(),
            "writing".into(),
            "--requester".into(),
            "manager-agent".into(),
        ],
        environment.clone(),
    )
    .await;
    assert!(delegated.status.success(), "{}", text(&delegated));
    assert!(text(&delegated).contains("DELEGATION DECISION"), "{}", text(&delegated));

    // An approval: `muster run` waits while `muster approve` decides, with the manager's token.
    let approval = test.data_dir.join("approval.yaml");
    std::fs::write(
        &approval,
        "name: sign-off\nsteps:\n  - id: gate\n    type: human_approval\n    title: Sign off\n    roles: {executor: manager-agent}\n",
    )
    .unwrap();
    let waiting = tokio::task::spawn_blocking({
        let (approval, environment) = (path(&approval), environment.clone());
        move || {
            Command::new(muster())
                .args(["run", &approval])
                .envs(environment)
                .current_dir(repository())
                .output()
                .unwrap()
        }
    });
    let mut client = ExecutionServiceClient::connect(test.cluster().execution_url()).await.unwrap();
    let execution_id = loop {
        let listed = client
            .list_executions(ListExecutionsRequest { process_name: "sign-off".to_owned(), ..Default::default() })
            .await
            .unwrap()
            .into_inner()
            .executions;
        if let Some(execution) = listed.first() {
            let execution =
                client.get_execution(GetExecutionRequest { id: execution.id.clone() }).await.unwrap().into_inner();
            let execution = execution.execution.unwrap();
            if execution.steps[0].status == StepStatus::WaitingApproval as i32 {
                break execution.id;
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    };
    let tokens: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&tokens_file).unwrap()).unwrap();
    let manager_token = tokens["manager-agent"].as_str().unwrap().to_owned();
    let approved = run(
        vec!["approve".into(), execution_id, "gate".into(), "--comment".into(), "ship it".into()],
        [environment.clone(), vec![("MUSTER_TOKEN".to_owned(), manager_token)]].concat(),
    )
    .await;
    assert!(approved.status.success(), "{}", text(&approved));
    assert!(text(&approved).contains("step gate is now completed"), "{}", text(&approved));
    let waited = waiting.await.unwrap();
    assert!(waited.status.success(), "{}", text(&waited));

    agents.kill().unwrap();
    let _ = agents.wait();
    test.shutdown().await;
}
