//! Hosts on a private network, for tests of what crosses a network: each
//! host a network namespace of its own with one address, joined to the
//! others (and to the test, in the machine's own namespace) by a bridge;
//! a link between two hosts cut and healed on command.
//!
//! A cut is silent, as a pulled cable or a lost route is: each end sends
//! to the other at a hardware address no one holds (a permanent neighbour
//! entry), so the packets leave and vanish; open connections see nothing
//! until they time out, new ones never complete. Healing removes the
//! entries and the next packet finds its host again; TCP's retransmissions
//! carry the connections that were open on.
//!
//! Making namespaces needs root (`ip` from iproute2). Where they cannot be
//! made, [`Network::create`] says so and returns `None` (the test is
//! skipped), except under `CI=true`, where it fails the test.

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::Command,
    sync::atomic::{AtomicU8, Ordering},
};

/// A host of a [`Network`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// Its name in the test.
    pub name: String,
    /// Its network namespace.
    pub namespace: String,
    /// Its address.
    pub address: Ipv4Addr,
    device: String,
}

/// A private network of hosts, removed with its namespaces when dropped.
pub struct Network {
    prefix: String,
    subnet: [u8; 3],
    hub: String,
    root_device: String,
    hosts: Vec<Host>,
}

/// The hardware address a cut sends to: locally administered, held by no one.
const NOWHERE: &str = "02:00:00:00:00:01";

fn ip(arguments: &[&str]) -> Result<(), String> {
    let output = Command::new("ip").args(arguments).output().map_err(|error| format!("running ip: {error}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {}", arguments.join(" "), String::from_utf8_lossy(&output.stderr).trim()))
    }
}

fn must(result: Result<(), String>) {
    if let Err(error) = result {
        panic!("{error}");
    }
}

