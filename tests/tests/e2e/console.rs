//! The console in a real browser: the cluster with its console, the sample
//! agents served, and `console/tests/browser/console.mjs` driving Chromium
//! through Playwright (sign-in, the role matrix writing the YAML's roles
//! block, diagnostics at their line, publish and start, the graph turning
//! live, decisions only for those entitled, agents' text shown inert,
//! axe-core), taking a screenshot of each page: into a folder of the
//! test's own, removed after it, or into `MUSTER_SCREENSHOTS` when set
//! (`MUSTER_SCREENSHOTS=docs/console` renews the documentation's).
//! And over plain HTTP: the console's own refusals (no session, no CSRF
//! token, a tampered cookie), and the team page showing a session's subtask
//! requests.
//!
//! Chromium (`CHROMIUM`, default `/usr/bin/chromium`) and npm are installed
//! by `.ci/run`; without them the browser test says so and passes, except
//! under `CI=true`.

use std::{path::Path, process::Command, sync::Arc, time::Duration};

use muster::{
    sample::SampleBehaviour,
    worker::{self, AgentCredential},
};
use muster_tests::{Backend, TestCluster, agent};

use super::clients::{repository, tool};

/// The agents the browser's process names: id, role, team.
const AGENTS: &[(&str, &str, &str)] = &[
    ("manager-agent", "manager", "content"),
    ("writer-agent", "writer", "content"),
    ("editor-agent", "reviewer", "content"),
    ("archive-agent", "archivist", "operations"),
];

/// The browser's whole run must end within this.
const LIMIT: Duration = Duration::from_secs(240);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_browser() {
    let Some(npm) = tool("MUSTER_NPM", "npm", &["--version"]) else { return };
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".to_owned());
    if tool("CHROMIUM", &chromium, &["--version"]).is_none() {
        return;
    }
    let tests = repository().join("console/tests/browser");
    if !tests.join("node_modules/playwright-core").exists() {
        let installed = Command::new(&npm).args(["ci", "--no-audit", "--no-fund"]).current_dir(&tests).status();
        assert!(installed.is_ok_and(|status| status.success()), "npm ci in {}", tests.display());
    }
    let Some(test) = TestCluster::start_with_console(Backend::Sqlite).await else { return };
    let console_url = test.cluster().console_url().expect("the console runs");
    let agents: Vec<_> = AGENTS.iter().map(|(id, role, team)| agent(id, role, team)).collect();
    let tokens = test.register_agents(&agents).await;
    let credentials: Vec<AgentCredential> = agents
        .iter()
        .zip(&tokens)
        .map(|(agent, token)| AgentCredential { agent_id: agent.id.clone(), token: token.clone() })
        .collect();
    let (stop_worker, worker_stopped) = tokio::sync::oneshot::channel::<()>();
    let worker = tokio::spawn(worker::serve(
        test.operator("execution"),
        "console-worker".to_owned(),
        credentials,
        Arc::new(SampleBehaviour),
        async move {
            let _ = worker_stopped.await;
        },
    ));
    let token_of = |id: &str| tokens[AGENTS.iter().position(|(agent, ..)| *agent == id).expect("a test agent")].clone();
    // Into the documentation only when asked: a test run leaves the
    // repository as it found it.
    let kept = muster_tests::Folder::new("console-screenshots");
    let screenshots = match std::env::var_os("MUSTER_SCREENSHOTS") {
        Some(folder) => repository().join(folder),
        None => kept.0.clone(),
    };
    let mut browser = tokio::process::Command::new("node");
    browser
        .arg(tests.join("console.mjs"))
        .current_dir(&tests)
        .env("MUSTER_CONSOLE_URL", &console_url)
        .env("OPERATOR_TOKEN", &test.cluster().credentials.operator_token)
        .env("APPROVER_TOKEN", token_of("editor-agent"))
        .env("BYSTANDER_TOKEN", token_of("archive-agent"))
        .env("SCREENSHOTS", &screenshots)
        .env("CHROMIUM", &chromium)
        .kill_on_drop(true);
    let output = tokio::time::timeout(LIMIT, browser.output())
        .await
        .expect("the browser test ended in time")
        .expect("running node");
    let _ = stop_worker.send(());
    let _ = worker.await;
    let printed = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "the browser test failed:\n{printed}");
    for page in ["signin", "editor", "execution", "executions", "roster", "team", "executions-phone"] {
        assert!(Path::new(&screenshots.join(format!("{page}.png"))).exists(), "no screenshot of {page}");
    }
}

/// `request` sent to the console at `address`; its whole answer.
async fn http(address: &str, request: String) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(address).await.expect("connecting to the console");
    stream.write_all(request.as_bytes()).await.expect("sending");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.expect("reading");
    answer
}

