//! Harness for the end-to-end tests: builds the four service binaries, starts
//! them as real processes on free ports with SQLite or PostgreSQL, and tears
//! everything down (processes, data folder, databases) afterwards.
#![forbid(unsafe_code)]

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
    time::Duration,
};

use muster::{
    cluster::{Cluster, ClusterOptions, DatabaseUrls, Ports, default_binary_dir},
    credentials::Endpoint,
};
use muster_proto::roster::v1::{
    Agent, PutTeamRequest, RegisterAgentRequest, Team, roster_service_client::RosterServiceClient,
};
use muster_proto::{
    common::v1::{EventType, StepEvent},
    execution::v1::{
        PublishProcessRequest, StartExecutionRequest, WatchExecutionRequest,
        execution_service_client::ExecutionServiceClient,
    },
    notifier::v1::notifier_service_client::NotifierServiceClient,
};
use muster_runtime::{auth::client::AuthChannel, testing::TestDatabase};

/// The execution service's client, as the tests use it.
pub type ExecutionClient = ExecutionServiceClient<AuthChannel>;
/// The roster's client.
pub type RosterClient = RosterServiceClient<AuthChannel>;
/// The notifier's client.
pub type NotifierClient = NotifierServiceClient<AuthChannel>;

pub mod command;
pub mod network;
pub mod otlp;
pub mod pki;
pub mod raw;
pub mod spread;

/// Which database the services use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A SQLite file per service.
    Sqlite,
    /// A private PostgreSQL database per service.
    Postgres,
}

/// Builds the service binaries and `muster` once per test process, so a test never runs stale ones.
pub fn build_service_binaries() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
        // Benchmarks run from target/release: build the services the same way.
        let release = default_binary_dir().is_ok_and(|dir| dir.ends_with("release"));
        let mut command = Command::new(cargo);
        // Cargo gives a test or bench process its package's variables; passed
        // on, build scripts that watch them (ring's) see a change and rebuild
        // everything above them, each time `cargo test` and this build alternate.
        for (name, _) in std::env::vars_os() {
            let name = name.to_string_lossy();
            let per_package = name.starts_with("CARGO_PKG_")
                || ["CARGO_MANIFEST_DIR", "CARGO_MANIFEST_PATH", "CARGO_CRATE_NAME", "CARGO_PRIMARY_PACKAGE"]
                    .contains(&name.as_ref());
            if per_package {
                command.env_remove(name.as_ref());
            }
        }
        let status = command
            .args(["build", "--quiet", "--manifest-path"])
            .arg(&manifest)
            .args(release.then_some("--release"))
            // Every binary of the workspace, as the README's `cargo build
            // --bins` does: the same features as `cargo test --workspace`,
            // so nothing it built is built again.
            .args(["--workspace", "--bins"])
            .status()
            .expect("running cargo build for the service binaries and muster");
        assert!(status.success(), "building the service binaries and muster failed");
    });
}

/// A cluster of four real service processes, removed with everything it made when dropped.
pub struct TestCluster {
    /// The running cluster.
    pub cluster: Option<Cluster>,
    /// Its data folder.
    pub data_dir: PathBuf,
    _databases: Vec<TestDatabase>,
}

impl TestCluster {
    /// Starts a cluster; `None` when PostgreSQL is asked for and unavailable (outside CI).
    pub async fn start(backend: Backend) -> Option<Self> {
        Self::start_with_environment(backend, Vec::new()).await
    }

    /// Starts a cluster whose services get extra environment variables.
    pub async fn start_with_environment(backend: Backend, extra: Vec<(String, String)>) -> Option<Self> {
        Self::start_cluster(backend, extra, false).await
    }

    /// Starts a cluster with its console (`cluster().console_url()`).
    pub async fn start_with_console(backend: Backend) -> Option<Self> {
        Self::start_cluster(backend, Vec::new(), true).await
    }

