//! `muster up`: the whole cluster on this machine until Ctrl-C, supervised:
//! a service that exits is restarted (and the command says so), one that
//! keeps crashing stops the cluster with an error.

use std::path::PathBuf;

use anyhow::Context as _;

use muster::{
    cluster::{Cluster, ClusterOptions, Ports, RestartPolicy, SupervisionEvent},
    context::ClusterContext,
};

/// Options of `muster up` (shared by `muster demo`).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct UpArgs {
    /// Data folder: SQLite files, logs and the agents' NDJSON memory.
    #[arg(long, env = "MUSTER_DATA_DIR", default_value = "muster-data")]
    pub(crate) data_dir: PathBuf,
    /// Port of the execution service.
    #[arg(long, default_value_t = 50051)]
    pub(crate) execution_port: u16,
    /// Port of the roster.
    #[arg(long, default_value_t = 50052)]
    pub(crate) roster_port: u16,
    /// Port of the validator.
    #[arg(long, default_value_t = 50053)]
    pub(crate) validator_port: u16,
    /// Port of the notifier.
    #[arg(long, default_value_t = 50054)]
    pub(crate) notifier_port: u16,
    /// Port of the console, the cluster's web pages.
    #[arg(long, default_value_t = 50080)]
    pub(crate) console_port: u16,
    /// Do not start the console.
    #[arg(long)]
    pub(crate) no_console: bool,
}

/// Options of `muster up` alone.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct UpCommand {
    #[command(flatten)]
    pub(crate) up: UpArgs,
    /// Starts the cluster in the background (its output in
    /// DATA_DIR/logs/up.log) and returns once it serves; `muster down`
    /// stops it.
    #[arg(long)]
    pub(crate) detach: bool,
}

/// `muster down`
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct DownArgs {
    /// The data folder of the cluster `muster up --detach` started (by
    /// default the current cluster's, else `muster-data`).
    #[arg(long, env = "MUSTER_DATA_DIR")]
    data_dir: Option<PathBuf>,
}