fn get(path: &str, cookie: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: console\r\nConnection: close\r\nCookie: {cookie}\r\n\r\n")
}

fn post(path: &str, cookie: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: console\r\nConnection: close\r\nCookie: {cookie}\r\n\
         Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// The team page shows a session's subtask requests as the lead's dashboard has them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_team_page_shows_a_sessions_subtask_requests() {
    use muster_proto::execution::v1::{
        PublishProcessRequest, RequestSubtaskRequest, RoleAssignment, SessionTask, StartSessionRequest,
    };
    let Some(test) = TestCluster::start_with_console(Backend::Sqlite).await else { return };
    let address = test.cluster().console_url().expect("the console runs").trim_start_matches("http://").to_owned();
    let tokens = test.register_agents(&[agent("boss", "member", "core"), agent("arch", "member", "core")]).await;
    let mut client = test.execution();
    let source = "name: split\nsteps:\n  - {id: gate, type: human_approval, roles: {executor: boss}}\n";
    client.publish_process(PublishProcessRequest { source: source.into(), file_name: String::new() }).await.unwrap();
    let architect = RoleAssignment { agent_id: "arch".into(), role: "architect".into(), ..Default::default() };
    let session = muster_tests::start_session(
        &mut client,
        StartSessionRequest {
            process_name: "split".into(),
            lead_agent_id: "boss".into(),
            participants: vec![architect],
            task: Some(SessionTask { title: "Split it".into(), description: String::new() }),
            ..Default::default()
        },
    )
    .await;
    let request = RequestSubtaskRequest {
        execution_id: session.clone(),
        subtask: "Write the upgrade guide".into(),
        ..Default::default()
    };
    test.execution_as(&tokens[1]).request_subtask(request).await.unwrap();

    let token = &test.cluster().credentials.operator_token;
    let signed = http(&address, post("/signin", "", &format!("token={token}"))).await;
    let cookie_line = signed.lines().find(|line| line.starts_with("set-cookie: ")).expect("a session cookie");
    let cookie = cookie_line.trim_start_matches("set-cookie: ").split(';').next().unwrap();
    let page = http(&address, get(&format!("/team?execution={session}"), cookie)).await;
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    for shown in
        ["<caption>Subtask requests and their decisions</caption>", "Write the upgrade guide", "SUBTASK_STATUS_PENDING"]
    {
        assert!(page.contains(shown), "{shown} missing from the team page:\n{page}");
    }
}

/// The console refuses what does not come from a signed-in page of its own,
/// before the cluster is asked anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_without_a_browser() {
    let Some(test) = TestCluster::start_with_console(Backend::Sqlite).await else { return };
    let url = test.cluster().console_url().expect("the console runs");
    let address = url.trim_start_matches("http://").to_owned();
    let ask = |request: String| http(&address, request);

    let anonymous = ask(get("/executions", "")).await;
    assert!(anonymous.starts_with("HTTP/1.1 303") && anonymous.contains("location: /signin"), "{anonymous}");
    let policy = "content-security-policy: default-src 'none'; script-src 'self'";
    assert!(anonymous.contains(policy), "{anonymous}");

    let token = &test.cluster().credentials.operator_token;
    let signed = ask(post("/signin", "", &format!("token={token}"))).await;
    assert!(signed.contains("location: /executions"), "{signed}");
    let cookie_line = signed.lines().find(|line| line.starts_with("set-cookie: ")).expect("a session cookie");
    assert!(cookie_line.contains("HttpOnly") && cookie_line.contains("SameSite=Strict"), "{cookie_line}");
    assert!(!cookie_line.contains(token.as_str()), "the token is sealed in the cookie");
    let cookie = cookie_line.trim_start_matches("set-cookie: ").split(';').next().unwrap().to_owned();
    let list = ask(get("/executions", &cookie)).await;
    assert!(list.starts_with("HTTP/1.1 200"), "{list}");

    let forged = ask(post("/editor/publish", &cookie, "csrf=guess&source=name%3A%20x")).await;
    assert!(forged.starts_with("HTTP/1.1 403"), "{forged}");
    assert!(forged.contains("was not sent by this console"), "{forged}");

    let mut tampered = cookie.clone();
    let last = tampered.pop().unwrap();
    tampered.push(if last == 'A' { 'B' } else { 'A' });
    let refused = ask(get("/executions", &tampered)).await;
    assert!(refused.contains("location: /signin"), "{refused}");

    let wrong = ask(post("/signin", "", "token=not-a-token")).await;
    assert!(wrong.contains("the cluster does not know this token"), "{wrong}");
    assert!(!wrong.contains("set-cookie"), "{wrong}");
}