    async fn start_cluster(backend: Backend, extra: Vec<(String, String)>, console: bool) -> Option<Self> {
        build_service_binaries();
        let data_dir = std::env::temp_dir().join(format!("muster-e2e-{}", uuid::Uuid::new_v4().simple()));
        let mut databases = Vec::new();
        let database_urls = match backend {
            Backend::Sqlite => DatabaseUrls::default(),
            Backend::Postgres => {
                for _ in 0..3 {
                    databases.push(TestDatabase::create().await?);
                }
                DatabaseUrls {
                    roster: Some(databases[0].url.clone()),
                    execution: Some(databases[1].url.clone()),
                    notifier: Some(databases[2].url.clone()),
                }
            }
        };
        let options = ClusterOptions {
            binary_dir: default_binary_dir().expect("locating the binaries"),
            data_dir: data_dir.clone(),
            host: std::net::IpAddr::from([127, 0, 0, 1]),
            ports: Ports { execution: 0, roster: 0, validator: 0, notifier: 0, console: 0 },
            database_urls,
            // `MUSTER_LOG=debug cargo test ...` turns up the services' logs.
            environment: std::env::var("MUSTER_LOG")
                .map(|filter| ("MUSTER_LOG".to_owned(), filter))
                .into_iter()
                .chain(extra)
                .collect(),
            console,
        };
        let cluster = Cluster::start(options).await.expect("starting the cluster");
        Some(Self { cluster: Some(cluster), data_dir, _databases: databases })
    }

    /// The cluster.
    pub fn cluster(&self) -> &Cluster {
        self.cluster.as_ref().expect("the cluster is running")
    }

    /// The cluster, mutably (to kill and restart services).
    pub fn cluster_mut(&mut self) -> &mut Cluster {
        self.cluster.as_mut().expect("the cluster is running")
    }

    /// A service of the cluster, called as its local operator.
    pub fn operator(&self, service: &str) -> Endpoint {
        self.cluster().as_operator(service)
    }

    /// A service of the cluster, called with `token`.
    pub fn caller(&self, service: &str, token: &str) -> Endpoint {
        Endpoint::new(self.cluster().service(service).url(), token)
    }

    /// The credential of one of the cluster's services, from its service secret.
    pub fn service_token(&self, service: &str) -> String {
        let secret =
            std::fs::read_to_string(&self.cluster().credentials.service_secret_file).expect("the service secret");
        muster_runtime::auth::ServiceSecret::new(&secret).expect("a valid secret").credential(service)
    }

    /// The environment that points the `muster` command at this cluster, as
    /// its local operator (whose token the command finds in the data folder).
    pub fn command_environment(&self) -> Vec<(String, String)> {
        vec![
            ("MUSTER_EXECUTION_URL".to_owned(), self.cluster().execution_url()),
            ("MUSTER_ROSTER_URL".to_owned(), self.cluster().roster_url()),
            ("MUSTER_NOTIFIER_URL".to_owned(), self.cluster().notifier_url()),
            ("MUSTER_DATA_DIR".to_owned(), self.data_dir.display().to_string()),
        ]
    }

    /// The execution service, as the operator.
    pub fn execution(&self) -> ExecutionClient {
        ExecutionServiceClient::new(self.operator("execution").channel().expect("a channel"))
    }

    /// The execution service, called with `token`.
    pub fn execution_as(&self, token: &str) -> ExecutionClient {
        ExecutionServiceClient::new(self.caller("execution", token).channel().expect("a channel"))
    }

    /// The execution service, called with these credentials (or none).
    pub fn execution_with(&self, credentials: muster_runtime::auth::client::Credentials) -> ExecutionClient {
        let channel =
            tonic::transport::Endpoint::from_shared(self.cluster().execution_url()).expect("a URL").connect_lazy();
        ExecutionServiceClient::new(muster_runtime::auth::client::with_credentials(channel, credentials))
    }

    /// The roster, as the operator.
    pub fn roster(&self) -> RosterClient {
        RosterServiceClient::new(self.operator("roster").channel().expect("a channel"))
    }

    /// The roster, called with `token`.
    pub fn roster_as(&self, token: &str) -> RosterClient {
        RosterServiceClient::new(self.caller("roster", token).channel().expect("a channel"))
    }

    /// The notifier, as the operator.
    pub fn notifier(&self) -> NotifierClient {
        NotifierServiceClient::new(self.operator("notifier").channel().expect("a channel"))
    }

    /// The notifier, called with `token`.
    pub fn notifier_as(&self, token: &str) -> NotifierClient {
        NotifierServiceClient::new(self.caller("notifier", token).channel().expect("a channel"))
    }

    /// Creates the agents' teams, registers the agents and returns their tokens, in order.
    pub async fn register_agents(&self, agents: &[Agent]) -> Vec<String> {
        register_agents(&mut self.roster(), agents).await
    }

