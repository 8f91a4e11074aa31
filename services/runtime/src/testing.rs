//! Test support (feature `testing`): a private PostgreSQL database per test,
//! credentials for a test cluster, and a stand-in for the roster's
//! credential stream.
//!
//! Tests reach the server at `MUSTER_TEST_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`). Without a server they are
//! skipped with a message, except under `CI=true`, where that is a failure.

use sqlx::{AssertSqlSafe, Connection, Executor, PgConnection};

/// Removes a test's folder and everything in it. A service still winding
/// down (a SQLite connection closing, its checkpointer) can create a file in
/// the folder while it is being removed, which leaves it behind: the
/// removal is tried again for up to two seconds until the folder is gone.
#[expect(
    clippy::disallowed_methods,
    reason = "a test's clean-up, retried while a stopped process lets go of its files"
)]
pub fn remove_folder(folder: &std::path::Path) {
    for _ in 0..40 {
        let _ = std::fs::remove_dir_all(folder);
        if !folder.exists() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The administrative URL of the test server.
pub fn postgres_admin_url() -> String {
    std::env::var("MUSTER_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// A database created for one test and dropped when this value is dropped.
#[derive(Debug)]
pub struct TestDatabase {
    /// The URL of the new database.
    pub url: String,
    name: String,
    admin_url: String,
}

impl TestDatabase {
    /// Creates a fresh database, or returns `None` (after saying so) when no
    /// server answers and `CI` is not `true`.
    pub async fn create() -> Option<Self> {
        let admin_url = postgres_admin_url();
        let mut admin = match PgConnection::connect(&admin_url).await {
            Ok(connection) => connection,
            Err(error) => {
                if std::env::var("CI").as_deref() == Ok("true") {
                    panic!("PostgreSQL is required under CI=true but {admin_url} does not answer: {error}");
                }
                eprintln!("skipping PostgreSQL test: {admin_url} does not answer ({error})");
                return None;
            }
        };
        let name = format!("muster_test_{}", uuid::Uuid::new_v4().simple());
        admin.execute(AssertSqlSafe(format!("CREATE DATABASE {name}"))).await.expect("creating the test database");
        let base = admin_url.rsplit_once('/').map(|(base, _)| base).unwrap_or(&admin_url);
        Some(Self { url: format!("{base}/{name}"), name, admin_url })
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let admin_url = self.admin_url.clone();
        let name = self.name.clone();
        // Drop may run inside or outside a runtime: use a thread of its own.
        let dropper = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
            if let Ok(runtime) = runtime {
                runtime.block_on(async move {
                    if let Ok(mut admin) = PgConnection::connect(&admin_url).await {
                        let _ =
                            admin.execute(AssertSqlSafe(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))).await;
                    }
                });
            }
        });
        let _ = dropper.join();
    }
}

/// Connects to a server at `url` (`http://host:port`) once its health service
/// reports SERVING, polling without fixed sleeps; panics after 30 seconds.
pub async fn connect_when_serving(url: &str) -> tonic::transport::Channel {
    use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient};
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        if let Ok(endpoint) = tonic::transport::Endpoint::from_shared(url.to_owned())
            && let Ok(channel) = endpoint.tcp_nodelay(true).connect().await
            && let Ok(response) =
                HealthClient::new(channel.clone()).check(HealthCheckRequest { service: String::new() }).await
            && response.into_inner().status == ServingStatus::Serving as i32
        {
            return channel;
        }
        assert!(tokio::time::Instant::now() < deadline, "{url} never reported SERVING");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Credentials for a test cluster: an operator token, a service secret,
/// and what services and clients need of them.
#[derive(Debug, Clone)]
pub struct TestCredentials {
    /// The operator's token (operator name `tester`).
    pub operator_token: String,
    /// The cluster's service secret.
    pub service_secret: String,
}

impl Default for TestCredentials {
    fn default() -> Self {
        Self::new()
    }
}

impl TestCredentials {
    /// Fresh random credentials.
    pub fn new() -> Self {
        Self {
            operator_token: crate::auth::token::generate(crate::auth::token::OPERATOR_PREFIX).expect("random source"),
            service_secret: crate::auth::token::generate_secret().expect("random source"),
        }
    }

    /// `MUSTER_OPERATORS` and `MUSTER_SERVICE_SECRET` for service processes.
    pub fn environment(&self) -> Vec<(String, String)> {
        vec![
            ("MUSTER_OPERATORS".to_owned(), self.operators_entry()),
            ("MUSTER_SERVICE_SECRET".to_owned(), self.service_secret.clone()),
        ]
    }

    fn operators_entry(&self) -> String {
        format!("tester:{}", crate::auth::TokenHash::of(&self.operator_token).to_hex())
    }

    /// Puts the credentials into an in-process service's settings.
    pub fn apply(&self, args: &mut crate::ServerArgs) {
        args.auth.operators = Some(crate::auth::Secret(self.operators_entry()));
        args.auth.service_secret = Some(crate::auth::Secret(self.service_secret.clone()));
    }

    /// Client credentials of the operator.
    pub fn operator(&self) -> crate::auth::client::Credentials {
        crate::auth::client::Credentials::bearer(&self.operator_token).expect("a valid token")
    }

    /// The credential of service `name`.
    pub fn service_token(&self, name: &str) -> String {
        crate::auth::ServiceSecret::new(&self.service_secret).expect("a valid secret").credential(name)
    }

    /// Client credentials of service `name`.
    pub fn service(&self, name: &str) -> crate::auth::client::Credentials {
        crate::auth::client::Credentials::bearer(&self.service_token(name)).expect("a valid token")
    }
}

/// A channel to `url` whose calls carry `credentials`, once the server at
/// `url` reports SERVING (see [`connect_when_serving`]).
pub async fn authorized_channel(
    url: &str,
    credentials: crate::auth::client::Credentials,
) -> crate::auth::client::AuthChannel {
    crate::auth::client::with_credentials(connect_when_serving(url).await, credentials)
}

/// An in-memory stand-in for the roster's credential log: a
/// `WatchCredentials` server on a free port that issues and revokes agent
/// tokens, for services tested without a roster.
#[derive(Debug, Clone)]
pub struct FakeCredentials {
    /// The server's URL: the services' `MUSTER_ROSTER_URL`.
    pub url: String,
    log: std::sync::Arc<MemoryCredentialLog>,
}

#[derive(Debug, Default)]
pub(crate) struct MemoryCredentialLog {
    changes: std::sync::Mutex<Vec<crate::auth::directory::CredentialChange>>,
    changed: tokio::sync::Notify,
}

impl crate::auth::watch::CredentialLog for MemoryCredentialLog {
    async fn changes_after(
        &self,
        position: crate::auth::directory::Position,
        limit: usize,
    ) -> Result<Vec<crate::auth::directory::CredentialChange>, tonic::Status> {
        let changes = self.changes.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        Ok(changes
            .iter()
            .filter(|change| (change.revision, Some(change.token)) > (position.revision, position.token))
            .take(limit)
            .cloned()
            .collect())
    }

    fn changed(&self) -> &tokio::sync::Notify {
        &self.changed
    }
}

impl FakeCredentials {
    /// Serves an empty credential log; its calls are checked with `credentials`.
    pub async fn start(credentials: &TestCredentials) -> Self {
        let log = std::sync::Arc::new(MemoryCredentialLog::default());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binding");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let mut args = crate::ServerArgs::default();
        credentials.apply(&mut args);
        let directory = crate::auth::AgentDirectory::new(std::time::Duration::from_secs(5));
        directory.caught_up();
        let security = crate::security::Security::with_directory("roster", &args, directory).expect("test security");
        let service = muster_proto::roster::v1::credential_service_server::CredentialServiceServer::new(
            crate::auth::watch::CredentialStream::new(log.clone()),
        );
        tokio::spawn(async move {
            let server = crate::Server::new(&args)
                .add_service(service, &[crate::auth::rule("WatchCredentials", crate::auth::Access::SERVICE)]);
            let _ = server.serve(listener, &security, async { Ok(()) }, std::future::pending()).await;
        });
        connect_when_serving(&url).await;
        Self { url, log }
    }

    fn record(&self, token: &str, agent_id: &str, active: bool) {
        let mut changes = self.log.changes.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let revision = changes.last().map_or(1, |last| last.revision + 1);
        changes.push(crate::auth::directory::CredentialChange {
            token: crate::auth::TokenHash::of(token),
            agent_id: agent_id.to_owned(),
            role: String::new(),
            active,
            revision,
        });
        drop(changes);
        self.log.changed.notify_waiters();
    }

    /// Issues a token to `agent_id`.
    pub fn issue(&self, agent_id: &str) -> String {
        let token = crate::auth::token::generate(crate::auth::token::AGENT_PREFIX).expect("random source");
        self.record(&token, agent_id, true);
        token
    }

    /// Revokes a token issued by [`Self::issue`].
    pub fn revoke(&self, token: &str, agent_id: &str) {
        self.record(token, agent_id, false);
    }
}
