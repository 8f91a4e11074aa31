//! A cluster on one machine: the four service binaries as four child
//! processes, each with its own database, until stopped. Supervised
//! ([`Cluster::supervise`], as `muster up` does), a service that exits is
//! restarted on its address with its database and arguments, with backoff,
//! until it keeps crashing.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use muster_runtime::files::{PRIVATE_FILE, PRIVATE_FOLDER};
use std::os::unix::fs::PermissionsExt as _;

use crate::credentials::{Endpoint, LocalCredentials};
use tokio::process::{Child, Command};
use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient};

mod supervision;

pub use supervision::{RestartPolicy, SupervisionEvent};

/// The four services, in the order they start.
pub const SERVICES: [&str; 4] = ["roster", "validator", "notifier", "execution"];

/// How to start a cluster.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Folder of the `muster-<service>` binaries.
    pub binary_dir: PathBuf,
    /// Data folder: SQLite files, logs, the notifier's NDJSON memory.
    pub data_dir: PathBuf,
    /// Address to bind the services to.
    pub host: std::net::IpAddr,
    /// Ports of execution, roster, validator and notifier; 0 picks free ones.
    pub ports: Ports,
    /// Database URL per service; `None` means a SQLite file in the data folder.
    pub database_urls: DatabaseUrls,
    /// Extra environment for every service.
    pub environment: Vec<(String, String)>,
    /// Whether to start the console too (on `ports.console`).
    pub console: bool,
}

/// The services' ports.
#[derive(Debug, Clone, Copy)]
pub struct Ports {
    /// The execution service.
    pub execution: u16,
    /// The roster.
    pub roster: u16,
    /// The validator.
    pub validator: u16,
    /// The notifier.
    pub notifier: u16,
    /// The console (web pages).
    pub console: u16,
}

impl Default for Ports {
    fn default() -> Self {
        Self { execution: 50051, roster: 50052, validator: 50053, notifier: 50054, console: 50080 }
    }
}

/// Database URLs of the stateful services.
#[derive(Debug, Clone, Default)]
pub struct DatabaseUrls {
    /// The roster's.
    pub roster: Option<String>,
    /// The execution service's.
    pub execution: Option<String>,
    /// The notifier's.
    pub notifier: Option<String>,
}

impl ClusterOptions {
    /// Defaults: binaries next to the running program, `./muster-data`, the documented ports.
    pub fn new(data_dir: impl Into<PathBuf>) -> anyhow::Result<Self> {
        Ok(Self {
            binary_dir: default_binary_dir()?,
            data_dir: data_dir.into(),
            host: std::net::IpAddr::from([127, 0, 0, 1]),
            ports: Ports::default(),
            database_urls: DatabaseUrls::default(),
            environment: Vec::new(),
            console: true,
        })
    }
}

/// The folder of the running program, where cargo puts the service binaries too.
pub fn default_binary_dir() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the muster binary")?;
    let dir = exe.parent().context("the muster binary has no folder")?;
    // Test binaries live one level down, in `deps/`.
    Ok(if dir.ends_with("deps") { dir.parent().unwrap_or(dir).to_path_buf() } else { dir.to_path_buf() })
}

/// One running service.
#[derive(Debug)]
pub struct ServiceProcess {
    /// Its name: `execution`, `roster`, ...
    pub name: &'static str,
    /// Where it listens.
    pub address: SocketAddr,
    /// Its log file.
    pub log_path: PathBuf,
    /// Where in the log file this process began writing (the file is kept
    /// across restarts).
    log_start: u64,
    child: Child,
}

impl ServiceProcess {
    /// `http://address`, for clients.
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// The operating system's process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }
}

/// A running cluster.
#[derive(Debug)]
pub struct Cluster {
    /// The options it was started with.
    pub options: ClusterOptions,
    /// Its local operator and service secret, kept in the data folder.
    pub credentials: LocalCredentials,
    services: Vec<ServiceProcess>,
}

