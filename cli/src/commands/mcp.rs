//! `muster mcp`: the cluster as a Model Context Protocol server acting as
//! one agent (see the `muster-mcp` crate).

use std::time::Duration;

/// Arguments of `muster mcp`.
#[derive(Debug, clap::Args)]
pub(crate) struct McpArgs {
    /// Serve streamable HTTP at ADDR (`/mcp`), each request acting as the
    /// agent whose roster token its `Authorization: Bearer` header carries.
    /// Without it, serve one agent (the `--token`'s) over stdin and stdout.
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// Over HTTP, seconds an agent may make no call before it is let go:
    /// its steps go back to the cluster to be assigned again.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    idle_timeout: u64,
    /// Over HTTP, a `Host` name requests may carry besides loopback names
    /// (repeatable): the names clients reach this server by.
    #[arg(long = "allowed-host", value_name = "NAME")]
    allowed_hosts: Vec<String>,
    /// The execution service.
    #[arg(long, env = "MUSTER_EXECUTION_URL", default_value_t = muster::context::default_url(muster::context::Service::Execution))]
    execution: String,
    /// The roster.
    #[arg(long, env = "MUSTER_ROSTER_URL", default_value_t = muster::context::default_url(muster::context::Service::Roster))]
    roster: String,
    /// The notifier.
    #[arg(long, env = "MUSTER_NOTIFIER_URL", default_value_t = muster::context::default_url(muster::context::Service::Notifier))]
    notifier: String,
}

/// Serves MCP until the client closes stdin (stdio) or Ctrl-C (HTTP).
pub(crate) async fn run(args: McpArgs, token: Option<&str>) -> anyhow::Result<()> {
    let settings = muster_mcp::Settings {
        execution_url: args.execution,
        roster_url: args.roster,
        notifier_url: args.notifier,
        idle_timeout: Duration::from_secs(args.idle_timeout),
        allowed_hosts: args.allowed_hosts,
    };
    match args.listen {
        Some(address) => {
            if token.is_some() {
                anyhow::bail!(
                    "--token (or MUSTER_TOKEN) is refused with --listen: over HTTP each client acts as the agent \
                     whose token its own Authorization header carries"
                );
            }
            let listener = tokio::net::TcpListener::bind(&address)
                .await
                .map_err(|error| anyhow::anyhow!("cannot listen on {address}: {error}"))?;
            eprintln!("muster mcp: serving http://{}/mcp", listener.local_addr()?);
            muster_mcp::serve_http(settings, listener, muster_runtime::shutdown::signal()).await
        }
        None => {
            let token = token.map(str::trim).filter(|token| !token.is_empty()).ok_or_else(|| {
                anyhow::anyhow!(
                    "muster mcp over stdio acts as one agent: give its roster token with --token or MUSTER_TOKEN"
                )
            })?;
            muster_mcp::serve_stdio(settings, token).await
        }
    }
}
