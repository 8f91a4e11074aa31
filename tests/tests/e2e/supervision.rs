//! `muster up` supervises its four services: one killed is restarted on its
//! address and the cluster works again; one that keeps crashing makes
//! `muster up` give up, stop the others and fail, saying which and why.

use std::time::Duration;

use muster_tests::{
    Folder, build_service_binaries,
    command::{Background, run, text},
};
use nix::sys::signal::Signal;

/// How long anything here may take before the test calls it a hang.
const LIMIT: Duration = Duration::from_secs(120);

/// `muster up` on free ports in its own data folder, once it has started;
/// it writes its cluster context, `test`, in `data`'s `config` folder.
async fn muster_up(data: &Folder) -> (Background, String) {
    build_service_binaries();
    let data_dir = data.0.display().to_string();
    let mut up = Background::spawn(
        &[
            "up",
            "--data-dir",
            &data_dir,
            "--execution-port",
            "0",
            "--roster-port",
            "0",
            "--validator-port",
            "0",
            "--notifier-port",
            "0",
            "--console-port",
            "0",
            "--cluster",
            "test",
        ],
        &contexts(data),
    );
    let output = up.wait_for("press Ctrl-C to stop", LIMIT).await;
    (up, output)
}

/// The environment in which `muster` keeps its cluster contexts in `data`.
fn contexts(data: &Folder) -> Vec<(String, String)> {
    vec![("MUSTER_CONFIG_DIR".to_owned(), data.0.join("config").display().to_string())]
}

/// The URL and process id `muster up` printed for a service.
fn service(output: &str, name: &str) -> (String, i32) {
    let line = output
        .lines()
        .find(|line| line.trim_start().starts_with(&format!("{name} ")) && line.contains("(pid "))
        .unwrap_or_else(|| panic!("muster up did not list {name}:\n{output}"));
    let url = line.split_whitespace().nth(1).expect("a URL").to_owned();
    let pid = line.split("(pid ").nth(1).and_then(|rest| rest.split(',').next()).expect("a pid");
    (url, pid.parse().unwrap_or_else(|_| panic!("a pid in {line}")))
}

/// The URL `muster up` said a restarted service is back at.
fn restarted(output: &str, name: &str) -> String {
    let line = output
        .lines()
        .find(|line| line.starts_with(&format!("restarted {name} (attempt")))
        .unwrap_or_else(|| panic!("muster up did not restart {name}:\n{output}"));
    line.rsplit(", ").next().expect("a URL").to_owned()
}

fn kill(pid: i32) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL).expect("killing a service");
}

fn is_running(pid: i32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
}

/// kill -9 of the roster, then of the execution service, under `muster up`:
/// each is reported with its exit status and log, restarted on its address
/// and said to be back; then the sample runs end to end, and Ctrl-C stops
/// the cluster as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn muster_up_restarts_a_killed_service() {
    let data = Folder::new("up-restart");
    let (mut up, output) = muster_up(&data).await;
    let (roster_url, roster_pid) = service(&output, "roster");
    let (execution_url, execution_pid) = service(&output, "execution");

    kill(roster_pid);
    let output = up.wait_for("restarted roster (attempt 1)", LIMIT).await;
    let log = data.0.join("logs").join("roster.log");
    assert!(
        output.contains(&format!("roster exited unexpectedly (signal: 9 (SIGKILL)); its log: {}", log.display())),
        "{output}"
    );
    assert!(output.contains("restarting roster in 0.5 s (attempt 1)"), "{output}");
    assert_eq!(restarted(&output, "roster"), roster_url, "the same address");
    kill(execution_pid);
    let output = up.wait_for("restarted execution (attempt 1)", LIMIT).await;
    assert_eq!(restarted(&output, "execution"), execution_url, "the same address");

    // The cluster works again: the sample roster, its agents and process,
    // with commands that find the cluster, its addresses and the operator's
    // token, through the context `muster up` wrote.
    let environment = contexts(&data);
    let context = std::fs::read_to_string(data.0.join("config/clusters/test.json")).expect("the context");
    assert!(context.contains(&execution_url) && context.contains(&roster_url), "{context}");
    assert!(output.contains("muster commands on this machine use this cluster (context 'test'"), "{output}");
    let unknown =
        run(vec!["roster".into(), "list".into(), "--cluster".into(), "elsewhere".into()], environment.clone()).await;
    assert_eq!(unknown.status.code(), Some(2), "{}", text(&unknown));
    assert!(
        text(&unknown).contains("no cluster 'elsewhere'") && text(&unknown).contains("known: test"),
        "{}",
        text(&unknown)
    );
    let tokens_file = data.0.join("tokens.json").display().to_string();
    let imported = run(
        ["roster", "import", "examples/roster.yaml", "--tokens-file", &tokens_file].map(String::from).to_vec(),
        environment.clone(),
    )
    .await;
    assert!(imported.status.success(), "{}", text(&imported));
    let agents = Background::spawn(&["agent", "--tokens-file", &tokens_file], &environment);
    let ran = run(vec!["run".into(), "examples/process.yaml".into()], environment).await;
    assert!(ran.status.success(), "{}\nmuster up:\n{}\nmuster agent:\n{}", text(&ran), up.output(), agents.output());
    assert!(text(&ran).contains("execution completed"), "{}", text(&ran));
    drop(agents);

    // Ctrl-C stops everything, as it always did.
    up.signal(Signal::SIGINT);
    let (status, output) = up.wait(LIMIT).await;
    assert!(status.success(), "{output}");
    assert!(output.contains("stopping...\nstopped"), "{output}");
}

/// The validator's port taken while it is down, so every restart fails: after
/// five crashes within a minute `muster up` gives up, stops the other
/// services and exits non-zero, naming the service and what happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn muster_up_gives_up_on_a_service_that_keeps_crashing() {
    let data = Folder::new("up-give-up");
    let (up, output) = muster_up(&data).await;
    let (validator_url, validator_pid) = service(&output, "validator");
    let others: Vec<i32> = ["execution", "roster", "notifier"].iter().map(|name| service(&output, name).1).collect();
    let address = validator_url.trim_start_matches("http://").to_owned();

    kill(validator_pid);
    // The port frees once the process is gone; until then binding it fails.
    let deadline = tokio::time::Instant::now() + LIMIT;
    let _squatter = loop {
        match std::net::TcpListener::bind(&address) {
            Ok(listener) => break listener,
            Err(error) => assert!(tokio::time::Instant::now() < deadline, "{address} stayed taken: {error}"),
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };

    let (status, output) = up.wait(LIMIT).await;
    assert_eq!(status.code(), Some(2), "{output}");
    for attempt in 1..=4 {
        assert!(output.contains(&format!("(attempt {attempt})")), "{output}");
    }
    assert!(output.contains("validator did not come back: it exited (exit status: "), "{output}");
    // What each failed start wrote to the log is shown with it.
    assert!(output.contains("cannot listen"), "{output}");
    assert!(output.contains("validator crashed 5 times within 60 s"), "{output}");
    assert!(output.contains("gave up restarting it"), "{output}");
    assert!(output.contains("stopping the other services..."), "{output}");
    for pid in others {
        assert!(!is_running(pid), "service process {pid} outlived muster up:\n{output}");
    }
}
