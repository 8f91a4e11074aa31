//! Inboxes: `muster inbox post|list|archive|watch`. A message posted to an
//! inbox starts a run of the process the inbox triggers (`triggers.inbox`);
//! `watch` keeps inboxes as folders ([`watch`]).

mod folder;
mod watch;

use anyhow::Context;
use muster_proto::execution::v1::{
    ArchiveInboxMessageRequest, InboxMessage, ListInboxMessagesRequest, ListInboxMessagesResponse, MessagePriority,
    MessageState, PostToInboxRequest, execution_service_client::ExecutionServiceClient,
};

/// `muster inbox ...`
#[derive(Debug, clap::Args)]
pub(crate) struct InboxArgs {
    /// The execution service.
    #[arg(long, env = "MUSTER_EXECUTION_URL", default_value_t = muster::context::default_url(muster::context::Service::Execution), global = true)]
    execution: String,
    /// How to print what it reads: text, or JSON (the service's answer, every page in one).
    #[arg(long, value_enum, default_value = "text", global = true)]
    output: super::output::Output,
    #[command(subcommand)]
    command: InboxCommand,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Priority {
    Low,
    Normal,
    High,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum State {
    Unprocessed,
    Processed,
    Archived,
}

#[derive(Debug, clap::Subcommand)]
enum InboxCommand {
    /// Posts a message; the process the inbox triggers runs with it.
    /// Operators, agents (as themselves) and services.
    Post {
        /// The inbox.
        inbox: String,
        /// The message.
        body: String,
        /// A one-line summary.
        #[arg(long, default_value = "")]
        subject: String,
        /// How urgent it is.
        #[arg(long, value_enum, default_value = "normal")]
        priority: Priority,
        /// The sender (an operator may name anyone; an agent posts as itself).
        #[arg(long, default_value = "")]
        from: String,
        /// A key that makes the post safe to repeat: a second post with it
        /// posts nothing and shows the first message.
        #[arg(long, default_value = "")]
        idempotency_key: String,
    },
    /// Lists an inbox's messages, oldest first (all but archived unless --state says).
    List {
        /// The inbox.
        inbox: String,
        /// Only messages in this state.
        #[arg(long, value_enum)]
        state: Option<State>,
    },
    /// Archives a message (processed, or unprocessed and not taken by a run). Operators.
    Archive {
        /// The message's id.
        id: String,
    },
    /// Inboxes as folders: posts each file dropped into DIR/<inbox>/ once it
    /// is unchanged for a poll, then moves it to DIR/<inbox>/processed/ and
    /// DIR/<inbox>/archive/ as its message moves; a refused file stays, with
    /// <file>.error beside it. Until Ctrl-C.
    Watch {
        /// The folder whose subfolders are inboxes.
        dir: std::path::PathBuf,
        /// Seconds between polls.
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=3600))]
        interval_seconds: u64,
        /// How urgent the messages are.
        #[arg(long, value_enum, default_value = "normal")]
        priority: Priority,
        /// The sender (an operator may name anyone; an agent posts as
        /// itself). Keep it across restarts: a file's idempotency key is
        /// the sender's.
        #[arg(long, default_value = "")]
        from: String,
    },
}

fn priority_to_wire(priority: Priority) -> MessagePriority {
    match priority {
        Priority::Low => MessagePriority::Low,
        Priority::Normal => MessagePriority::Normal,
        Priority::High => MessagePriority::High,
    }
}

fn line(message: &InboxMessage) -> String {
    let state = MessageState::try_from(message.state).map_or("?", |state| match state {
        MessageState::Unprocessed => "unprocessed",
        MessageState::Processed => "processed",
        MessageState::Archived => "archived",
        MessageState::Unspecified => "?",
    });
    let priority = MessagePriority::try_from(message.priority).map_or("?", |priority| match priority {
        MessagePriority::Low => "low",
        MessagePriority::High => "high",
        MessagePriority::Normal | MessagePriority::Unspecified => "normal",
    });
    let mut text = format!("{}  {state:<11}  {priority:<6}  from {}", message.id, message.sender);
    if !message.subject.is_empty() {
        text.push_str(&format!("  {}", message.subject));
    }
    if !message.claimed_by_execution_id.is_empty() {
        text.push_str(&format!("  (run {} has it)", message.claimed_by_execution_id));
    }
    if !message.processed_by_execution_id.is_empty() {
        text.push_str(&format!("  (processed by {})", message.processed_by_execution_id));
    }
    if !message.note.is_empty() {
        text.push_str(&format!("  [{}]", message.note));
    }
    text
}

pub(crate) async fn run(args: InboxArgs, token: Option<&str>) -> anyhow::Result<()> {
    let mut execution = ExecutionServiceClient::new(super::endpoint(&args.execution, token)?.channel()?);
    match args.command {
        InboxCommand::Post { inbox, body, subject, priority, from, idempotency_key } => {
            let priority = priority_to_wire(priority);
            let posted = execution
                .post_to_inbox(PostToInboxRequest {
                    inbox,
                    sender: from,
                    priority: priority as i32,
                    body,
                    subject,
                    idempotency_key,
                })
                .await
                .map_err(super::refused)?
                .into_inner();
            let message = posted.message.context("no message in the answer")?;
            println!("posted {} to inbox {}", message.id, message.inbox);
            for id in posted.triggered_execution_ids {
                println!("started execution {id}; `muster watch {id}` follows it");
            }
        }
        InboxCommand::List { inbox, state } => {
            let state = match state {
                None => MessageState::Unspecified,
                Some(State::Unprocessed) => MessageState::Unprocessed,
                Some(State::Processed) => MessageState::Processed,
                Some(State::Archived) => MessageState::Archived,
            };
            let mut all = ListInboxMessagesResponse::default();
            loop {
                let request = ListInboxMessagesRequest {
                    inbox: inbox.clone(),
                    state: state as i32,
                    page_size: 1000,
                    page_token: all.next_page_token.clone(),
                };
                let page = execution.list_inbox_messages(request).await.map_err(super::refused)?.into_inner();
                all.messages.extend(page.messages);
                all.next_page_token = page.next_page_token;
                if all.next_page_token.is_empty() {
                    break;
                }
            }
            if args.output == super::output::Output::Json {
                println!("{}", super::output::to_json(&all, "muster.execution.v1.ListInboxMessagesResponse")?);
            } else if all.messages.is_empty() {
                println!("(no messages)");
            } else {
                for message in &all.messages {
                    println!("{}", line(message));
                }
            }
        }
        InboxCommand::Archive { id } => {
            let archived = execution
                .archive_inbox_message(ArchiveInboxMessageRequest { id })
                .await
                .map_err(super::refused)?
                .into_inner();
            let message = archived.message.context("no message in the answer")?;
            println!("archived {}", message.id);
        }
        InboxCommand::Watch { dir, interval_seconds, priority, from } => {
            let options = watch::Watch {
                dir,
                interval: std::time::Duration::from_secs(interval_seconds),
                sender: from,
                priority: priority_to_wire(priority),
            };
            watch::run(options, execution).await?;
        }
    }
    Ok(())
}
