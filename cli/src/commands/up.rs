//! `muster up`: the whole cluster on this machine until Ctrl-C, supervised:
//! a service that exits is restarted (and the command says so), one that
//! keeps crashing stops the cluster with an error.

use std::path::PathBuf;

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
    println!("press Ctrl-C to stop; a service that exits is restarted");
    let supervised = cluster.supervise(RestartPolicy::default(), muster_runtime::shutdown::signal(), print_event).await;
    println!("{}", if supervised.is_ok() { "stopping..." } else { "stopping the other services..." });
    let stopped = cluster.shutdown().await;
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