impl Cluster {
    /// Starts the four services and waits until each reports SERVING. The
    /// data folder keeps a local operator's token and the service secret
    /// (made on first start, mode 0600). It is its owner's alone: the
    /// folder 0700, what this writes 0600 (logs, tokens; the services make
    /// their own files so, port files included), narrowed to that when an
    /// older cluster left them wider.
    pub async fn start(options: ClusterOptions) -> anyhow::Result<Self> {
        let data_dir = &options.data_dir;
        create_private_folder(&data_dir.join("logs"))?;
        let narrowed = std::fs::set_permissions(data_dir, std::fs::Permissions::from_mode(PRIVATE_FOLDER))
            .and_then(|()| muster_runtime::files::make_private(&data_dir.join("logs")));
        narrowed.with_context(|| format!("making {} private", data_dir.display()))?;
        let credentials = LocalCredentials::ensure(&options.data_dir)?;
        let token_file = options.data_dir.join(crate::credentials::OPERATOR_TOKEN_FILE);
        for file in [&credentials.operators_file, &credentials.service_secret_file, &token_file] {
            muster_runtime::files::make_private(file).with_context(|| format!("making {} private", file.display()))?;
        }
        let mut cluster = Self { options, credentials, services: Vec::new() };
        for name in SERVICES {
            let service = cluster.spawn(name).await?;
            cluster.services.push(service);
        }
        if cluster.options.console {
            let console = cluster.spawn("console").await?;
            cluster.services.push(console);
        }
        Ok(cluster)
    }

    /// A service by name.
    pub fn service(&self, name: &str) -> &ServiceProcess {
        self.services.iter().find(|service| service.name == name).expect("the four services are always present")
    }

    /// The execution service's URL.
    pub fn execution_url(&self) -> String {
        self.service("execution").url()
    }

    /// The roster's URL.
    pub fn roster_url(&self) -> String {
        self.service("roster").url()
    }

    /// The validator's URL.
    pub fn validator_url(&self) -> String {
        self.service("validator").url()
    }

    /// The notifier's URL.
    pub fn notifier_url(&self) -> String {
        self.service("notifier").url()
    }

    /// The console's address, when it runs.
    pub fn console_url(&self) -> Option<String> {
        self.services.iter().find(|service| service.name == "console").map(ServiceProcess::url)
    }

    /// A service, called as the local operator.
    pub fn as_operator(&self, name: &str) -> Endpoint {
        Endpoint::new(self.service(name).url(), self.credentials.operator_token.clone())
    }

    /// Where the notifier writes agents' NDJSON memory.
    pub fn memory_dir(&self) -> PathBuf {
        self.options.data_dir.join("agents")
    }

    /// Stops a service abruptly (SIGKILL), as a crash would. It stays down
    /// until [`Cluster::restart`]: only a supervised cluster restarts
    /// services by itself, and supervision holds the cluster while it runs.
    pub async fn kill(&mut self, name: &str) -> anyhow::Result<()> {
        self.kill_replica(name, 0).await
    }

    /// Stops a service gracefully (SIGTERM) and waits for it.
    pub async fn stop(&mut self, name: &str) -> anyhow::Result<()> {
        self.stop_replica(name, 0).await
    }

    /// Starts a stopped service again, on the same address.
    pub async fn restart(&mut self, name: &'static str) -> anyhow::Result<()> {
        self.restart_replica(name, 0).await
    }

    /// The position of a service's replica `index` (0: the first started,
    /// then those [`Cluster::add_replica`] added, in order).
    fn replica_position(&self, name: &str, index: usize) -> anyhow::Result<usize> {
        self.services
            .iter()
            .enumerate()
            .filter(|(_, service)| service.name == name)
            .nth(index)
            .map(|(position, _)| position)
            .with_context(|| format!("no replica {index} of {name}"))
    }

    /// [`Cluster::kill`] for one replica of a service.
    pub async fn kill_replica(&mut self, name: &str, index: usize) -> anyhow::Result<()> {
        let position = self.replica_position(name, index)?;
        self.services[position].child.kill().await?;
        Ok(())
    }

    /// [`Cluster::stop`] for one replica of a service.
    pub async fn stop_replica(&mut self, name: &str, index: usize) -> anyhow::Result<()> {
        let position = self.replica_position(name, index)?;
        terminate(&mut self.services[position].child).await
    }

    /// [`Cluster::restart`] for one replica of a service: on its address,
    /// with its log file.
    pub async fn restart_replica(&mut self, name: &'static str, index: usize) -> anyhow::Result<()> {
        let position = self.replica_position(name, index)?;
        let address = self.services[position].address;
        let file_stem =
            self.services[position].log_path.file_stem().and_then(|stem| stem.to_str()).unwrap_or(name).to_owned();
        let replacement = self.spawn_at(name, address.port(), &file_stem).await?;
        self.services[position] = replacement;
        Ok(())
    }

