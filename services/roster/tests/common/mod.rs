//! Test fixtures: a roster server in process on port 0, over SQLite or PostgreSQL.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;

use muster_proto::roster::v1::{self as pb, roster_service_client::RosterServiceClient};
use muster_roster::{Config, ManualClock, run_with_clock};
use muster_runtime::{
    auth::client::{AuthChannel, Credentials, with_credentials},
    testing::{TestCredentials, TestDatabase},
};
use tonic::transport::Channel;

/// Where the tests' clock starts: 2026-01-01T00:00:00Z.
pub const START_MILLIS: i64 = 1_767_225_600_000;

pub struct TestServer {
    /// A client calling as an operator.
    pub client: RosterServiceClient<AuthChannel>,
    pub credentials: TestCredentials,
    pub clock: Arc<ManualClock>,
    channel: Channel,
    pub database_url: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    handle: Option<tokio::task::JoinHandle<()>>,
    _database: Option<TestDatabase>,
    _file: Option<SqliteFile>,
}

/// A SQLite file of a test's own, in a folder of its own that is removed
/// when dropped: a server still winding down cannot create the file again
/// in a folder that is gone.
pub struct SqliteFile {
    folder: std::path::PathBuf,
    pub url: String,
}

impl Drop for SqliteFile {
    fn drop(&mut self) {
        muster_runtime::testing::remove_folder(&self.folder);
    }
}

pub fn sqlite_file() -> SqliteFile {
    let folder = std::env::temp_dir().join(format!("muster-roster-test-{}", uuid_like()));
    std::fs::create_dir_all(&folder).expect("a temporary folder");
    SqliteFile { url: format!("sqlite://{}", folder.join("roster.db").display()), folder }
}

fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or_default();
    format!("{}-{nanos}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// Which database a test runs on.
#[derive(Debug, Clone, Copy)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl TestServer {
    pub async fn sqlite() -> Self {
        let file = sqlite_file();
        let mut server = Self::start(file.url.clone(), None, 50).await;
        server._file = Some(file);
        server
    }

    pub async fn postgres() -> Option<Self> {
        let database = TestDatabase::create().await?;
        let url = database.url.clone();
        Some(Self::start(url, Some(database), 50).await)
    }

    pub async fn on(backend: Backend) -> Option<Self> {
        match backend {
            Backend::Sqlite => Some(Self::sqlite().await),
            Backend::Postgres => Self::postgres().await,
        }
    }

    async fn start(database_url: String, database: Option<TestDatabase>, sweep_ms: u64) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let mut config = Config::with_database(database_url.clone());
        config.queue_sweep_interval_ms = sweep_ms;
        // Other replicas' changes, removals included (every 60th refresh), found within seconds.
        config.index_refresh_interval_ms = 50;
        config.server.shutdown_grace_seconds = 1;
        let credentials = TestCredentials::new();
        credentials.apply(&mut config.server);
        let clock = Arc::new(ManualClock::new(START_MILLIS));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let handle = tokio::spawn(serve(config, listener, stopped, clock.clone()));
        let channel = muster_runtime::testing::connect_when_serving(&format!("http://{address}")).await;
        Self {
            client: RosterServiceClient::new(with_credentials(channel.clone(), credentials.operator())),
            credentials,
            channel,
            clock,
            database_url,
            stop: Some(stop),
            handle: Some(handle),
            _database: database,
            _file: None,
        }
    }

    /// Another roster process on the same database (a replica, as a second
    /// pod would be), with credentials and a clock of its own.
    pub async fn replica(&self) -> Self {
        Self::start(self.database_url.clone(), None, 50).await
    }

    /// A client calling with `credentials`.
    pub fn client_with(&self, credentials: Credentials) -> RosterServiceClient<AuthChannel> {
        RosterServiceClient::new(with_credentials(self.channel.clone(), credentials))
    }

    /// A client calling with a bearer token.
    pub fn client_as(&self, token: &str) -> RosterServiceClient<AuthChannel> {
        self.client_with(Credentials::bearer(token).expect("a valid token"))
    }

    /// A raw channel, for clients of the roster's other services.
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    pub async fn team(&mut self, name: &str) {
        self.client
            .put_team(pb::PutTeamRequest { team: Some(pb::Team { name: name.into(), ..Default::default() }) })
            .await
            .expect("put team");
    }

    /// Registers an agent: `spec` gives id, team, senior, expertise and capacity.
    pub async fn agent(&mut self, id: &str, team: &str, senior: &str, expertise: &[&str], capacity: u32) -> String {
        let response = self
            .client
            .register_agent(pb::RegisterAgentRequest {
                agent: Some(pb::Agent {
                    id: id.into(),
                    name: title(id),
                    role: "member".into(),
                    team: team.into(),
                    senior_id: senior.into(),
                    expertise: expertise.iter().map(|tag| (*tag).to_owned()).collect(),
                    workload_capacity: capacity,
                    ..Default::default()
                }),
            })
            .await
            .unwrap_or_else(|status| panic!("register {id}: {status:?}"));
        response.into_inner().token
    }

    pub async fn get(&mut self, id: &str) -> pb::Agent {
        self.client
            .get_agent(pb::GetAgentRequest { id: id.into() })
            .await
            .expect("get")
            .into_inner()
            .agent
            .expect("agent")
    }

    pub async fn delegate(&mut self, request: pb::DelegateRequest) -> pb::DelegationDecision {
        self.client
            .delegate(request)
            .await
            .unwrap_or_else(|status| panic!("delegate: {status:?}"))
            .into_inner()
            .decision
            .expect("decision")
    }

    pub fn clock_now(&self) -> i64 {
        use muster_roster::Clock as _;
        self.clock.now_millis()
    }

    /// The server's SQLite file, for a test that reads it after the server stopped.
    #[allow(dead_code)]
    pub fn take_file(&mut self) -> Option<SqliteFile> {
        self._file.take()
    }

    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(handle) = self.handle.take() {
            let _ = handle.await;
        }
    }
}

fn title(id: &str) -> String {
    let mut chars = id.chars();
    chars.next().map(|first| first.to_uppercase().chain(chars).collect()).unwrap_or_default()
}

async fn serve(
    config: Config,
    listener: tokio::net::TcpListener,
    stopped: tokio::sync::oneshot::Receiver<()>,
    clock: Arc<ManualClock>,
) {
    let shutdown = async move {
        let _ = stopped.await;
    };
    if let Err(error) = run_with_clock(config, listener, shutdown, clock).await {
        panic!("roster stopped with an error: {error}");
    }
}

pub fn delegate_request(task_id: &str, requester: &str, expertise: &[&str]) -> pb::DelegateRequest {
    pb::DelegateRequest {
        task_id: task_id.into(),
        requester_id: requester.into(),
        required_expertise: expertise.iter().map(|tag| (*tag).to_owned()).collect(),
        ..Default::default()
    }
}
