//! A cluster spread over the hosts of a [`Network`]: a private PostgreSQL
//! on a host of its own and every replica of the roster, the notifier and
//! the execution service on its own host (`roster-0`, `notifier-1`,
//! `execution-2`, ...), each a real process, with workers (`muster agent`)
//! on hosts of their own; any link between two of them can be cut.

use std::{path::PathBuf, time::Duration};

use muster::credentials::{Endpoint, LocalCredentials};
use muster_proto::roster::v1::Agent;
use tokio::process::Child;

use crate::network::{Host, Network, PrivatePostgres};

/// How many replicas of each service, and the execution replicas' lease.
#[derive(Debug, Clone)]
pub struct Layout {
    /// Replicas of the roster.
    pub rosters: usize,
    /// Replicas of the notifier.
    pub notifiers: usize,
    /// Replicas of the execution service.
    pub executions: usize,
    /// The execution replicas' lease (`MUSTER_REPLICA_LEASE_MS`).
    pub lease_ms: u64,
    /// The workers' lease (`MUSTER_WORKER_LEASE_MS`).
    pub worker_lease_ms: u64,
}

/// One process of the cluster.
struct Process {
    /// `roster`, `notifier`, `execution` or `worker`.
    service: &'static str,
    index: usize,
    host: Host,
    program: PathBuf,
    arguments: Vec<String>,
    environment: Vec<(String, String)>,
    child: Option<Child>,
}

/// The cluster; its processes, database, network and data folder go when
/// it is dropped.
pub struct SpreadCluster {
    processes: Vec<Process>,
    /// The local operator and the service secret.
    pub credentials: LocalCredentials,
    /// The data folder: logs, the notifier's memory files, tokens.
    pub data_dir: PathBuf,
    /// The cluster's database server.
    pub postgres: PrivatePostgres,
    /// The network the hosts are on.
    pub network: Network,
}

const PORTS: [(&str, u16); 4] = [("execution", 50051), ("roster", 50052), ("notifier", 50054), ("worker", 0)];

fn port(service: &str) -> u16 {
    PORTS.iter().find(|(name, _)| *name == service).map_or(0, |(_, port)| *port)
}