    /// Stops the services gracefully; the data folder and databases go on drop.
    pub async fn shutdown(mut self) {
        if let Some(cluster) = self.cluster.take() {
            cluster.shutdown().await.expect("stopping the cluster");
        }
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // The services' logs are the first thing to read when a test fails.
            for service in muster::cluster::SERVICES {
                print_log_tail(&self.data_dir.join("logs").join(format!("{service}.log")));
            }
        }
        // Child processes are killed on drop (kill_on_drop) before the data goes.
        self.cluster.take();
        if std::thread::panicking() {
            eprintln!("the cluster's data folder is kept for inspection: {}", self.data_dir.display());
        } else {
            muster_runtime::testing::remove_folder(&self.data_dir);
        }
    }
}

/// Creates the agents' teams through `roster`, registers the agents and
/// returns their tokens, in order.
pub async fn register_agents(roster: &mut RosterClient, agents: &[Agent]) -> Vec<String> {
    let mut teams: Vec<&str> = agents.iter().map(|agent| agent.team.as_str()).filter(|team| !team.is_empty()).collect();
    teams.sort_unstable();
    teams.dedup();
    for team in teams {
        roster
            .put_team(PutTeamRequest { team: Some(Team { name: team.to_owned(), ..Default::default() }) })
            .await
            .unwrap_or_else(|status| panic!("creating team {team}: {status}"));
    }
    let mut tokens = Vec::new();
    for agent in agents {
        let response = roster
            .register_agent(RegisterAgentRequest { agent: Some(agent.clone()) })
            .await
            .unwrap_or_else(|status| panic!("registering {}: {status}", agent.id))
            .into_inner();
        tokens.push(response.token);
    }
    tokens
}

/// Prints the last lines of a service's log to the test's output: the
/// first thing to read when a test fails.
pub fn print_log_tail(log: &Path) {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    eprintln!("---- last lines of {} ----", log.display());
    for line in &lines[lines.len().saturating_sub(40)..] {
        eprintln!("{line}");
    }
}

/// A folder in the temporary folder, removed when dropped.
pub struct Folder(pub PathBuf);

