//! `muster up`: the whole cluster on this machine until Ctrl-C.

use std::path::PathBuf;

use muster::cluster::{Cluster, ClusterOptions, Ports};

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
}

impl UpArgs {
    pub(crate) fn options(&self) -> anyhow::Result<ClusterOptions> {
        let mut options = ClusterOptions::new(&self.data_dir)?;
        options.ports = Ports {
            execution: self.execution_port,
            roster: self.roster_port,
            validator: self.validator_port,
            notifier: self.notifier_port,
        };
        Ok(options)
    }
}

pub(crate) async fn run(args: UpArgs) -> anyhow::Result<()> {
    let cluster = start(&args).await?;
    println!("press Ctrl-C to stop");
    muster_runtime::shutdown::signal().await;
    println!("stopping...");
    cluster.shutdown().await?;
    println!("stopped");
    Ok(())
}

/// Starts the cluster and prints where everything is.
pub(crate) async fn start(args: &UpArgs) -> anyhow::Result<Cluster> {
    println!("starting muster in {} ...", args.data_dir.display());
    let cluster = Cluster::start(args.options()?).await?;
    for (name, url) in [
        ("execution", cluster.execution_url()),
        ("roster", cluster.roster_url()),
        ("validator", cluster.validator_url()),
        ("notifier", cluster.notifier_url()),
    ] {
        println!("  {name:<10} {url}   (log: {})", cluster.service(name).log_path.display());
    }
    println!(
        "  the local operator's token is in {} (the muster command uses it by itself)",
        args.data_dir.join(muster::credentials::OPERATOR_TOKEN_FILE).display()
    );
    Ok(cluster)
}