    /// Every replica of a service, in the order they started.
    pub fn replicas<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a ServiceProcess> + 'a {
        self.services.iter().filter(move |service| service.name == name)
    }

    /// The URL of every replica of a service, comma-separated, as a client
    /// that balances over them takes it.
    pub fn replica_urls(&self, name: &str) -> String {
        self.replicas(name).map(ServiceProcess::url).collect::<Vec<_>>().join(",")
    }

    /// Starts one more process of a service, on a port of its own, sharing
    /// the service's database (a replica, as a second pod would be); its
    /// address. It stops with the cluster.
    pub async fn add_replica(&mut self, name: &'static str) -> anyhow::Result<SocketAddr> {
        let count = self.services.iter().filter(|service| service.name == name).count();
        let replica = self.spawn_at(name, 0, &format!("{name}-replica-{count}")).await?;
        let address = replica.address;
        self.services.push(replica);
        Ok(address)
    }

    /// Sets a variable of the environment the services start with from now
    /// on (a restarted service sees it).
    pub fn set_environment(&mut self, key: &str, value: &str) {
        self.options.environment.retain(|(known, _)| known != key);
        self.options.environment.push((key.to_owned(), value.to_owned()));
    }

    /// Stops every service gracefully, the execution service first.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        let mut first_error = None;
        for service in self.services.iter_mut().rev() {
            if let Err(error) = terminate(&mut service.child).await {
                first_error.get_or_insert(error);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    async fn spawn(&self, name: &'static str) -> anyhow::Result<ServiceProcess> {
        let ports = self.options.ports;
        let port = match name {
            "execution" => ports.execution,
            "roster" => ports.roster,
            "validator" => ports.validator,
            "console" => ports.console,
            _ => ports.notifier,
        };
        self.spawn_at(name, port, name).await
    }

    /// Starts the binary of service `name`, its log and port files named
    /// after `file_stem`.
    async fn spawn_at(&self, name: &'static str, port: u16, file_stem: &str) -> anyhow::Result<ServiceProcess> {
        let options = &self.options;
        let binary = options.binary_dir.join(format!("muster-{name}"));
        if !binary.exists() {
            bail!("{} is missing: build the services first with `cargo build --bins`", binary.display());
        }
        let log_path = options.data_dir.join("logs").join(format!("{file_stem}.log"));
        let port_file = options.data_dir.join(format!("{file_stem}.port"));
        let _ = std::fs::remove_file(&port_file);
        let mut log_options = std::fs::OpenOptions::new();
        log_options.create(true).append(true);
        std::os::unix::fs::OpenOptionsExt::mode(&mut log_options, PRIVATE_FILE);
        let log = log_options.open(&log_path).with_context(|| format!("opening {}", log_path.display()))?;
        let log_start = log.metadata().map_or(0, |metadata| metadata.len());
        let mut command = Command::new(&binary);
        if name != "console" {
            // The console has no powers of its own: it acts with the
            // credential of whoever signs in to it.
            command.envs(self.credentials.environment());
        }
        command
            .env("MUSTER_LISTEN", SocketAddr::new(options.host, port).to_string())
            .env("MUSTER_PORT_FILE", &port_file)
            .env("MUSTER_LOG_FORMAT", "json")
            .env("MUSTER_SHUTDOWN_GRACE_SECONDS", "5")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true);
        let sqlite = |file: &str| format!("sqlite://{}", options.data_dir.join(file).display());
        match name {
            "roster" => {
                command.env(
                    "MUSTER_DATABASE_URL",
                    options.database_urls.roster.clone().unwrap_or_else(|| sqlite("roster.db")),
                );
            }
            "notifier" => {
                command
                    .env(
                        "MUSTER_DATABASE_URL",
                        options.database_urls.notifier.clone().unwrap_or_else(|| sqlite("notifier.db")),
                    )
                    .env("MUSTER_DATA_DIR", &options.data_dir);
            }
            "execution" => {
                command
                    .env(
                        "MUSTER_DATABASE_URL",
                        options.database_urls.execution.clone().unwrap_or_else(|| sqlite("execution.db")),
                    )
                    .env("MUSTER_NOTIFIER_URL", self.service("notifier").url())
                    // A stable identity per replica (`execution-0`, then
                    // `execution-1`, ...): restarted, it takes its runs back at once.
                    .env("MUSTER_REPLICA_ID", execution_replica_id(file_stem));
            }
            "console" => {
                command
                    .env("MUSTER_EXECUTION_URL", self.service("execution").url())
                    .env("MUSTER_ROSTER_URL", self.service("roster").url())
                    .env("MUSTER_VALIDATOR_URL", self.service("validator").url())
                    .env("MUSTER_CONSOLE_SESSION_KEY_FILE", self.console_key()?);
            }
            _ => {}
        }
        if name != "roster" && name != "console" {
            // Where agent credentials come from.
            command.env("MUSTER_ROSTER_URL", self.service("roster").url());
        }
        for (key, value) in &options.environment {
            command.env(key, value);
        }
        let mut child = command.spawn().with_context(|| format!("starting {}", binary.display()))?;
        let address = wait_for_port_file(&port_file, &mut child, name, &log_path, log_start).await?;
        if name != "console" {
            // The console serves pages, not gRPC: listening is serving.
            wait_until_serving(address, &mut child, name, &log_path, log_start).await?;
        }
        Ok(ServiceProcess { name, address, log_path, log_start, child })
    }
}

