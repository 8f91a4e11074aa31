//! Memory: `muster memory show ROLE` (or `--global`), what the runs of a
//! role remember, newest first; `add` and `forget` for operators.

use muster_proto::execution::v1::{
    AppendMemoryRequest, ForgetMemoryRequest, ListMemoryRequest, MemoryEntry, MemoryScope,
    execution_service_client::ExecutionServiceClient,
};

/// `muster memory ...`
#[derive(Debug, clap::Args)]
pub(crate) struct MemoryArgs {
    /// The execution service.
    #[arg(long, env = "MUSTER_EXECUTION_URL", default_value = "http://127.0.0.1:50051", global = true)]
    execution: String,
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
        muster_format::rfc3339(entry.created_at_ms),
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
            let mut page_token = String::new();
            let mut shown = 0;
            loop {
                let request = ListMemoryRequest { scope, role: role.clone(), page_size: 1000, page_token };
                let page = execution.list_memory(request).await.map_err(super::refused)?.into_inner();
                for entry in &page.entries {
                    if limit > 0 && shown == limit {
                        return Ok(());
                    }
                    println!("{}", line(entry));
                    shown += 1;
                }
                if page.next_page_token.is_empty() {
                    break;
                }
                page_token = page.next_page_token;
            }
            if shown == 0 {
                println!("(nothing remembered yet)");
            }
        }
        MemoryCommand::Add { which, text } => {
            let (scope, role) = which.request();
            let added = execution
                .append_memory(AppendMemoryRequest { scope, role, text })
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
