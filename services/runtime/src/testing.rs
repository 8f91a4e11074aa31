//! Test support (feature `testing`): a private PostgreSQL database per test.
//!
//! Tests reach the server at `MUSTER_TEST_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`). Without a server they are
//! skipped with a message, except under `CI=true`, where that is a failure.

use sqlx::{AssertSqlSafe, Connection, Executor, PgConnection};

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