impl Cluster {
    /// The console's session key in the data folder, made on first use
    /// (mode 0600): sessions outlive a restart of the console.
    fn console_key(&self) -> anyhow::Result<PathBuf> {
        let path = self.options.data_dir.join("console.key");
        if !path.exists() {
            let key = muster_runtime::auth::token::generate_secret()?;
            muster_runtime::files::write_private(&path, key.as_bytes())
                .with_context(|| format!("writing {}", path.display()))?;
        }
        Ok(path)
    }
}

const STARTUP_LIMIT: Duration = Duration::from_secs(60);

/// Creates `folder` and the folders above it that are missing, each 0700
/// whatever the umask.
fn create_private_folder(folder: &Path) -> anyhow::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, PRIVATE_FOLDER);
    builder.create(folder).with_context(|| format!("creating {}", folder.display()))
}

/// The stable identity of the execution replica whose files are named
/// `file_stem`: `execution-0` for the first, `execution-N` for the replica
/// added as `execution-replica-N`.
fn execution_replica_id(file_stem: &str) -> String {
    match file_stem.strip_prefix("execution-replica-") {
        Some(number) => format!("execution-{number}"),
        None => "execution-0".to_owned(),
    }
}

async fn wait_for_port_file(
    path: &Path,
    child: &mut Child,
    name: &str,
    log: &Path,
    log_start: u64,
) -> anyhow::Result<SocketAddr> {
    let deadline = Instant::now() + STARTUP_LIMIT;
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && let Ok(address) = text.trim().parse::<SocketAddr>()
        {
            return Ok(address);
        }
        check_alive(child, name, log, log_start)?;
        if Instant::now() > deadline {
            bail!("muster-{name} did not start listening within {} s; see {}", STARTUP_LIMIT.as_secs(), log.display());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls the gRPC health service until the service reports SERVING; fails,
/// with what the process wrote to `log` from byte `log_start`, if it exits.
pub async fn wait_until_serving(
    address: SocketAddr,
    child: &mut Child,
    name: &str,
    log: &Path,
    log_start: u64,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + STARTUP_LIMIT;
    let url = format!("http://{address}");
    loop {
        if let Ok(channel) = tonic::transport::Endpoint::from_shared(url.clone())?.connect().await
            && let Ok(response) = HealthClient::new(channel).check(HealthCheckRequest { service: String::new() }).await
            && response.into_inner().status == ServingStatus::Serving as i32
        {
            return Ok(());
        }
        check_alive(child, name, log, log_start)?;
        if Instant::now() > deadline {
            bail!("muster-{name} did not report SERVING within {} s; see {}", STARTUP_LIMIT.as_secs(), log.display());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn check_alive(child: &mut Child, name: &str, log: &Path, log_start: u64) -> anyhow::Result<()> {
    if let Some(status) = child.try_wait()? {
        let log_tail = log_tail(log, log_start, 10);
        return Err(ExitedWhileStarting { name: name.to_owned(), status, log_tail }.into());
    }
    Ok(())
}

/// A service process that ended before it served.
#[derive(Debug)]
struct ExitedWhileStarting {
    name: String,
    status: std::process::ExitStatus,
    log_tail: Vec<String>,
}

impl std::fmt::Display for ExitedWhileStarting {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "muster-{} exited ({}) while starting; last log lines:", self.name, self.status)?;
        for line in &self.log_tail {
            write!(formatter, "\n{line}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ExitedWhileStarting {}

/// The last `lines` lines a log file holds from byte `from` on (none when it
/// cannot be read).
fn log_tail(log: &Path, from: u64, lines: usize) -> Vec<String> {
    let bytes = std::fs::read(log).unwrap_or_default();
    let from = usize::try_from(from).ok().filter(|from| *from <= bytes.len()).unwrap_or(0);
    let text = String::from_utf8_lossy(&bytes[from..]);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].iter().map(|line| (*line).to_owned()).collect()
}

/// SIGTERM, then SIGKILL if the process outlives the grace period.
async fn terminate(child: &mut Child) -> anyhow::Result<()> {
    let Some(pid) = child.id() else { return Ok(()) };
    let pid = nix::unistd::Pid::from_raw(pid as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    match tokio::time::timeout(Duration::from_secs(15), child.wait()).await {
        Ok(status) => {
            status?;
            Ok(())
        }
        Err(_) => {
            child.kill().await?;
            bail!("a service ignored SIGTERM for 15 s and was killed")
        }
    }
}