/// What `muster up` prints once the cluster serves.
const SERVING: &str = "press Ctrl-C to stop";
/// The file in the data folder that holds the process id of a detached `muster up`.
const PID_FILE: &str = "up.pid";
/// How long `--detach` waits for the cluster to serve, and `down` for it to stop.
const DETACH_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// `muster up --detach`: runs `muster up` (the same arguments but
/// `--detach`) in a process group of its own, and returns once it serves.
pub(crate) async fn detach(args: &UpArgs) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt as _;
    let logs = args.data_dir.join("logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    let log_path = logs.join("up.log");
    let log = std::fs::File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
    let arguments: Vec<String> = std::env::args().skip(1).filter(|argument| argument != "--detach").collect();
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .args(arguments)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .context("starting muster up in the background")?;
    let pid_file = args.data_dir.join(PID_FILE);
    std::fs::write(&pid_file, format!("{}\n", child.id()))
        .with_context(|| format!("writing {}", pid_file.display()))?;
    let deadline = std::time::Instant::now() + DETACH_WAIT;
    loop {
        let output = std::fs::read_to_string(&log_path).unwrap_or_default();
        if let Some((started, _)) = output.split_once(SERVING) {
            print!("{started}");
            println!(
                "running in the background (pid {}, output in {}); `muster down` stops it",
                child.id(),
                log_path.display()
            );
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            let _ = std::fs::remove_file(&pid_file);
            anyhow::bail!("muster up ended ({status}) before serving:\n{output}");
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "muster up did not serve within {DETACH_WAIT:?}:\n{output}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// `muster down`: stops the cluster `muster up --detach` started, as
/// Ctrl-C would, and waits until it has stopped.
pub(crate) async fn down(args: DownArgs) -> anyhow::Result<()> {
    use nix::{sys::signal, unistd::Pid};
    let data_dir = args.data_dir.unwrap_or_else(muster::credentials::default_data_dir);
    let pid_file = data_dir.join(PID_FILE);
    let text = std::fs::read_to_string(&pid_file).with_context(|| {
        format!("no cluster started with `muster up --detach` in {} ({})", data_dir.display(), pid_file.display())
    })?;
    let pid: i32 = text.trim().parse().with_context(|| format!("{} holds no process id", pid_file.display()))?;
    let pid = Pid::from_raw(pid);
    if signal::kill(pid, signal::Signal::SIGINT).is_err() {
        let _ = std::fs::remove_file(&pid_file);
        println!("muster up (pid {pid}) was not running");
        return Ok(());
    }
    let deadline = std::time::Instant::now() + DETACH_WAIT;
    while signal::kill(pid, None).is_ok() {
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "muster up (pid {pid}) did not stop within {DETACH_WAIT:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // (`muster up` removes it as it stops; a killed one leaves it.)
    let _ = std::fs::remove_file(&pid_file);
    println!("stopped");
    Ok(())
}

impl UpArgs {
    pub(crate) fn options(&self) -> anyhow::Result<ClusterOptions> {
        let mut options = ClusterOptions::new(&self.data_dir)?;
        options.ports = Ports {
            execution: self.execution_port,
            roster: self.roster_port,
            validator: self.validator_port,
            notifier: self.notifier_port,
            console: self.console_port,
        };
        options.console = !self.no_console;
        Ok(options)
    }
}

pub(crate) async fn run(args: UpArgs, name: &str) -> anyhow::Result<()> {
    let mut cluster = start(&args, name).await?;
    println!("{SERVING}; a service that exits is restarted");
    let supervised = cluster.supervise(RestartPolicy::default(), muster_runtime::shutdown::signal(), print_event).await;
    println!("{}", if supervised.is_ok() { "stopping..." } else { "stopping the other services..." });
    let stopped = cluster.shutdown().await;
    // Started by `muster up --detach`: its process id goes with it.
    let pid_file = args.data_dir.join(PID_FILE);
    if std::fs::read_to_string(&pid_file).is_ok_and(|text| text.trim() == std::process::id().to_string()) {
        let _ = std::fs::remove_file(&pid_file);
    }
    supervised?;
    stopped?;
    println!("stopped");
    Ok(())
}

fn print_event(event: SupervisionEvent) {
    match event {
        SupervisionEvent::Crashed { service, what, log_path, log_tail, attempt, restart_in } => {
            eprintln!("{service} {what}; its log: {}", log_path.display());
            for line in log_tail {
                eprintln!("  | {line}");
            }
            if let Some(restart_in) = restart_in {
                eprintln!("restarting {service} in {:.1} s (attempt {attempt})", restart_in.as_secs_f64());
            }
        }
        SupervisionEvent::Restarted { service, attempt, pid, address } => {
            let pid = pid.map_or_else(|| "?".to_owned(), |pid| pid.to_string());
            println!("restarted {service} (attempt {attempt}): pid {pid}, http://{address}");
        }
    }
}

/// Starts the cluster, prints where everything is, and writes its context
/// (`name`), through which the other `muster` commands find it.
pub(crate) async fn start(args: &UpArgs, name: &str) -> anyhow::Result<Cluster> {
    println!("starting muster in {} ...", args.data_dir.display());
    let cluster = Cluster::start(args.options()?).await?;
    for (name, url) in [
        ("execution", cluster.execution_url()),
        ("roster", cluster.roster_url()),
        ("validator", cluster.validator_url()),
        ("notifier", cluster.notifier_url()),
    ] {
        let service = cluster.service(name);
        let pid = service.pid().map_or_else(|| "?".to_owned(), |pid| pid.to_string());
        println!("  {name:<10} {url}   (pid {pid}, log: {})", service.log_path.display());
    }
    if let Some(url) = cluster.console_url() {
        let console = cluster.service("console");
        let pid = console.pid().map_or_else(|| "?".to_owned(), |pid| pid.to_string());
        println!("  {:<10} {url}/   (pid {pid}, log: {}): open it in a browser", "console", console.log_path.display());
    }
    println!(
        "  the local operator's token is in {} (the muster command uses it by itself; sign in to the console with it)",
        args.data_dir.join(muster::credentials::OPERATOR_TOKEN_FILE).display()
    );
    let context = ClusterContext {
        name: name.to_owned(),
        data_dir: std::path::absolute(&args.data_dir)?,
        execution: cluster.execution_url(),
        roster: cluster.roster_url(),
        validator: cluster.validator_url(),
        notifier: cluster.notifier_url(),
        console: cluster.console_url(),
    };
    match muster::context::save(&context)? {
        Some(file) => println!(
            "  muster commands on this machine use this cluster (context '{name}' in {}); \
             after another `muster up`, pick it with: export MUSTER_CLUSTER={name}",
            file.display()
        ),
        None => println!(
            "  in another terminal: export MUSTER_EXECUTION_URL={} MUSTER_ROSTER_URL={} MUSTER_DATA_DIR={}",
            context.execution,
            context.roster,
            context.data_dir.display()
        ),
    }
    Ok(cluster)
}
