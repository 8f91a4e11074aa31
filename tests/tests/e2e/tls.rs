//! Transport security with the real service processes: mutual TLS between
//! clients and services and between the services themselves (a certificate
//! naming `muster-<service>` is that service's credential), certificates
//! reloaded when their files change, and PostgreSQL reached over TLS (a
//! private server the test starts with `initdb` and `pg_ctl`).

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use muster_proto::{
    roster::v1::{
        ListTeamsRequest, RegisterAgentRequest, WatchCredentialsRequest, roster_service_client::RosterServiceClient,
    },
    validator::v1::{ValidateProcessRequest, validator_service_client::ValidatorServiceClient},
};
use muster_runtime::{
    auth::client::{AuthChannel, Credentials, with_credentials},
    testing::TestCredentials,
    tls::{ClientTls, TlsArgs},
};
use muster_tests::{Folder, agent, build_service_binaries, pki::TestCa, print_log_tail};
use tonic::Code;
use tonic_types::StatusExt as _;

/// A service binary running as a process, killed when dropped.
struct Process {
    _child: tokio::process::Child,
    address: SocketAddr,
    log: PathBuf,
}

impl Drop for Process {
    fn drop(&mut self) {
        if std::thread::panicking() {
            print_log_tail(&self.log);
        }
    }
}

async fn spawn(service: &str, folder: &Path, environment: Vec<(String, String)>) -> Process {
    spawn_as(service, service, folder, environment).await
}