impl Folder {
    /// A new, empty folder whose name starts with `muster-<label>-`.
    pub fn new(label: &str) -> Self {
        let path = std::env::temp_dir().join(format!("muster-{label}-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&path).expect("creating a temporary folder");
        Self(path)
    }
}

impl Drop for Folder {
    fn drop(&mut self) {
        muster_runtime::testing::remove_folder(&self.0);
    }
}

/// A worker serving `agents` with the sample behaviour, stopped when the
/// returned sender is dropped or sent to; it connects with `execution`'s
/// credential (an operator's lets it provide the sample tools).
pub fn spawn_sample_worker(
    execution: Endpoint,
    credentials: Vec<muster::worker::AgentCredential>,
) -> (tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<anyhow::Result<()>>) {
    spawn_worker(execution, credentials, muster::sample::SampleBehaviour)
}

/// A worker serving `agents` with `behaviour`, stopped like
/// [`spawn_sample_worker`]'s.
pub fn spawn_worker<B: muster::worker::Behaviour>(
    execution: Endpoint,
    credentials: Vec<muster::worker::AgentCredential>,
    behaviour: B,
) -> (tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<anyhow::Result<()>>) {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let handle = tokio::spawn(muster::worker::serve(
        execution,
        "test-worker".to_owned(),
        credentials,
        std::sync::Arc::new(behaviour),
        async move {
            let _ = stopped.await;
        },
    ));
    (stop, handle)
}

/// A behaviour that answers every assignment at once with a small output,
/// for the benches: the engine's own cost, no agent's.
#[derive(Debug, Clone, Copy, Default)]
pub struct StubBehaviour;

impl muster::worker::Behaviour for StubBehaviour {
    async fn run(
        &self,
        assignment: muster_proto::execution::v1::Assignment,
        _step: muster::worker::Step,
    ) -> muster::worker::StepOutcome {
        muster::worker::StepOutcome::Completed {
            output_json: format!(r#"{{"done":"{}"}}"#, assignment.step_id),
            tokens_used: 1,
            cost: 0.0,
            iterations: 1,
            remember: Vec::new(),
            skip_triggers: false,
        }
    }
}

/// A process of `length` steps in a chain, each run by `agent` and informing `informed`.
pub fn chain_process(name: &str, length: usize, agent: &str, informed: &str, inputs: &str) -> String {
    let mut yaml = format!("name: {name}\nlead: {informed}\nsteps:\n");
    for index in 0..length {
        yaml.push_str(&format!(
            "  - id: s{index}\n    type: agent_task\n    agent: {agent}\n    message: step {index}\n    inputs: {inputs}\n    roles:\n      executor: {agent}\n      informed: [{informed}]\n"
        ));
        if index > 0 {
            yaml.push_str(&format!("    depends_on: [s{}]\n", index - 1));
        }
    }
    yaml
}

/// The resident memory of process `pid`, in KiB (0 when it cannot be read).
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// An agent with an id, a role and a team.
pub fn agent(id: &str, role: &str, team: &str) -> Agent {
    Agent { id: id.to_owned(), name: id.to_owned(), role: role.to_owned(), team: team.to_owned(), ..Default::default() }
}

/// Starts a team session as `client`'s caller; its execution's id.
pub async fn start_session(
    client: &mut ExecutionClient,
    request: muster_proto::execution::v1::StartSessionRequest,
) -> String {
    client.start_session(request).await.expect("starting a session").into_inner().execution.expect("an execution").id
}

/// Publishes a process and starts an execution of it with no inputs; its id.
pub async fn publish_and_start(client: &mut ExecutionClient, source: &str) -> String {
    let process = client
        .publish_process(PublishProcessRequest { source: source.to_owned(), file_name: "test.yaml".to_owned() })
        .await
        .unwrap_or_else(|status| panic!("publish: {status}"))
        .into_inner()
        .process
        .expect("a published process");
    client
        .start_execution(StartExecutionRequest { process_name: process.name, ..Default::default() })
        .await
        .unwrap_or_else(|status| panic!("start: {status}"))
        .into_inner()
        .execution
        .expect("an execution")
        .id
}

/// Watches until the execution ends, reconnecting (from the last sequence) when the service restarts.
pub async fn events_until_finished(execution: &Endpoint, execution_id: &str) -> Vec<StepEvent> {
    let mut events: Vec<StepEvent> = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    loop {
        assert!(tokio::time::Instant::now() < deadline, "the execution did not finish");
        let mut client = ExecutionServiceClient::new(execution.channel().expect("a channel"));
        let after_sequence = events.last().map_or(0, |event| event.sequence);
        let Ok(response) = client
            .watch_execution(WatchExecutionRequest { execution_id: execution_id.to_owned(), after_sequence })
            .await
        else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let mut stream = response.into_inner();
        while let Ok(Some(message)) = stream.message().await {
            let event = message.event.unwrap();
            let done = event.event_type == EventType::ExecutionFinished as i32;
            events.push(event);
            if done {
                return events;
            }
        }
    }
}

/// A wire JSON value as `serde_json` (`null` when not set).
pub fn json_of(value: &Option<prost_types::Value>) -> serde_json::Value {
    value
        .as_ref()
        .map_or(serde_json::Value::Null, |value| muster_runtime::json::to_json(value).expect("finite numbers"))
}

/// A wire JSON object from JSON text.
pub fn object(text: &str) -> Option<prost_types::Struct> {
    muster_runtime::json::struct_from_text(text).expect("a JSON object")
}

/// A wire JSON value from JSON text.
pub fn value(text: &str) -> Option<prost_types::Value> {
    Some(muster_runtime::json::value_from_text(text).expect("JSON"))
}

/// Calls `call` until the service admits it: a call shed with
/// RESOURCE_EXHAUSTED (the service at its limit of calls in flight) is made
/// again a moment later, as a client honouring the refusal's `RetryInfo`
/// does. Any other answer is returned.
pub async fn admitted<T, F, Fut>(mut call: F) -> Result<T, tonic::Status>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    loop {
        match call().await {
            Err(status) if status.code() == tonic::Code::ResourceExhausted => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            answer => return answer,
        }
    }
}

/// A request made as the agent (or other caller) holding `token`.
pub fn as_agent<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().expect("a visible ASCII token"));
    request
}

/// Every line of the NDJSON memory files in `dir` (an agent's `events`
/// folder), parsed; none when the folder is missing.
pub fn ndjson_lines(dir: &std::path::Path) -> Vec<serde_json::Value> {
    let mut lines = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return lines };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        assert!(name.starts_with("notifications_") && name.ends_with(".ndjson"), "unexpected file {name}");
        for line in std::fs::read_to_string(entry.path()).unwrap().lines() {
            lines.push(serde_json::from_str(line).unwrap_or_else(|error| panic!("{name}: {error}: {line}")));
        }
    }
    lines
}