impl SpreadCluster {
    /// Starts the cluster and waits until every service serves; `None`
    /// where network namespaces cannot be made (outside CI).
    pub async fn start(layout: &Layout) -> Option<Self> {
        crate::build_service_binaries();
        if crate::network::postgres_programs().is_none() {
            let missing = "PostgreSQL's programs (initdb, postgres, pg_ctl) are not installed";
            assert!(std::env::var("CI").as_deref() != Ok("true"), "{missing}; CI needs them for the partition tests");
            eprintln!("skipped: {missing}");
            return None;
        }
        let mut network = Network::create()?;
        let data_dir = std::env::temp_dir().join(format!("muster-spread-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(data_dir.join("logs")).expect("creating the data folder");
        let credentials = LocalCredentials::ensure(&data_dir).expect("the cluster's credentials");
        let database_host = network.add_host("postgres");
        let postgres = PrivatePostgres::start(&network, &database_host, &["roster", "notifier", "execution"]).await;
        let mut cluster = Self { processes: Vec::new(), credentials, data_dir, postgres, network };
        let binaries = muster::cluster::default_binary_dir().expect("locating the binaries");
        let counts = [("roster", layout.rosters), ("notifier", layout.notifiers), ("execution", layout.executions)];
        for (service, count) in counts {
            for index in 0..count {
                let host = cluster.network.add_host(&format!("{service}-{index}"));
                let mut environment = cluster.credentials.environment();
                environment.extend([
                    ("MUSTER_LISTEN".to_owned(), format!("{}:{}", host.address, port(service))),
                    ("MUSTER_LOG_FORMAT".to_owned(), "json".to_owned()),
                    ("MUSTER_SHUTDOWN_GRACE_SECONDS".to_owned(), "5".to_owned()),
                    ("MUSTER_DATABASE_URL".to_owned(), cluster.postgres.url(service)),
                ]);
                if service != "roster" {
                    environment.push(("MUSTER_ROSTER_URL".to_owned(), cluster.urls("roster")));
                }
                match service {
                    "notifier" => {
                        environment.push(("MUSTER_DATA_DIR".to_owned(), cluster.data_dir.display().to_string()));
                    }
                    "execution" => environment.extend([
                        ("MUSTER_NOTIFIER_URL".to_owned(), cluster.urls("notifier")),
                        ("MUSTER_REPLICA_ID".to_owned(), format!("execution-{index}")),
                        ("MUSTER_REPLICA_LEASE_MS".to_owned(), layout.lease_ms.to_string()),
                        ("MUSTER_WORKER_LEASE_MS".to_owned(), layout.worker_lease_ms.to_string()),
                    ]),
                    _ => {}
                }
                if let Ok(filter) = std::env::var("MUSTER_LOG") {
                    environment.push(("MUSTER_LOG".to_owned(), filter));
                }
                let program = binaries.join(format!("muster-{service}"));
                cluster.processes.push(Process {
                    service,
                    index,
                    host,
                    program,
                    arguments: Vec::new(),
                    environment,
                    child: None,
                });
                cluster.restart(service, index).await;
            }
        }
        Some(cluster)
    }

    /// Starts `count` workers (`muster agent`) serving the agents of
    /// `tokens` (agent id, token) with the sample behaviour, worker N on
    /// host `worker-N` connected to execution replica N (modulo their count).
    pub async fn start_workers(&mut self, count: usize, tokens: &[(String, String)]) {
        let tokens_file = self.data_dir.join("tokens.json");
        let map: serde_json::Map<String, serde_json::Value> =
            tokens.iter().map(|(agent, token)| (agent.clone(), serde_json::Value::from(token.clone()))).collect();
        std::fs::write(&tokens_file, serde_json::to_vec(&map).expect("JSON")).expect("writing the tokens file");
        let binaries = muster::cluster::default_binary_dir().expect("locating the binaries");
        let executions = self.replicas("execution");
        for index in 0..count {
            let host = self.network.add_host(&format!("worker-{index}"));
            let execution = self.replica_url("execution", index % executions);
            let environment = vec![
                ("MUSTER_TOKEN".to_owned(), self.credentials.operator_token.clone()),
                ("MUSTER_DATA_DIR".to_owned(), self.data_dir.display().to_string()),
            ];
            let arguments = ["agent", "--execution", &execution, "--roster", &self.urls("roster"), "--tokens-file"]
                .iter()
                .map(|argument| (*argument).to_owned())
                .chain([tokens_file.display().to_string()])
                .collect();
            self.processes.push(Process {
                service: "worker",
                index,
                host,
                program: binaries.join("muster"),
                arguments,
                environment,
                child: None,
            });
            self.restart("worker", index).await;
        }
    }

    fn position(&self, service: &str, index: usize) -> usize {
        self.processes
            .iter()
            .position(|process| process.service == service && process.index == index)
            .unwrap_or_else(|| panic!("no {service}-{index}"))
    }

    fn process(&mut self, service: &str, index: usize) -> &mut Process {
        let position = self.position(service, index);
        &mut self.processes[position]
    }

    /// How many replicas `service` has.
    pub fn replicas(&self, service: &str) -> usize {
        self.processes.iter().filter(|process| process.service == service).count()
    }

    /// The URL of replica `index` of `service`.
    pub fn replica_url(&self, service: &str, index: usize) -> String {
        format!("http://{}:{}", self.network.host(&format!("{service}-{index}")).address, port(service))
    }

    /// The URLs of every replica of `service`, comma-separated (a client
    /// balances over them).
    pub fn urls(&self, service: &str) -> String {
        let replicas = self.processes.iter().filter(|process| process.service == service);
        replicas.map(|process| self.replica_url(service, process.index)).collect::<Vec<_>>().join(",")
    }

    /// Every replica of `service`, called as the local operator.
    pub fn operator(&self, service: &str) -> Endpoint {
        Endpoint::new(self.urls(service), self.credentials.operator_token.clone())
    }

    /// Replica `index` of `service` alone, called as the local operator.
    pub fn operator_of(&self, service: &str, index: usize) -> Endpoint {
        Endpoint::new(self.replica_url(service, index), self.credentials.operator_token.clone())
    }

    /// Kills (SIGKILL) replica `index` of `service`, as a crash would.
    pub async fn kill(&mut self, service: &str, index: usize) {
        if let Some(mut child) = self.process(service, index).child.take() {
            let _ = child.kill().await;
        }
    }

    /// Whether replica `index` of `service` runs (false once it exited by itself).
    pub fn is_running(&mut self, service: &str, index: usize) -> bool {
        self.process(service, index).child.as_mut().is_some_and(|child| child.try_wait().ok().flatten().is_none())
    }

    /// (Re)starts replica `index` of `service` on its host, with its
    /// environment, and waits until it serves (a worker: until it runs).
    pub async fn restart(&mut self, service: &str, index: usize) {
        self.kill(service, index).await;
        let log = self.data_dir.join("logs").join(format!("{service}-{index}.log"));
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&log).expect("the log file");
        let process = &self.processes[self.position(service, index)];
        let mut command = self.network.command(&process.host, &process.program);
        command
            .args(&process.arguments)
            .envs(process.environment.iter().cloned())
            .stdin(std::process::Stdio::null())
            .stdout(file.try_clone().expect("the log file"))
            .stderr(file)
            .kill_on_drop(true);
        let mut child = command.spawn().unwrap_or_else(|error| panic!("starting {service}-{index}: {error}"));
        if service != "worker" {
            let address = std::net::SocketAddr::new(process.host.address.into(), port(service));
            muster::cluster::wait_until_serving(address, &mut child, service, &log, 0)
                .await
                .unwrap_or_else(|error| panic!("{service}-{index}: {error:#}"));
        }
        self.process(service, index).child = Some(child);
    }

    /// Creates the agents' teams and registers the agents; their (id, token).
    pub async fn register_agents(&self, agents: &[Agent]) -> Vec<(String, String)> {
        let channel = self.operator("roster").channel().expect("a channel");
        let mut roster = muster_proto::roster::v1::roster_service_client::RosterServiceClient::new(channel);
        let tokens = crate::register_agents(&mut roster, agents).await;
        agents.iter().map(|agent| agent.id.clone()).zip(tokens).collect()
    }

    /// The process id of replica `index` of `service`, while it runs.
    pub fn pid(&mut self, service: &str, index: usize) -> Option<u32> {
        self.process(service, index).child.as_ref().and_then(Child::id)
    }

    /// Waits up to `limit` for replica `index` of `service` to exit by itself.
    pub async fn wait_for_exit(&mut self, service: &str, index: usize, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        while self.is_running(service, index) {
            if tokio::time::Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        true
    }
}

impl Drop for SpreadCluster {
    fn drop(&mut self) {
        let panicking = std::thread::panicking();
        for process in &mut self.processes {
            if let Some(mut child) = process.child.take() {
                let _ = child.start_kill();
            }
            if panicking {
                let log = self.data_dir.join("logs").join(format!("{}-{}.log", process.service, process.index));
                crate::print_log_tail(&log);
            }
        }
        if panicking {
            eprintln!("the cluster's data folder is kept for inspection: {}", self.data_dir.display());
        } else {
            muster_runtime::testing::remove_folder(&self.data_dir);
        }
    }
}