/// Like [`spawn`], with files named after `name` (for a second replica).
async fn spawn_as(service: &str, name: &str, folder: &Path, environment: Vec<(String, String)>) -> Process {
    build_service_binaries();
    let binary = muster::cluster::default_binary_dir().unwrap().join(format!("muster-{service}"));
    let port_file = folder.join(format!("{name}.port"));
    let log_path = folder.join(format!("{name}.log"));
    let log = std::fs::File::create(&log_path).unwrap();
    let child = tokio::process::Command::new(binary)
        .env("MUSTER_LISTEN", "127.0.0.1:0")
        .env("MUSTER_PORT_FILE", &port_file)
        .env("MUSTER_LOG_FORMAT", "json")
        .env("MUSTER_DATABASE_URL", format!("sqlite://{}", folder.join(format!("{name}.db")).display()))
        .envs(environment)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let address = loop {
        if let Ok(text) = std::fs::read_to_string(&port_file)
            && let Ok(address) = text.trim().parse()
        {
            break address;
        }
        assert!(tokio::time::Instant::now() < deadline, "muster-{service} did not listen: see {}", folder.display());
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    Process { _child: child, address, log: log_path }
}

/// A channel to `address` over TLS, trusting `ca`, presenting `client` (or no certificate).
fn tls_channel(
    address: SocketAddr,
    ca: &Path,
    client: Option<&muster_tests::pki::Issued>,
    token: Option<&str>,
) -> AuthChannel {
    let settings = TlsArgs {
        tls_ca_file: Some(ca.to_path_buf()),
        tls_cert_file: client.map(|issued| issued.cert.clone()),
        tls_key_file: client.map(|issued| issued.key.clone()),
        ..TlsArgs::default()
    };
    let tls = ClientTls::load(&settings).unwrap();
    let channel =
        muster_runtime::tls::lazy_channel(&format!("https://localhost:{}", address.port()), Some(&tls)).unwrap();
    let credentials = token.map_or_else(Credentials::none, |token| Credentials::bearer(token).unwrap());
    with_credentials(channel, credentials)
}

/// A call cut off by the transport (the TLS handshake), not answered by the service.
fn is_transport_refusal(status: &tonic::Status) -> bool {
    matches!(status.code(), Code::Unavailable | Code::Unknown | Code::Cancelled | Code::Internal)
        && std::error::Error::source(status).is_some()
}

/// Retries `call` until it succeeds, for 20 seconds.
async fn eventually<T, F: std::future::Future<Output = Result<T, tonic::Status>>>(
    what: &str,
    mut call: impl FnMut() -> F,
) -> T {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match call().await {
            Ok(value) => return value,
            Err(status) => {
                assert!(tokio::time::Instant::now() < deadline, "{what}: {status:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// A service's TLS settings: its certificate, the CA, client certificates required.
fn tls_environment(ca: &Path, issued: &muster_tests::pki::Issued) -> Vec<(String, String)> {
    vec![
        ("MUSTER_TLS_CERT_FILE".into(), issued.cert.display().to_string()),
        ("MUSTER_TLS_KEY_FILE".into(), issued.key.display().to_string()),
        ("MUSTER_TLS_CA_FILE".into(), ca.display().to_string()),
        ("MUSTER_TLS_CLIENT_AUTH".into(), "required".into()),
        ("MUSTER_TLS_RELOAD_SECONDS".into(), "1".into()),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_between_clients_and_services_and_among_services() {
    let folder = Folder::new("mtls");
    let ca = TestCa::new("muster test CA");
    let ca_file = ca.write(&folder.0.join("ca.crt"));
    let roster_certificate = ca.issue(&folder.0, "roster", &["muster-roster", "localhost"]);
    let validator_certificate = ca.issue(&folder.0, "validator", &["muster-validator", "localhost"]);
    let operator_certificate = ca.issue(&folder.0, "operator", &["ops-workstation"]);
    // No service secret: under mutual TLS the certificates name the services.
    let credentials = TestCredentials::new();
    let operators =
        credentials.environment().into_iter().filter(|(name, _)| name == "MUSTER_OPERATORS").collect::<Vec<_>>();
    let roster =
        spawn("roster", &folder.0, [operators.clone(), tls_environment(&ca_file, &roster_certificate)].concat()).await;
    let validator = spawn(
        "validator",
        &folder.0,
        [
            operators,
            tls_environment(&ca_file, &validator_certificate),
            vec![("MUSTER_ROSTER_URL".into(), format!("https://localhost:{}", roster.address.port()))],
        ]
        .concat(),
    )
    .await;
    let operator = credentials.operator_token.clone();
    let mut as_operator =
        RosterServiceClient::new(tls_channel(roster.address, &ca_file, Some(&operator_certificate), Some(&operator)));
    eventually("the roster serves over TLS", || {
        let mut client = as_operator.clone();
        async move { client.list_teams(ListTeamsRequest::default()).await }
    })
    .await;

    // Without a client certificate, or in plain text, no call gets through.
    let no_certificate = RosterServiceClient::new(tls_channel(roster.address, &ca_file, None, Some(&operator)))
        .list_teams(ListTeamsRequest::default())
        .await
        .unwrap_err();
    assert!(is_transport_refusal(&no_certificate), "{no_certificate:?}");
    let plain = tonic::transport::Endpoint::from_shared(format!("http://{}", roster.address)).unwrap().connect_lazy();
    let plain = RosterServiceClient::new(with_credentials(plain, Credentials::bearer(&operator).unwrap()))
        .list_teams(ListTeamsRequest::default())
        .await
        .unwrap_err();
    assert!(is_transport_refusal(&plain), "{plain:?}");

    // A certificate alone names no operator; a service's names the service.
    let certificate_only =
        RosterServiceClient::new(tls_channel(roster.address, &ca_file, Some(&operator_certificate), None))
            .list_teams(ListTeamsRequest::default())
            .await
            .unwrap_err();
    assert_eq!(certificate_only.code(), Code::Unauthenticated);
    assert_eq!(certificate_only.get_details_error_info().unwrap().reason, "CREDENTIAL_MISSING");
    let as_validator = tls_channel(roster.address, &ca_file, Some(&validator_certificate), None);
    muster_proto::roster::v1::credential_service_client::CredentialServiceClient::new(as_validator)
        .watch_credentials(WatchCredentialsRequest::default())
        .await
        .expect("a service's certificate is its credential");

    // The validator follows the roster's credentials over mutual TLS: an
    // agent the roster registers is accepted by the validator.
    let token = as_operator
        .register_agent(RegisterAgentRequest { agent: Some(agent("alice", "member", "")) })
        .await
        .unwrap()
        .into_inner()
        .token;
    let as_agent = ValidatorServiceClient::new(tls_channel(
        validator.address,
        &ca_file,
        Some(&operator_certificate),
        Some(&token),
    ));
    eventually("the validator knows the agent", || {
        let mut client = as_agent.clone();
        async move {
            client
                .validate_process(ValidateProcessRequest {
                    source: "name: p\nsteps: []\n".into(),
                    ..Default::default()
                })
                .await
        }
    })
    .await;

    // New certificates are picked up from their files: the roster's own,
    // from another authority, serves new connections within seconds.
    let renewed_ca = TestCa::new("muster renewed CA");
    let renewed_ca_file = renewed_ca.write(&folder.0.join("renewed-ca.crt"));
    let trusting_renewed = RosterServiceClient::new(tls_channel(
        roster.address,
        &renewed_ca_file,
        Some(&operator_certificate),
        Some(&operator),
    ));
    assert!(
        trusting_renewed.clone().list_teams(ListTeamsRequest::default()).await.is_err(),
        "the old certificate is not trusted"
    );
    let renewed = renewed_ca.issue(&folder.0, "roster-renewed", &["muster-roster", "localhost"]);
    std::fs::copy(&renewed.key, &roster_certificate.key).unwrap();
    std::fs::copy(&renewed.cert, &roster_certificate.cert).unwrap();
    eventually("the renewed certificate is served", || {
        let mut client = RosterServiceClient::new(tls_channel(
            roster.address,
            &renewed_ca_file,
            Some(&operator_certificate),
            Some(&operator),
        ));
        async move { client.list_teams(ListTeamsRequest::default()).await }
    })
    .await;
    drop(validator);
    drop(roster);
}

/// A private PostgreSQL server with TLS only, stopped and removed when dropped.
struct TlsPostgres {
    folder: PathBuf,
    bin: PathBuf,
    port: u16,
    ca: PathBuf,
}

impl TlsPostgres {
    /// Starts one, or says why not and returns `None` (outside CI) when
    /// PostgreSQL's server programs are not installed.
    fn start() -> Option<Self> {
        let bin = std::fs::read_dir("/usr/lib/postgresql").ok().and_then(|versions| {
            let mut found: Vec<PathBuf> = versions
                .flatten()
                .map(|version| version.path().join("bin"))
                .filter(|bin| bin.join("initdb").exists())
                .collect();
            found.sort();
            found.pop()
        });
        let Some(bin) = bin else {
            assert!(std::env::var("CI").as_deref() != Ok("true"), "PostgreSQL's initdb is needed under CI=true");
            eprintln!("skipping: no /usr/lib/postgresql/*/bin/initdb to start a private PostgreSQL with TLS");
            return None;
        };
        // Not under the home folder: the server runs as `postgres` when the test runs as root.
        let folder = PathBuf::from("/tmp").join(format!("muster-pg-tls-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&folder).unwrap();
        let ca = TestCa::new("muster PostgreSQL CA");
        let ca_file = ca.write(&folder.join("ca.crt"));
        let server = ca.issue(&folder, "server", &["localhost", "127.0.0.1"]);
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let started = Self { folder: folder.clone(), bin, port, ca: ca_file };
        started.own_as_postgres();
        std::fs::set_permissions(&server.key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        let data = folder.join("data");
        started.run("initdb", &["-D", &data.display().to_string(), "--auth=trust", "-U", "postgres"]);
        let mut configuration = std::fs::OpenOptions::new().append(true).open(data.join("postgresql.conf")).unwrap();
        std::io::Write::write_all(
            &mut configuration,
            format!(
                "ssl = on\nssl_cert_file = '{}'\nssl_key_file = '{}'\nlisten_addresses = '127.0.0.1'\nport = {port}\n\
                 unix_socket_directories = '{}'\nfsync = off\n",
                server.cert.display(),
                server.key.display(),
                folder.display()
            )
            .as_bytes(),
        )
        .unwrap();
        // TCP only with TLS: a connection in plain text finds no entry.
        std::fs::write(data.join("pg_hba.conf"), "local all all trust\nhostssl all all 127.0.0.1/32 trust\n").unwrap();
        started.own_as_postgres();
        started.run(
            "pg_ctl",
            &["-D", &data.display().to_string(), "-w", "-l", &folder.join("server.log").display().to_string(), "start"],
        );
        Some(started)
    }

    fn is_root() -> bool {
        std::process::Command::new("id").arg("-u").output().is_ok_and(|output| output.stdout.starts_with(b"0\n"))
    }

    fn own_as_postgres(&self) {
        if Self::is_root() {
            let status =
                std::process::Command::new("chown").args(["-R", "postgres:postgres"]).arg(&self.folder).status();
            assert!(status.unwrap().success(), "chown");
        }
    }

    /// `program` of the server's installation, as the `postgres` user when
    /// the tests run as root (the server refuses to run as root).
    fn command(&self, program: &str) -> std::process::Command {
        let program = self.bin.join(program);
        if Self::is_root() {
            let mut command = std::process::Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(program);
            command
        } else {
            std::process::Command::new(program)
        }
    }

    fn run(&self, program: &str, arguments: &[&str]) {
        let output = self.command(program).args(arguments).output().unwrap();
        assert!(
            output.status.success(),
            "{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    fn url(&self, parameters: &str) -> String {
        format!("postgres://postgres@localhost:{}/postgres?{parameters}", self.port)
    }
}

impl Drop for TlsPostgres {
    fn drop(&mut self) {
        let data = self.folder.join("data").display().to_string();
        let _ = self.command("pg_ctl").args(["-D", &data, "-m", "immediate", "stop"]).output();
        muster_runtime::testing::remove_folder(&self.folder);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_is_reached_over_tls() {
    let Some(postgres) = TlsPostgres::start() else { return };
    use sqlx::Connection as _;
    let verify_full = postgres.url(&format!("sslmode=verify-full&sslrootcert={}", postgres.ca.display()));
    let mut connection = sqlx::PgConnection::connect(&verify_full).await.expect("verify-full with the server's CA");
    let encrypted: bool = sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(&mut connection)
        .await
        .unwrap();
    assert!(encrypted, "the connection is encrypted");
    assert!(sqlx::PgConnection::connect(&postgres.url("sslmode=disable")).await.is_err(), "plain text is refused");
    let stranger = TestCa::new("another CA");
    let stranger_file = stranger.write(&postgres.folder.join("stranger.crt"));
    let wrong_ca = postgres.url(&format!("sslmode=verify-full&sslrootcert={}", stranger_file.display()));
    assert!(sqlx::PgConnection::connect(&wrong_ca).await.is_err(), "a server the CA did not sign is refused");

    // A service on it, with sslmode=require and with verify-full.
    for url in [postgres.url("sslmode=require"), verify_full] {
        let folder = Folder::new("pg-tls-roster");
        let credentials = TestCredentials::new();
        let environment = [credentials.environment(), vec![("MUSTER_DATABASE_URL".into(), url.clone())]].concat();
        let roster = spawn("roster", &folder.0, environment).await;
        let channel = muster_runtime::testing::connect_when_serving(&format!("http://{}", roster.address)).await;
        let mut client = RosterServiceClient::new(with_credentials(channel, credentials.operator()));
        let registered = client
            .register_agent(RegisterAgentRequest {
                agent: Some(agent(&format!("agent-{}", uuid::Uuid::new_v4().simple()), "member", "")),
            })
            .await;
        assert!(registered.is_ok(), "{url}: {registered:?}");
    }
    drop(connection);
}

/// Creates the databases of the stateful services on the private server.
async fn tls_databases(postgres: &TlsPostgres) -> Vec<(&'static str, String)> {
    use sqlx::Connection as _;
    let verify_full = |database: &str| {
        format!(
            "postgres://postgres@localhost:{}/{database}?sslmode=verify-full&sslrootcert={}",
            postgres.port,
            postgres.ca.display()
        )
    };
    let mut admin = sqlx::PgConnection::connect(&verify_full("postgres")).await.expect("the private server");
    let mut urls = Vec::new();
    for service in ["roster", "execution", "notifier"] {
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {service}"))).execute(&mut admin).await.unwrap();
        urls.push((service, verify_full(service)));
    }
    urls
}

/// The whole cluster under mutual TLS, with no service secret: each
/// service knows the others by their certificates alone — the execution
/// service ingests its events into the notifier that way — and a worker
/// and the command line reach it over TLS with a client certificate. The
/// stateful services keep their data in PostgreSQL reached over TLS
/// (`verify-full`) when the machine has PostgreSQL's server programs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_cluster_runs_under_mutual_tls() {
    use muster_proto::{
        common::v1::EventType,
        execution::v1::{
            PublishProcessRequest, StartExecutionRequest, WatchExecutionRequest,
            execution_service_client::ExecutionServiceClient,
        },
        notifier::v1::{ListNotificationsRequest, notifier_service_client::NotifierServiceClient},
    };
    let folder = Folder::new("mtls-cluster");
    let postgres = TlsPostgres::start();
    let databases = match &postgres {
        Some(postgres) => tls_databases(postgres).await,
        None => Vec::new(),
    };
    let ca = TestCa::new("muster cluster CA");
    let ca_file = ca.write(&folder.0.join("ca.crt"));
    let credentials = TestCredentials::new();
    let operators: Vec<(String, String)> =
        credentials.environment().into_iter().filter(|(name, _)| name == "MUSTER_OPERATORS").collect();
    let mut services: std::collections::HashMap<&str, Process> = std::collections::HashMap::new();
    let url = |process: &Process| format!("https://localhost:{}", process.address.port());
    for (service, dependencies) in [
        ("roster", &[][..]),
        ("validator", &["roster"][..]),
        ("notifier", &["roster"][..]),
        ("execution", &["roster", "validator", "notifier"][..]),
    ] {
        let certificate = ca.issue(&folder.0, service, &[&format!("muster-{service}"), "localhost"]);
        let mut environment = [operators.clone(), tls_environment(&ca_file, &certificate)].concat();
        for dependency in dependencies {
            environment.push((format!("MUSTER_{}_URL", dependency.to_uppercase()), url(&services[dependency])));
        }
        if let Some((_, database)) = databases.iter().find(|(name, _)| *name == service) {
            environment.push(("MUSTER_DATABASE_URL".into(), database.clone()));
        }
        if service == "notifier" {
            environment.push(("MUSTER_DATA_DIR".into(), folder.0.display().to_string()));
        }
        if service == "execution" && !databases.is_empty() {
            // Two replicas on one database. Their certificate names the
            // Service, not them: each joins with the Service's name in its
            // URL and its own address to connect to.
            for name in ["execution", "execution-b"] {
                let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
                let replica = [
                    ("MUSTER_LISTEN".to_owned(), format!("127.0.0.1:{port}")),
                    ("MUSTER_REPLICA_URL".to_owned(), format!("https://muster-execution:{port}")),
                    ("MUSTER_REPLICA_ADDRESS".to_owned(), "127.0.0.1".to_owned()),
                ];
                let environment = [environment.clone(), replica.to_vec()].concat();
                services.insert(name, spawn_as(service, name, &folder.0, environment).await);
            }
            continue;
        }
        services.insert(service, spawn(service, &folder.0, environment).await);
    }
    // With two execution replicas, the worker connects to the second and the
    // run starts on the first: its step crosses between them over mutual TLS.
    let worker_replica = if services.contains_key("execution-b") { "execution-b" } else { "execution" };
    let address = |service: &str| services[service].address;
    let client_certificate = ca.issue(&folder.0, "workstation", &["ops-workstation"]);
    let operator = credentials.operator_token.clone();

    let mut roster =
        RosterServiceClient::new(tls_channel(address("roster"), &ca_file, Some(&client_certificate), Some(&operator)));
    let mut tokens = serde_json::Map::new();
    for agent_id in ["doer", "told"] {
        let token =
            eventually("the roster registers over TLS", || {
                let mut roster = roster.clone();
                async move {
                    roster.register_agent(RegisterAgentRequest { agent: Some(agent(agent_id, "member", "")) }).await
                }
            })
            .await
            .into_inner()
            .token;
        tokens.insert(agent_id.into(), token.into());
    }
    let told_token = tokens["told"].as_str().unwrap().to_owned();
    roster.list_teams(ListTeamsRequest::default()).await.unwrap();
    let tokens_file = folder.0.join("tokens.json");
    std::fs::write(&tokens_file, serde_json::Value::Object(tokens.clone()).to_string()).unwrap();

    // A worker over TLS, presenting the client certificate and the operator's token.
    let muster = muster::cluster::default_binary_dir().unwrap().join("muster");
    let log = std::fs::File::create(folder.0.join("agent.log")).unwrap();
    let _worker = tokio::process::Command::new(muster)
        .args(["agent", "--execution", &url(&services[worker_replica]), "--tokens-file"])
        .arg(&tokens_file)
        .env("MUSTER_TOKEN", &operator)
        .env("MUSTER_TLS_CA_FILE", &ca_file)
        .env("MUSTER_TLS_CERT_FILE", &client_certificate.cert)
        .env("MUSTER_TLS_KEY_FILE", &client_certificate.key)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .unwrap();

    // A process runs to its end; its informed agent hears of it through
    // the notifier, which accepted the events on the execution service's
    // certificate alone.
    let mut execution = ExecutionServiceClient::new(tls_channel(
        address("execution"),
        &ca_file,
        Some(&client_certificate),
        Some(&operator),
    ));
    let source = "name: secure\nsteps:\n  - {id: work, type: agent_task, agent: doer, message: m, roles: {executor: doer, informed: [told]}}\n";
    eventually("the execution service publishes over TLS", || {
        let mut execution = execution.clone();
        async move {
            execution.publish_process(PublishProcessRequest { source: source.into(), file_name: String::new() }).await
        }
    })
    .await;
    let started = execution
        .start_execution(StartExecutionRequest { process_name: "secure".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner()
        .execution
        .unwrap();
    let mut events = execution
        .watch_execution(WatchExecutionRequest { execution_id: started.id.clone(), after_sequence: 0 })
        .await
        .unwrap()
        .into_inner();
    let finished = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(event) = events.message().await.unwrap() {
            if event.event.as_ref().is_some_and(|event| event.event_type == EventType::ExecutionFinished as i32) {
                return event.event.unwrap();
            }
        }
        panic!("the watch ended before the execution did");
    })
    .await
    .expect("the execution finishes");
    assert_eq!(finished.execution_status, muster_proto::common::v1::ExecutionStatus::Completed as i32, "{finished:?}");
    let notifier = NotifierServiceClient::new(tls_channel(
        address("notifier"),
        &ca_file,
        Some(&client_certificate),
        Some(&told_token),
    ));
    let heard = eventually("the informed agent hears of the step", || {
        let mut notifier = notifier.clone();
        let execution_id = started.id.clone();
        async move {
            let listed = notifier
                .list_notifications(ListNotificationsRequest { agent_id: "told".into(), after_cursor: 0, limit: 100 })
                .await?
                .into_inner();
            listed
                .notifications
                .into_iter()
                .filter_map(|notification| notification.event)
                .find(|event| event.execution_id == execution_id && event.event_type == EventType::StepCompleted as i32)
                .ok_or_else(|| tonic::Status::not_found("not yet"))
        }
    })
    .await;
    assert_eq!(heard.step_id, "work");
    drop(services);
    drop(postgres);
}
