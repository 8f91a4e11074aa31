//! The `muster` command line against a running cluster: roster import with
//! tokens, the sample agents as a separate `muster agent` process, `run`,
//! `validate`, `delegate`, an approval decided with `muster approve`, token
//! rotation, the permission matrix, role checks and a team session; `muster
//! run` across a restart of the execution service, Ctrl-C on `muster run`
//! (cancel, or detach), and `muster agent` with one agent's token refused.

use std::{
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use muster::worker::AgentCredential;
use muster_proto::{
    common::v1::{EventType, ExecutionStatus},
    execution::v1::{GetExecutionRequest, ListExecutionsRequest, ListWorkersRequest, StepStatus},
    roster::v1::RotateTokenRequest,
};
use muster_tests::{
    Backend, TestCluster, agent, chain_process,
    command::{Background, muster, repository, run, text},
    events_until_finished, publish_and_start, spawn_sample_worker,
};
use nix::sys::signal::Signal;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_line_drives_the_cluster() {
    let Some(test) = TestCluster::start(Backend::Sqlite).await else { return };
    // The command finds the local operator's token in the data folder by itself.
    let environment = test.command_environment();
    let tokens_file = test.data_dir.join("tokens.json");
    let path = |path: &Path| path.display().to_string();
    let import = || {
        let arguments = ["roster", "import", "examples/roster.yaml", "--tokens-file"].map(String::from);
        run(arguments.into_iter().chain([path(&tokens_file)]).collect(), environment.clone())
    };

    let imported = import().await;
    assert!(imported.status.success(), "{}", text(&imported));
    assert!(
        text(&imported).contains("imported 10 agents (10 new, 0 kept their tokens), 3 teams, 5 roles"),
        "{}",
        text(&imported)
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&tokens_file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "the tokens file is its owner's only");
    }
    // Importing again rotates nobody: the tokens in the file stay good.
    let before = std::fs::read_to_string(&tokens_file).unwrap();
    let again = import().await;
    assert!(text(&again).contains("(0 new, 10 kept their tokens)"), "{}", text(&again));
    assert_eq!(std::fs::read_to_string(&tokens_file).unwrap(), before);

    // Without any credential, the command says so plainly.
    let anonymous = run(
        vec!["roster".into(), "list".into()],
        vec![
            ("MUSTER_ROSTER_URL".to_owned(), test.cluster().roster_url()),
            ("MUSTER_DATA_DIR".to_owned(), test.data_dir.join("nowhere").display().to_string()),
        ],
    )
    .await;
    assert_eq!(anonymous.status.code(), Some(2), "{}", text(&anonymous));
    assert!(text(&anonymous).contains("no credential: pass --token or set MUSTER_TOKEN"), "{}", text(&anonymous));

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
    assert!(text(&ran).contains("outputs:\n  research     {"), "each step's output at the end: {}", text(&ran));

    // A published process started by name, with inputs: the id alone on
    // standard output; watched after the fact, at the times it happened.
    let started = run(
        ["start", "content-pipeline", "--input", "topic=muster", "--input", "rounds=2"].map(String::from).to_vec(),
        environment.clone(),
    )
    .await;
    assert!(started.status.success(), "{}", text(&started));
    let id = String::from_utf8(started.stdout.clone()).unwrap().trim().to_owned();
    assert_eq!(id.len(), 36, "only the id on standard output: {id:?}");
    let watched = run(vec!["watch".into(), id.clone()], environment.clone()).await;
    assert!(watched.status.success(), "{}", text(&watched));
    let watched_again = run(vec!["watch".into(), id.clone()], environment.clone()).await;
    let times = |output: &std::process::Output| -> Vec<String> {
        text(output).lines().filter_map(|line| Some(line.split(']').next()?.to_owned())).collect()
    };
    assert_eq!(times(&watched), times(&watched_again), "the recorded times, not the watcher's");
    assert!(times(&watched_again).iter().any(|time| time != "[   0.00s"), "{}", text(&watched_again));
    let inputs =
        run(vec!["executions".into(), "get".into(), id.clone(), "--output".into(), "json".into()], environment.clone())
            .await;
    let inputs: serde_json::Value = serde_json::from_slice(&inputs.stdout).unwrap();
    let inputs = &inputs["execution"]["inputs"];
    assert_eq!((inputs["topic"].as_str(), inputs["rounds"].as_f64()), (Some("muster"), Some(2.0)), "{inputs}");

    // An informed agent's notifications, as lines and as JSON.
    let heard = run(vec!["notifications".into(), "archive-agent".into()], environment.clone()).await;
    assert!(heard.status.success(), "{}", text(&heard));
    assert!(text(&heard).contains("step_completed") && text(&heard).contains(&id), "{}", text(&heard));
    let heard =
        run(["notifications", "archive-agent", "--output", "json"].map(String::from).to_vec(), environment.clone())
            .await;
    let heard: serde_json::Value = serde_json::from_slice(&heard.stdout).unwrap();
    assert!(heard["notifications"][0]["outputSummary"].is_string(), "lowerCamelCase: {heard}");
    // Following: what was there, then what comes, until Ctrl-C.
    let mut following = Background::spawn(&["notifications", "archive-agent", "--follow"], &environment);
    following.wait_for(&id, Duration::from_secs(30)).await;
    let again = run(["start", "content-pipeline"].map(String::from).to_vec(), environment.clone()).await;
    let again = String::from_utf8(again.stdout).unwrap().trim().to_owned();
    following.wait_for(&format!("step_completed     {again}"), Duration::from_secs(30)).await;
    following.signal(nix::sys::signal::Signal::SIGINT);
    let (stopped, _) = following.wait(Duration::from_secs(30)).await;
    assert!(stopped.success(), "Ctrl-C ends --follow quietly");
    let nobody = run(vec!["notifications".into(), "qa-agent".into()], environment.clone()).await;
    assert!(text(&nobody).contains("(no notifications for qa-agent)"), "{}", text(&nobody));
    let budgets = run(vec!["budget".into(), "list".into()], environment.clone()).await;
    assert_eq!(String::from_utf8_lossy(&budgets.stdout), "(no budgets set)\n", "an empty list says so");

    // Shell completions; a reader that goes away ends the command quietly.
    let completions = run(vec!["completions".into(), "bash".into()], environment.clone()).await;
    assert!(String::from_utf8_lossy(&completions.stdout).starts_with("_muster()"), "{}", text(&completions));
    let mut piped = Command::new(muster())
        .args(["completions", "bash"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0_u8; 16];
    std::io::Read::read_exact(piped.stdout.as_mut().unwrap(), &mut first).unwrap();
    drop(piped.stdout.take());
    let ended = piped.wait_with_output().unwrap();
    assert!(ended.status.success() && ended.stderr.is_empty(), "{}", String::from_utf8_lossy(&ended.stderr));

    let valid = run(vec!["validate".into(), "examples/process.yaml".into()], environment.clone()).await;
    assert_eq!(valid.status.code(), Some(0), "{}", text(&valid));
    let broken = test.data_dir.join("broken.yaml");
    std::fs::write(&broken, "name: broken\nsteps:\n  - id: a\n    type: agent_task\n    agent: x\n    message: m\n    roles:\n      monitors: [y]\n").unwrap();
    let invalid = run(vec!["validate".into(), path(&broken)], environment.clone()).await;
    assert_eq!(invalid.status.code(), Some(1), "{}", text(&invalid));
    let expected = format!("error[EMI002]: Roles must include an 'executor' agent\n --> {}:7:5\n", path(&broken));
    assert!(text(&invalid).contains(&expected), "{}", text(&invalid));
    assert!(!text(&invalid).contains('\u{1b}'), "no colour in a pipe: {}", text(&invalid));

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
    assert!(text(&delegated).contains("\nagent ids: "), "{}", text(&delegated));
    let delegated = run(
        ["delegate", "t-1", "--expertise", "writing", "--requester", "manager-agent", "--output", "json"]
            .map(String::from)
            .to_vec(),
        environment.clone(),
    )
    .await;
    let delegated: serde_json::Value = serde_json::from_slice(&delegated.stdout).unwrap();
    assert!(delegated["decision"]["primaryAgentId"].is_string(), "{delegated}");
    let verdict =
        run(["check-role", "writer-agent", "code", "--output", "json"].map(String::from).to_vec(), environment.clone())
            .await;
    let verdict: serde_json::Value = serde_json::from_slice(&verdict.stdout).unwrap();
    assert_eq!(verdict["agentId"], "writer-agent", "{verdict}");

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
    let mut client = test.execution();
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

    // An agent's role, checked against the actions its roster role lists
    // and the permission matrix in force: the editor is a reviewer, a role
    // of the default matrix; the writer's role is not one, so the matrix
    // does not restrict it, but the writer role's own actions do (it lists
    // no `approve`).
    let denied = run(vec!["check-role".into(), "editor-agent".into(), "assign_role".into()], environment.clone()).await;
    assert_eq!(denied.status.code(), Some(1), "{}", text(&denied));
    assert!(text(&denied).contains("denied: editor-agent 'assign_role'"), "{}", text(&denied));
    let unlisted = run(vec!["check-role".into(), "writer-agent".into(), "approve".into()], environment.clone()).await;
    assert_eq!(unlisted.status.code(), Some(1), "{}", text(&unlisted));
    assert!(text(&unlisted).contains("[roster_role]"), "{}", text(&unlisted));
    let ungoverned =
        run(vec!["check-role".into(), "writer-agent".into(), "request_review".into()], environment.clone()).await;
    assert_eq!(ungoverned.status.code(), Some(0), "{}", text(&ungoverned));
    assert!(text(&ungoverned).contains("[not_governed]"), "{}", text(&ungoverned));
    let shown = run(vec!["matrix".into(), "show".into()], environment.clone()).await;
    assert!(text(&shown).contains("# permission matrix version 1"), "{}", text(&shown));
    let matrix = test.data_dir.join("matrix.yaml");
    std::fs::write(
        &matrix,
        "roles:
  writer:
    can: [code]
",
    )
    .unwrap();
    let applied = run(vec!["matrix".into(), "apply".into(), path(&matrix)], environment.clone()).await;
    assert!(text(&applied).contains("permission matrix version 2 is in force"), "{}", text(&applied));
    let governed =
        run(vec!["check-role".into(), "writer-agent".into(), "assign_role".into()], environment.clone()).await;
    assert_eq!(governed.status.code(), Some(1), "{}", text(&governed));
    let allowed = run(vec!["check-role".into(), "writer-agent".into(), "code".into()], environment.clone()).await;
    assert_eq!(allowed.status.code(), Some(0), "{}", text(&allowed));
    assert!(text(&allowed).contains("[action]"), "{}", text(&allowed));
    std::fs::write(
        &matrix,
        "roles:
  writer:
    can: [code]
    cannot: [code]
",
    )
    .unwrap();
    let refused = run(vec!["matrix".into(), "apply".into(), path(&matrix)], environment.clone()).await;
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
    // The service's findings read as `muster validate` prints its own.
    let shown = "error[MTX004]: role 'writer' both can and cannot 'code'\n --> ";
    assert!(text(&refused).contains(shown), "{}", text(&refused));
    let shown = ":4:14\n  |\n4 |     cannot: [code]\n  |              ^\n  |\n  = note: at roles.writer.cannot[0]\n";
    assert!(text(&refused).contains(shown), "{}", text(&refused));

    // A team session: started with a participant, who gets a role, and a new lead.
    std::fs::write(
        &matrix,
        "roles:
  lead:
    can: [assign_role]
    includes: [writer]
  writer:
    can: [code, create_subtask]
",
    )
    .unwrap();
    run(vec!["matrix".into(), "apply".into(), path(&matrix)], environment.clone()).await;
    let session = test.data_dir.join("session.yaml");
    std::fs::write(
        &session,
        "name: pairing
steps:
  - id: gate
    type: human_approval
    roles: {executor: manager-agent}
",
    )
    .unwrap();
    let started = run(
        vec![
            "session".into(),
            "start".into(),
            path(&session),
            "--lead".into(),
            "manager-agent".into(),
            "--title".into(),
            "Pair on the draft".into(),
            "--participant".into(),
            "writer-agent=writer:Write the draft".into(),
        ],
        environment.clone(),
    )
    .await;
    assert!(started.status.success(), "{}", text(&started));
    let session_id = text(&started)
        .lines()
        .find_map(|line| line.strip_prefix("session ")?.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| panic!("no session id in {}", text(&started)));
    let status = run(vec!["session".into(), "status".into(), session_id.clone()], environment.clone()).await;
    assert!(text(&status).contains("👑 LEAD: manager-agent"), "{}", text(&status));
    assert!(text(&status).contains("📍 writer-agent [WRITER] — Write the draft"), "{}", text(&status));
    let manager =
        [environment.clone(), vec![("MUSTER_TOKEN".to_owned(), tokens["manager-agent"].as_str().unwrap().to_owned())]]
            .concat();
    let assigned = run(
        vec!["session".into(), "assign".into(), session_id.clone(), "seo-agent".into(), "writer".into()],
        manager.clone(),
    )
    .await;
    assert!(text(&assigned).contains("seo-agent is now writer"), "{}", text(&assigned));
    let writer =
        [environment.clone(), vec![("MUSTER_TOKEN".to_owned(), tokens["writer-agent"].as_str().unwrap().to_owned())]]
            .concat();
    // A subtask asked of the lead, which approves it.
    let asked = run(
        vec![
            "session".into(),
            "subtask".into(),
            session_id.clone(),
            "Write the meta description".into(),
            "--agent".into(),
            "seo-agent".into(),
        ],
        writer.clone(),
    )
    .await;
    assert!(text(&asked).contains("for seo-agent as writer waits for the lead's decision"), "{}", text(&asked));
    let request_id = text(&asked).split_whitespace().nth(2).unwrap_or_default().to_owned();
    let approved = run(
        vec!["session".into(), "decide".into(), session_id.clone(), request_id.clone(), "--approve".into()],
        manager.clone(),
    )
    .await;
    assert!(
        text(&approved).contains("approved: seo-agent is now writer (Write the meta description)"),
        "{}",
        text(&approved)
    );
    let status = run(vec!["session".into(), "status".into(), session_id.clone()], environment.clone()).await;
    assert!(
        text(&status).contains(&format!("{request_id} [approved] writer-agent for seo-agent")),
        "{}",
        text(&status)
    );
    let not_lead =
        run(vec!["session".into(), "assign".into(), session_id.clone(), "seo-agent".into(), "writer".into()], writer)
            .await;
    assert_eq!(not_lead.status.code(), Some(2), "{}", text(&not_lead));
    assert!(text(&not_lead).contains("PermissionDenied"), "{}", text(&not_lead));
    let lead =
        run(vec!["session".into(), "lead".into(), session_id.clone(), "editor-agent".into()], environment.clone())
            .await;
    assert!(text(&lead).contains("editor-agent now leads"), "{}", text(&lead));

    // A rotated token: the new one goes into the tokens file, the old one stops working.
    let rotated = run(
        vec!["token".into(), "rotate".into(), "writer-agent".into(), "--tokens-file".into(), path(&tokens_file)],
        environment.clone(),
    )
    .await;
    assert!(rotated.status.success(), "{}", text(&rotated));
    let old =
        [environment.clone(), vec![("MUSTER_TOKEN".to_owned(), tokens["writer-agent"].as_str().unwrap().to_owned())]]
            .concat();
    let refused = run(vec!["roster".into(), "list".into()], old).await;
    assert!(text(&refused).contains("Unauthenticated"), "{}", text(&refused));
    assert!(text(&refused).contains("revoked"), "{}", text(&refused));

    agents.kill().unwrap();
    let _ = agents.wait();
    test.shutdown().await;
}

/// `muster run` while the execution service crashes and comes back: it
/// reconnects, resumes after the last event it printed and completes, having
/// printed every event of the execution exactly once. With the service gone
/// for good, `muster watch` gives up after its reconnect timeout, saying so.
async fn muster_run_resumes_after_the_execution_service_restarts(backend: Backend) {
    let Some(mut test) = TestCluster::start(backend).await else { return };
    let ids = ["doer", "watcher"];
    let tokens = test.register_agents(&ids.map(|id| agent(id, "worker", "team"))).await;
    let credentials =
        ids.iter().zip(tokens).map(|(id, token)| AgentCredential { agent_id: (*id).to_owned(), token }).collect();
    let (stop, worker) = spawn_sample_worker(test.operator("execution"), credentials);
    let steps = 300;
    let process = test.data_dir.join("long-chain.yaml");
    std::fs::write(&process, chain_process("long-chain", steps, "doer", "watcher", "{}")).unwrap();
    let environment = test.command_environment();

    let mut running = Background::spawn(&["run", &process.display().to_string()], &environment);
    // The crash comes while most of the chain is still to run.
    let output = running.wait_for(&format!("{:<20} completed", "s5"), Duration::from_secs(120)).await;
    let execution_id = output
        .lines()
        .find_map(|line| line.strip_prefix("execution ")?.strip_suffix(" started"))
        .unwrap_or_else(|| panic!("no execution id in {output}"))
        .to_owned();
    test.cluster_mut().kill("execution").await.unwrap();
    test.cluster_mut().restart("execution").await.unwrap();
    let (status, output) = running.wait(Duration::from_secs(300)).await;
    assert!(status.success(), "{output}");
    assert!(output.contains("lost the execution service"), "{output}");
    assert!(output.contains("reconnected to the execution service; resuming after event"), "{output}");
    assert!(output.contains("execution completed"), "{output}");

    let events = events_until_finished(&test.operator("execution"), &execution_id).await;
    assert_eq!(events.last().unwrap().execution_status, ExecutionStatus::Completed as i32);
    let printed: Vec<&str> = output.lines().filter(|line| line.starts_with('[')).collect();
    assert_eq!(printed.len(), events.len(), "each event printed once, none missing:\n{output}");
    for index in 0..steps {
        let step = format!("{:<20} completed", format!("s{index}"));
        let completions = printed.iter().filter(|line| line.contains(&step)).count();
        assert_eq!(completions, 1, "s{index} completed once:\n{output}");
    }
    let started = events.iter().filter(|event| event.event_type == EventType::StepStarted as i32).count();
    assert_eq!(printed.iter().filter(|line| line.contains(" started     by ")).count(), started, "{output}");

    // The service gone for good: watching gives up after the timeout, naming the way back.
    test.cluster_mut().kill("execution").await.unwrap();
    let watched =
        run(vec!["watch".into(), execution_id.clone(), "--reconnect-timeout".into(), "1".into()], environment).await;
    assert_eq!(watched.status.code(), Some(2), "{}", text(&watched));
    assert!(text(&watched).contains(&format!("gave up watching execution {execution_id}")), "{}", text(&watched));
    assert!(text(&watched).contains(&format!("`muster watch {execution_id}`")), "{}", text(&watched));

    let _ = stop.send(());
    worker.await.unwrap().unwrap();
    test.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn muster_run_resumes_after_the_execution_service_restarts_on_sqlite() {
    muster_run_resumes_after_the_execution_service_restarts(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn muster_run_resumes_after_the_execution_service_restarts_on_postgres() {
    muster_run_resumes_after_the_execution_service_restarts(Backend::Postgres).await;
}

/// Ctrl-C on `muster run` cancels the execution it started and shows it end;
/// with `--detach` the execution goes on and the command says how to follow it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_on_muster_run_cancels_the_execution_unless_detached() {
    let Some(test) = TestCluster::start(Backend::Sqlite).await else { return };
    // Nobody serves the agent: the first step waits for it.
    test.register_agents(&[agent("absent", "worker", "team")]).await;
    let process = test.data_dir.join("waits.yaml");
    std::fs::write(&process, chain_process("waits", 2, "absent", "absent", "{}")).unwrap();
    let process = process.display().to_string();
    let environment = test.command_environment();
    let started = |output: &str| {
        output
            .lines()
            .find_map(|line| line.strip_prefix("execution ")?.strip_suffix(" started"))
            .unwrap_or_else(|| panic!("no execution id in {output}"))
            .to_owned()
    };
    let status_of = |id: String| {
        let mut client = test.execution();
        async move {
            let execution = client.get_execution(GetExecutionRequest { id }).await.unwrap().into_inner().execution;
            ExecutionStatus::try_from(execution.unwrap().status).unwrap()
        }
    };

    let mut running = Background::spawn(&["run", &process], &environment);
    let id = started(&running.wait_for("execution started (", Duration::from_secs(60)).await);
    running.signal(Signal::SIGINT);
    let (status, output) = running.wait(Duration::from_secs(60)).await;
    assert_eq!(status.code(), Some(1), "finished, not completed:\n{output}");
    assert!(output.contains(&format!("Ctrl-C: cancelling execution {id}")), "{output}");
    assert!(output.contains("execution cancelled"), "{output}");
    assert_eq!(status_of(id).await, ExecutionStatus::Cancelled);

    let mut detached = Background::spawn(&["run", "--detach", &process], &environment);
    let id = started(&detached.wait_for("execution started (", Duration::from_secs(60)).await);
    detached.signal(Signal::SIGINT);
    let (status, output) = detached.wait(Duration::from_secs(60)).await;
    assert_eq!(status.code(), Some(2), "{output}");
    assert!(output.contains(&format!("detached: execution {id} goes on without this command")), "{output}");
    assert!(!output.contains("cancelling"), "{output}");
    assert_eq!(status_of(id).await, ExecutionStatus::Running);
    test.shutdown().await;
}

/// The day-two commands against a running cluster: executions listed (text,
/// JSON, page by page), one shown with its steps, a step reassigned with
/// `muster intervene`, the execution cancelled; processes;
/// the connected workers with their agents; the other read commands in JSON;
/// and an agent listing only the executions it takes part in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn day_two_commands_show_executions_processes_and_workers() {
    let Some(test) = TestCluster::start(Backend::Sqlite).await else { return };
    let tokens = test.register_agents(&[agent("present", "worker", "team"), agent("absent", "worker", "team")]).await;
    let credentials = vec![AgentCredential { agent_id: "present".to_owned(), token: tokens[0].clone() }];
    let (stop, worker) = spawn_sample_worker(test.operator("execution"), credentials);
    let mut client = test.execution();
    let done = publish_and_start(&mut client, &chain_process("served", 1, "present", "present", "{}")).await;
    events_until_finished(&test.operator("execution"), &done).await;
    // Nobody serves "absent": this one stays running.
    let waiting = publish_and_start(&mut client, &chain_process("unserved", 2, "absent", "absent", "{}")).await;
    let environment = test.command_environment();
    let muster =
        |arguments: &[&str]| run(arguments.iter().map(|&argument| argument.to_owned()).collect(), environment.clone());
    let stdout = |output: &std::process::Output| {
        assert!(output.status.success(), "{}", text(output));
        String::from_utf8(output.stdout.clone()).unwrap()
    };
    let json = |output: &std::process::Output| -> serde_json::Value { serde_json::from_str(&stdout(output)).unwrap() };

    let listed = stdout(&muster(&["executions", "list"]).await);
    let lines: Vec<&str> = listed.lines().collect();
    assert_eq!(lines.len(), 2, "{listed}");
    assert!(lines[0].starts_with(&format!("{waiting}  running    unserved v1  started 20")), "newest first: {listed}");
    assert!(lines[1].starts_with(&format!("{done}  completed  served v1")), "{listed}");
    let running = json(&muster(&["executions", "list", "--status", "running", "--output", "json"]).await);
    assert_eq!(running["executions"].as_array().unwrap().len(), 1, "{running}");
    assert_eq!(running["executions"][0]["id"], waiting.as_str());
    assert_eq!(running["executions"][0]["status"], "EXECUTION_STATUS_RUNNING");
    assert_eq!(running["nextPageToken"], "", "every field is there, defaults too, in lowerCamelCase");
    let first = stdout(&muster(&["executions", "list", "--page-size", "1"]).await);
    let token = first.lines().find_map(|line| line.strip_prefix("more: --page-token ")).expect(&first).to_owned();
    assert!(first.starts_with(&waiting), "{first}");
    let second = stdout(&muster(&["executions", "list", "--page-size", "1", "--page-token", &token]).await);
    assert!(second.starts_with(&done) && !second.contains("more:"), "{second}");

    let shown = stdout(&muster(&["executions", "get", &waiting]).await);
    let step = |name: &str| {
        shown
            .lines()
            .find(|line| line.trim_start().starts_with(name))
            .unwrap_or_else(|| panic!("{name} in {shown}"))
            .to_owned()
    };
    assert!(step("s0 ").contains("absent"), "{shown}");
    assert!(step("s1 ").contains("pending"), "s1 waits for s0: {shown}");
    let shown = json(&muster(&["executions", "get", &waiting, "--output", "json"]).await);
    assert_eq!(shown["execution"]["steps"].as_array().unwrap().len(), 2, "{shown}");
    // Reassigned to the served agent, the first step runs; the second waits for "absent" again.
    let reassigned = stdout(&muster(&["intervene", &waiting, "reassign", "--step", "s0", "--agent", "present"]).await);
    assert!(
        reassigned.starts_with(&format!("step s0 of execution {waiting}: ")) && reassigned.contains("(present)"),
        "{reassigned}"
    );
    let mut tries = 0;
    loop {
        let shown = json(&muster(&["executions", "get", &waiting, "--output", "json"]).await);
        if shown["execution"]["steps"][0]["status"] == "STEP_STATUS_COMPLETED" {
            break;
        }
        tries += 1;
        assert!(tries < 100, "s0 never completed after the reassignment: {shown}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let refused = muster(&["intervene", &waiting, "reassign", "--step", "s1"]).await;
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
    assert!(text(&refused).contains("--agent"), "reassign names who takes the step: {}", text(&refused));
    let cancelled = stdout(&muster(&["executions", "cancel", &waiting, "--reason", "not needed"]).await);
    assert_eq!(cancelled.trim(), format!("execution {waiting} cancelled"));
    let shown = stdout(&muster(&["executions", "get", &waiting]).await);
    assert!(shown.starts_with(&format!("{waiting}  cancelled")) && shown.contains("(not needed)"), "{shown}");

    let processes = stdout(&muster(&["processes", "list"]).await);
    assert!(processes.contains("served v1  1 steps") && processes.contains("unserved v1  2 steps"), "{processes}");
    let processes = json(&muster(&["processes", "list", "--output", "json"]).await);
    assert_eq!(processes["processes"].as_array().unwrap().len(), 2, "{processes}");

    let workers = stdout(&muster(&["workers"]).await);
    assert!(workers.contains("agents: present"), "{workers}");
    let workers = json(&muster(&["workers", "--output", "json"]).await);
    assert_eq!(workers["workers"][0]["agents"], serde_json::json!(["present"]), "{workers}");

    // Every read command answers in JSON too: the service's answer, all pages in one.
    let agents = json(&muster(&["roster", "list", "--output", "json"]).await);
    let ids: Vec<&str> =
        agents["agents"].as_array().unwrap().iter().map(|agent| agent["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["absent", "present"], "{agents}");
    assert_eq!(agents["agents"][0]["status"], "AGENT_STATUS_IDLE", "enums by name: {agents}");
    for (arguments, key) in [
        (vec!["schedule", "list"], "schedules"),
        (vec!["budget", "list"], "budgets"),
        (vec!["inbox", "list", "nobody"], "messages"),
        (vec!["memory", "show", "--global"], "entries"),
    ] {
        let listed = json(&muster(&[arguments.as_slice(), &["--output", "json"]].concat()).await);
        assert_eq!(listed[key], serde_json::json!([]), "{arguments:?}: {listed}");
    }
    let matrix = json(&muster(&["matrix", "show", "--output", "json"]).await);
    assert!(matrix["matrix"]["version"].as_u64().unwrap() >= 1, "{matrix}");

    // An agent lists the executions it takes part in, and no other: "absent"
    // leads the one nobody serves and has no part in "present"'s (while
    // "present" took a step of the other over when it was reassigned).
    let own = json(&muster(&["--token", &tokens[1], "executions", "list", "--output", "json"]).await);
    let ids: Vec<&str> = own["executions"].as_array().unwrap().iter().map(|e| e["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [waiting.as_str()], "{own}");

    let _ = stop.send(());
    worker.await.unwrap().unwrap();
    test.shutdown().await;
}

/// Runs a one-step process for `agent` and waits for it to complete.
async fn one_step_completes(test: &TestCluster, name: &str, agent: &str) {
    let mut client = test.execution();
    let execution_id = publish_and_start(&mut client, &chain_process(name, 1, agent, agent, "{}")).await;
    let events = events_until_finished(&test.operator("execution"), &execution_id).await;
    let finished = events.last().unwrap();
    assert_eq!(finished.execution_status, ExecutionStatus::Completed as i32, "{}", finished.detail);
}

/// `muster agent` whose tokens file holds one agent's rotated token: the
/// worker reports that agent, names it, and goes on serving the others —
/// whether the refusal comes in the hello (connected as the operator) or
/// for the connection itself (connected with that agent's own token). With
/// no agent left, the command fails saying why.
async fn muster_agent_goes_on_without_an_agent_whose_token_is_refused(backend: Backend) {
    let Some(mut test) = TestCluster::start(backend).await else { return };
    let ids = ["archivist", "doer", "watcher"];
    let tokens = test.register_agents(&ids.map(|id| agent(id, "worker", "team"))).await;
    let tokens_file = test.data_dir.join("tokens.json");
    let tokens: serde_json::Map<String, serde_json::Value> =
        ids.iter().zip(tokens).map(|(id, token)| ((*id).to_owned(), token.into())).collect();
    std::fs::write(&tokens_file, serde_json::Value::Object(tokens).to_string()).unwrap();
    let tokens_file = tokens_file.display().to_string();
    let environment = test.command_environment();

    // archivist's token is rotated under the running worker; when the
    // execution service comes back, the worker's hello is refused for it.
    let mut agents = Background::spawn(&["agent", "--tokens-file", &tokens_file], &environment);
    agents.wait_for("connected: serving archivist, doer, watcher", Duration::from_secs(60)).await;
    test.roster().rotate_token(RotateTokenRequest { agent_id: "archivist".to_owned() }).await.unwrap();
    test.cluster_mut().kill("execution").await.unwrap();
    test.cluster_mut().restart("execution").await.unwrap();
    agents.wait_for("connected: serving doer, watcher", Duration::from_secs(120)).await;
    // The refusal goes to stderr and the connection to stdout: either pipe may be read first.
    let output = agents.wait_for("agent archivist is not served", Duration::from_secs(30)).await;
    assert!(output.contains("the token given for agent 'archivist' is not valid"), "{output}");
    assert!(output.contains("revoked"), "{output}");
    one_step_completes(&test, "for-doer", "doer").await;
    drop(agents);

    // Without an operator's credential the connection carries the first
    // agent's token, archivist's, which is refused: doer's carries it next.
    let anonymous: Vec<(String, String)> = environment
        .iter()
        .filter(|(key, _)| key != "MUSTER_DATA_DIR")
        .cloned()
        .chain([("MUSTER_DATA_DIR".to_owned(), test.data_dir.join("nowhere").display().to_string())])
        .collect();
    let mut agents = Background::spawn(&["agent", "--tokens-file", &tokens_file], &anonymous);
    agents.wait_for("connected: serving doer, watcher", Duration::from_secs(60)).await;
    let output = agents.wait_for("agent archivist is not served", Duration::from_secs(30)).await;
    assert!(output.contains("revoked"), "{output}");
    one_step_completes(&test, "for-watcher", "watcher").await;
    drop(agents);

    // Nobody left to serve: the command ends, saying whom it could not serve.
    let alone = run(
        ["agent", "--tokens-file", &tokens_file, "--serve", "archivist"].map(String::from).to_vec(),
        environment.clone(),
    )
    .await;
    assert_eq!(alone.status.code(), Some(2), "{}", text(&alone));
    assert!(
        text(&alone).contains("no agent left to serve: the execution service refused the tokens of archivist"),
        "{}",
        text(&alone)
    );
    test.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn muster_agent_goes_on_without_an_agent_whose_token_is_refused_on_sqlite() {
    muster_agent_goes_on_without_an_agent_whose_token_is_refused(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn muster_agent_goes_on_without_an_agent_whose_token_is_refused_on_postgres() {
    muster_agent_goes_on_without_an_agent_whose_token_is_refused(Backend::Postgres).await;
}

/// `muster agent --max-concurrency 2` tells the execution service so in its
/// hello, and of four steps ready at once for an agent with room for ten,
/// no more than two run at a time. A limit of 0 is refused, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn muster_agent_runs_at_most_its_max_concurrency_at_once() {
    let Some(test) = TestCluster::start(Backend::Sqlite).await else { return };
    let doer = muster_proto::roster::v1::Agent { workload_capacity: 10, ..agent("doer", "worker", "team") };
    let tokens = test.register_agents(&[doer]).await;
    let tokens_file = test.data_dir.join("tokens.json");
    std::fs::write(&tokens_file, serde_json::json!({ "doer": tokens[0] }).to_string()).unwrap();
    let tokens_file = tokens_file.display().to_string();
    let environment = test.command_environment();

    let refused = run(
        ["agent", "--tokens-file", &tokens_file, "--max-concurrency", "0"].map(String::from).to_vec(),
        environment.clone(),
    )
    .await;
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
    assert!(text(&refused).contains("--max-concurrency"), "{}", text(&refused));

    let mut agents =
        Background::spawn(&["agent", "--tokens-file", &tokens_file, "--max-concurrency", "2"], &environment);
    agents.wait_for("connected: serving doer", Duration::from_secs(60)).await;
    let mut client = test.execution();
    let workers = client.list_workers(ListWorkersRequest::default()).await.unwrap().into_inner().workers;
    assert_eq!(workers.iter().map(|worker| worker.max_concurrency).collect::<Vec<_>>(), [2]);

    let mut source = "name: four-at-once\nsteps:\n".to_owned();
    for index in 0..4 {
        source.push_str(&format!(
            "  - {{id: s{index}, type: agent_task, agent: doer, message: m, inputs: {{sleep_ms: 300}}}}\n"
        ));
    }
    let execution_id = publish_and_start(&mut client, &source).await;
    let finished = events_until_finished(&test.operator("execution"), &execution_id).await;
    assert_eq!(finished.last().map(|event| event.event_type), Some(EventType::ExecutionFinished as i32));
    let execution = client
        .get_execution(GetExecutionRequest { id: execution_id })
        .await
        .unwrap()
        .into_inner()
        .execution
        .expect("the execution");
    let millis = |at: Option<prost_types::Timestamp>| {
        let at = at.expect("a time");
        at.seconds * 1000 + i64::from(at.nanos) / 1_000_000
    };
    let spans: Vec<(i64, i64)> =
        execution.steps.iter().map(|step| (millis(step.started_at), millis(step.ended_at))).collect();
    assert_eq!(spans.len(), 4);
    let most_at_once = spans
        .iter()
        .map(|&(start, _)| {
            spans.iter().filter(|&&(other_start, other_end)| other_start <= start && start < other_end).count()
        })
        .max();
    assert_eq!(most_at_once, Some(2), "steps ran as {spans:?}");
    drop(agents);
    test.shutdown().await;
}
