//! Memory: `muster memory show ROLE` (or `--global`), what the runs of a
//! role remember, newest first; `add` and `forget` for operators.

use muster_proto::execution::v1::{
    AppendMemoryRequest, ForgetMemoryRequest, ListMemoryRequest, ListMemoryResponse, MemoryEntry, MemoryScope,
    execution_service_client::ExecutionServiceClient,
};

/// `muster memory ...`
#[derive(Debug, clap::Args)]
pub(crate) struct MemoryArgs {
    /// The execution service.
    #[arg(long, env = "MUSTER_EXECUTION_URL", default_value_t = muster::context::default_url(muster::context::Service::Execution), global = true)]
    execution: String,
    /// How to print what it reads: text, or JSON (the service's answer, every page in one).
    #[arg(long, value_enum, default_value = "text", global = true)]
    output: super::output::Output,
    #[command(subcommand)]
    command: MemoryCommand,
}

/// Which memory: a role's, or the global one.
#[derive(Debug, clap::Args)]
#[group(required = true, multiple = false)]
struct Which {
    /// The role whose memory it is.
    role: Option<String>,
    /// The global memory, which every run reads.
    #[arg(long)]
    global: bool,
}

impl Which {
    fn request(&self) -> (i32, String) {
        match &self.role {
            Some(role) => (MemoryScope::Role as i32, role.clone()),
            None => (MemoryScope::Global as i32, String::new()),
        }
    }
}

#[derive(Debug, clap::Subcommand)]
enum MemoryCommand {
    /// Shows a memory's entries, newest first.
    Show {
        #[command(flatten)]
        which: Which,
        /// Most entries to show; 0 shows them all.
        #[arg(long, default_value_t = 0)]
        limit: usize,
    },
    /// Adds an entry (a preference, a correction) that later runs read.
    Add {
        #[command(flatten)]
        which: Which,
        /// What to remember.
        #[arg(long)]
        text: String,
        /// A key that makes the addition safe to repeat: a second one with
        /// it adds nothing and shows the first entry.
        #[arg(long, default_value = "")]
        idempotency_key: String,
    },
    /// Removes an entry, by the id `show` prints.
    Forget {
        /// The entry's id.
        id: String,
    },
}

fn line(entry: &MemoryEntry) -> String {
    let source = if entry.execution_id.is_empty() { String::new() } else { format!(" in {}", entry.execution_id) };
    format!(
        "{}  {}  {}{source}\n    {}",
        muster_format::rfc3339(entry.created_at.as_ref().map_or(0, muster_runtime::time::from_timestamp)),
        entry.id,
        entry.author,
        entry.text.replace('\n', "\n    ")
    )
}

pub(crate) async fn run(args: MemoryArgs, token: Option<&str>) -> anyhow::Result<()> {
    let mut execution = ExecutionServiceClient::new(super::endpoint(&args.execution, token)?.channel()?);
    match args.command {
        MemoryCommand::Show { which, limit } => {
            let (scope, role) = which.request();
            let mut all = ListMemoryResponse::default();
            loop {
                let page_token = std::mem::take(&mut all.next_page_token);
                let request = ListMemoryRequest { scope, role: role.clone(), page_size: 1000, page_token };
                let page = execution.list_memory(request).await.map_err(super::refused)?.into_inner();
                all.entries.extend(page.entries);
                all.next_page_token = page.next_page_token;
                if limit > 0 && all.entries.len() >= limit {
                    // The page's token would skip what the limit left out.
                    all.entries.truncate(limit);
                    all.next_page_token.clear();
                    break;
                }
                if all.next_page_token.is_empty() {
                    break;
                }
            }
            if args.output == super::output::Output::Json {
                println!("{}", super::output::to_json(&all, "muster.execution.v1.ListMemoryResponse")?);
            } else if all.entries.is_empty() {
                println!("(nothing remembered yet)");
            } else {
                for entry in &all.entries {
                    println!("{}", line(entry));
                }
            }
        }
        MemoryCommand::Add { which, text, idempotency_key } => {
            let (scope, role) = which.request();
            let added = execution
                .append_memory(AppendMemoryRequest { scope, role, text, idempotency_key })
                .await
                .map_err(super::refused)?
                .into_inner();
            if let Some(entry) = added.entry {
                println!("{}", line(&entry));
            }
        }
        MemoryCommand::Forget { id } => {
            execution.forget_memory(ForgetMemoryRequest { id: id.clone() }).await.map_err(super::refused)?;
            println!("forgot {id}");
        }
    }
    Ok(())
}
