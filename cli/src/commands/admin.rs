//! Running the cluster's authority: `muster token rotate|revoke AGENT`,
//! `muster operator add NAME`, `muster matrix show|apply`.

use std::path::PathBuf;

use anyhow::Context;
use muster_proto::{
    execution::v1::{
        GetPermissionMatrixRequest, PermissionMatrixVersion, PutPermissionMatrixRequest,
        execution_service_client::ExecutionServiceClient,
    },
    roster::v1::{RevokeTokenRequest, RotateTokenRequest, roster_service_client::RosterServiceClient},
};

/// `muster token ...`
#[derive(Debug, clap::Args)]
pub(crate) struct TokenArgs {
    /// The roster service.
    #[arg(long, env = "MUSTER_ROSTER_URL", default_value_t = muster::context::default_url(muster::context::Service::Roster), global = true)]
    roster: String,
    #[command(subcommand)]
    command: TokenCommand,
}

#[derive(Debug, clap::Subcommand)]
enum TokenCommand {
    /// Issues a new token for an agent; the old one stops working at once
    /// (everywhere within seconds). Operators, or an agent for itself.
    Rotate {
        /// The agent.
        agent_id: String,
        /// Puts the new token into this tokens file (JSON, mode 0600)
        /// instead of printing it.
        #[arg(long)]
        tokens_file: Option<PathBuf>,
    },
    /// Revokes an agent's token: it stops working at once (everywhere
    /// within seconds). Operators, or an agent for itself.
    Revoke {
        /// The agent.
        agent_id: String,
    },
}

pub(crate) async fn token(args: TokenArgs, token: Option<&str>) -> anyhow::Result<()> {
    let mut roster = RosterServiceClient::new(super::endpoint(&args.roster, token)?.channel()?);
    match args.command {
        TokenCommand::Rotate { agent_id, tokens_file } => {
            let token = roster
                .rotate_token(RotateTokenRequest { agent_id: agent_id.clone() })
                .await
                .map_err(super::refused)?
                .into_inner()
                .token;
            match tokens_file {
                Some(path) => {
                    let issued = serde_json::Map::from_iter([(agent_id.clone(), serde_json::Value::String(token))]);
                    super::roster::merge_tokens(&path, issued)?;
                    println!("new token of {agent_id} written to {}", path.display());
                }
                None => println!("{token}"),
            }
        }
        TokenCommand::Revoke { agent_id } => {
            roster.revoke_token(RevokeTokenRequest { agent_id: agent_id.clone() }).await.map_err(super::refused)?;
            println!("the token of {agent_id} is revoked");
        }
    }
    Ok(())
}

/// `muster operator ...`
#[derive(Debug, clap::Args)]
pub(crate) struct OperatorArgs {
    #[command(subcommand)]
    command: OperatorCommand,
}

#[derive(Debug, clap::Subcommand)]
enum OperatorCommand {
    /// Adds an operator to an operators file and prints its token, once: the
    /// file keeps only the token's SHA-256. The services read the file
    /// (MUSTER_OPERATORS_FILE) again when it changes.
    Add {
        /// The operator's name.
        name: String,
        /// The operators file.
        #[arg(long, env = "MUSTER_OPERATORS_FILE")]
        operators_file: PathBuf,
    },
}

pub(crate) fn operator(args: &OperatorArgs) -> anyhow::Result<()> {
    match &args.command {
        OperatorCommand::Add { name, operators_file } => {
            let token = muster_runtime::auth::operators::add_to_file(operators_file, name)?;
            eprintln!("operator '{name}' added to {}; its token (shown once):", operators_file.display());
            println!("{token}");
        }
    }
    Ok(())
}

/// `muster matrix ...`
#[derive(Debug, clap::Args)]
pub(crate) struct MatrixArgs {
    /// The execution service.
    #[arg(long, env = "MUSTER_EXECUTION_URL", default_value_t = muster::context::default_url(muster::context::Service::Execution), global = true)]
    execution: String,
    /// How to print what it reads: text, or JSON (the service's answer, every page in one).
    #[arg(long, value_enum, default_value = "text", global = true)]
    output: super::output::Output,
    #[command(subcommand)]
    command: MatrixCommand,
}

#[derive(Debug, clap::Subcommand)]
enum MatrixCommand {
    /// Prints the permission matrix in force (or a version) as YAML.
    Show {
        /// The version; the one in force when not given.
        #[arg(long)]
        version: Option<u32>,
    },
    /// Stores a permission matrix file as the new version in force. Operators.
    Apply {
        /// The matrix (YAML).
        file: PathBuf,
    },
}

pub(crate) async fn matrix(args: MatrixArgs, token: Option<&str>) -> anyhow::Result<()> {
    let mut execution = ExecutionServiceClient::new(super::endpoint(&args.execution, token)?.channel()?);
    match args.command {
        MatrixCommand::Show { version } => {
            let response = execution
                .get_permission_matrix(GetPermissionMatrixRequest { version: version.unwrap_or(0) })
                .await
                .map_err(super::refused)?
                .into_inner();
            if args.output == super::output::Output::Json {
                println!("{}", super::output::to_json(&response, "muster.execution.v1.GetPermissionMatrixResponse")?);
                return Ok(());
            }
            let matrix = response.matrix.context("no matrix in the answer")?;
            println!("# permission matrix version {} ({})", matrix.version, describe(&matrix));
            print!("{}", matrix.source);
        }
        MatrixCommand::Apply { file } => {
            let source = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
            let file_name = file.display().to_string();
            match execution.put_permission_matrix(PutPermissionMatrixRequest { source: source.clone() }).await {
                Ok(response) => {
                    let response = response.into_inner();
                    super::run::print_diagnostics(&file_name, &source, &response.diagnostics);
                    let matrix = response.matrix.context("no matrix in the answer")?;
                    println!("permission matrix version {} is in force ({})", matrix.version, describe(&matrix));
                }
                Err(status) => {
                    let diagnostics = muster_runtime::status::diagnostics(&status);
                    super::run::print_diagnostics(&file_name, &source, &diagnostics);
                    return Err(super::refused(status).context(format!("{file_name} was refused")));
                }
            }
        }
    }
    Ok(())
}

fn describe(matrix: &PermissionMatrixVersion) -> String {
    let roles: Vec<&str> = matrix.roles.iter().map(|role| role.name.as_str()).collect();
    format!("roles {}; stored by {}", roles.join(", "), matrix.created_by)
}