impl Network {
    /// A new network with no hosts yet; `None` (said on stderr) where
    /// namespaces cannot be made, outside CI.
    pub fn create() -> Option<Self> {
        remove_abandoned_namespaces();
        static NEXT: AtomicU8 = AtomicU8::new(0);
        let number = NEXT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let prefix = format!("muster-{pid}-{number}");
        let hub = format!("{prefix}-hub");
        if let Err(error) = ip(&["netns", "add", &hub]) {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "network namespaces cannot be made here ({error}); CI needs them for the partition tests"
            );
            eprintln!("skipped: network namespaces cannot be made here ({error}): the test needs root and iproute2");
            return None;
        }
        // 10.X.Y.0/24, X and Y from the process and the network's number,
        // so that networks of tests running at once never share addresses.
        let subnet = [10, 128 + (pid % 127) as u8, number];
        let root_device = format!("mu{:x}r{number}", pid % 0x10000);
        let network = Self { prefix, subnet, hub, root_device, hosts: Vec::new() };
        must(ip(&["-n", &network.hub, "link", "add", "bridge", "type", "bridge"]));
        must(ip(&["-n", &network.hub, "link", "set", "bridge", "up"]));
        // The test's own end, in the machine's namespace.
        let root = network.root_device.clone();
        network.plug(&root, None, 1);
        Some(network)
    }

    /// The address of the `index`th host (the test's is 1).
    fn address(&self, index: u8) -> Ipv4Addr {
        Ipv4Addr::new(self.subnet[0], self.subnet[1], self.subnet[2], index)
    }

    /// A veth from `namespace` (the machine's own when `None`) to the
    /// bridge, named `device` on the host's side, with address `index`.
    fn plug(&self, device: &str, namespace: Option<&str>, index: u8) {
        let peer = format!("{device}b");
        must(ip(&["link", "add", device, "type", "veth", "peer", "name", &peer]));
        must(ip(&["link", "set", &peer, "netns", &self.hub]));
        must(ip(&["-n", &self.hub, "link", "set", &peer, "master", "bridge"]));
        must(ip(&["-n", &self.hub, "link", "set", &peer, "up"]));
        let address = format!("{}/24", self.address(index));
        match namespace {
            Some(namespace) => {
                must(ip(&["link", "set", device, "netns", namespace]));
                must(ip(&["-n", namespace, "addr", "add", &address, "dev", device]));
                must(ip(&["-n", namespace, "link", "set", device, "up"]));
                must(ip(&["-n", namespace, "link", "set", "lo", "up"]));
            }
            None => {
                must(ip(&["addr", "add", &address, "dev", device]));
                must(ip(&["link", "set", device, "up"]));
            }
        }
    }

    /// Adds a host named `name`.
    pub fn add_host(&mut self, name: &str) -> Host {
        let index = u8::try_from(self.hosts.len() + 2).expect("at most 250 hosts");
        assert!(index < 251, "at most 250 hosts");
        let namespace = format!("{}-{name}", self.prefix);
        must(ip(&["netns", "add", &namespace]));
        let device = format!("{}h{index}", self.root_device);
        self.plug(&device, Some(&namespace), index);
        let host = Host { name: name.to_owned(), namespace, address: self.address(index), device };
        self.hosts.push(host.clone());
        host
    }

    /// The host named `name`.
    pub fn host(&self, name: &str) -> &Host {
        self.hosts.iter().find(|host| host.name == name).unwrap_or_else(|| panic!("no host {name}"))
    }

    /// A command that runs `program` on `host`.
    pub fn command(&self, host: &Host, program: impl AsRef<std::ffi::OsStr>) -> tokio::process::Command {
        let mut command = tokio::process::Command::new("ip");
        command.args(["netns", "exec", &host.namespace]).arg(program);
        command
    }

    /// Cuts the link between hosts `a` and `b`, both ways.
    pub fn cut(&self, a: &str, b: &str) {
        let (a, b) = (self.host(a), self.host(b));
        for (from, to) in [(a, b), (b, a)] {
            let to = to.address.to_string();
            must(ip(&[
                "-n",
                &from.namespace,
                "neigh",
                "replace",
                &to,
                "lladdr",
                NOWHERE,
                "dev",
                &from.device,
                "nud",
                "permanent",
            ]));
        }
    }

    /// Heals the link between `a` and `b`.
    pub fn heal(&self, a: &str, b: &str) {
        let (a, b) = (self.host(a), self.host(b));
        for (from, to) in [(a, b), (b, a)] {
            let to = to.address.to_string();
            must(ip(&["-n", &from.namespace, "neigh", "del", &to, "dev", &from.device]));
        }
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        // A namespace's end of a veth goes with it, and its peer with it.
        for host in &self.hosts {
            let _ = ip(&["netns", "del", &host.namespace]);
        }
        let _ = ip(&["netns", "del", &self.hub]);
        let _ = ip(&["link", "del", &self.root_device]);
    }
}

/// Removes the namespaces left by test processes that ended without
/// removing theirs (killed): they are named after the process.
fn remove_abandoned_namespaces() {
    let Ok(output) = Command::new("ip").args(["netns", "list"]).output() else { return };
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let Some(name) = line.split_whitespace().next() else { continue };
        let Some(pid) = name.strip_prefix("muster-").and_then(|rest| rest.split('-').next()) else { continue };
        let alive = Path::new("/proc").join(pid).exists();
        if !alive {
            let _ = ip(&["netns", "del", name]);
        }
    }
}

/// A PostgreSQL server of the test's own on a host of a [`Network`]
/// (trust authentication, no fsync: the tests cut links, they do not
/// crash the database), stopped and removed when dropped.
pub struct PrivatePostgres {
    /// Where it listens.
    pub address: Ipv4Addr,
    folder: PathBuf,
    programs: PathBuf,
    server: tokio::process::Child,
}

/// The folder of PostgreSQL's programs (`initdb`, `postgres`, `pg_ctl`):
/// Debian's newest, else the first on the `PATH` that has them.
pub fn postgres_programs() -> Option<PathBuf> {
    let debian =
        std::fs::read_dir("/usr/lib/postgresql").into_iter().flatten().flatten().map(|entry| entry.path().join("bin"));
    let mut debian: Vec<PathBuf> = debian.collect();
    debian.sort();
    let path = std::env::var_os("PATH").unwrap_or_default();
    debian
        .into_iter()
        .rev()
        .chain(std::env::split_paths(&path))
        .find(|folder| ["initdb", "postgres", "pg_ctl"].iter().all(|program| folder.join(program).exists()))
}

impl PrivatePostgres {
    /// Initialises a cluster as the `postgres` user (initdb refuses root)
    /// and starts it on `host`, with `databases` created.
    /// [`postgres_programs`] must have found the programs.
    pub async fn start(network: &Network, host: &Host, databases: &[&str]) -> Self {
        let folder = std::env::temp_dir().join(format!("muster-pg-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&folder).expect("creating the database's folder");
        let chown = Command::new("chown").args(["postgres:postgres"]).arg(&folder).status().expect("running chown");
        assert!(chown.success(), "chown postgres {}", folder.display());
        let bin = postgres_programs().expect("PostgreSQL's programs");
        let data = folder.join("data");
        let initdb = Command::new("setpriv")
            .args(["--reuid=postgres", "--regid=postgres", "--init-groups", "--"])
            .arg(bin.join("initdb"))
            .args(["--auth=trust", "--username=postgres", "--no-sync", "-D"])
            .arg(&data)
            .output()
            .expect("running initdb");
        assert!(initdb.status.success(), "initdb: {}", String::from_utf8_lossy(&initdb.stderr));
        // initdb trusts the machine's own addresses only; the cluster's hosts are others.
        let hba = data.join("pg_hba.conf");
        let mut rules = std::fs::read_to_string(&hba).expect("reading pg_hba.conf");
        rules.push_str("host all all 0.0.0.0/0 trust\n");
        std::fs::write(&hba, rules).expect("writing pg_hba.conf");
        let log = std::fs::File::create(folder.join("server.log")).expect("the server's log");
        let server = network
            .command(host, "setpriv")
            .args(["--reuid=postgres", "--regid=postgres", "--init-groups", "--"])
            .arg(bin.join("postgres"))
            .arg("-D")
            .arg(&data)
            .args(["-c", &format!("listen_addresses={}", host.address), "-c", "port=5432"])
            .arg("-c")
            .arg(format!("unix_socket_directories={}", folder.display()))
            .args(["-c", "fsync=off", "-c", "max_connections=300"])
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().expect("the server's log"))
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("starting postgres");
        let postgres = Self { address: host.address, folder, programs: bin, server };
        postgres.wait_until_accepting().await;
        for database in databases {
            let url = postgres.url("postgres");
            let mut connection = <sqlx::PgConnection as sqlx::Connection>::connect(&url).await.expect("connecting");
            sqlx::Executor::execute(&mut connection, sqlx::AssertSqlSafe(format!("CREATE DATABASE {database}")))
                .await
                .expect("creating a database");
        }
        postgres
    }

    async fn wait_until_accepting(&self) {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        let url = self.url("postgres");
        while let Err(error) = <sqlx::PgConnection as sqlx::Connection>::connect(&url).await {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the private PostgreSQL did not start ({error}): {}",
                std::fs::read_to_string(self.folder.join("server.log")).unwrap_or_default()
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// The URL of database `name`.
    pub fn url(&self, name: &str) -> String {
        format!("postgres://postgres@{}:5432/{name}", self.address)
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        // A fast shutdown, waited for by pg_ctl; then the files.
        let _ = Command::new("setpriv")
            .args(["--reuid=postgres", "--regid=postgres", "--init-groups", "--"])
            .arg(self.programs.join("pg_ctl"))
            .args(["stop", "--mode=fast", "--wait", "--silent", "-D"])
            .arg(self.folder.join("data"))
            .status();
        let _ = self.server.start_kill();
        muster_runtime::testing::remove_folder(&self.folder);
    }
}
