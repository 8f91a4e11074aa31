//! `muster notifications AGENT [--follow]`: an agent's notifications, as
//! the notifier keeps them (its durable inbox), oldest first; with
//! `--follow`, new ones as they come until Ctrl-C.

use muster_proto::notifier::v1::{
    ListNotificationsRequest, ListNotificationsResponse, Notification, RecipientReason, SubscribeRequest,
    notifier_service_client::NotifierServiceClient, subscribe_response,
};

use super::output::{Output, event_name, to_json, to_json_line, when};

/// The type of a notification, for JSON.
const NOTIFICATION: &str = "muster.notifier.v1.Notification";

/// Most notifications asked for per page.
const PAGE: u32 = 1000;

/// `muster notifications`
#[derive(Debug, clap::Args)]
pub(crate) struct NotificationsArgs {
    /// The agent.
    agent_id: String,
    /// Only those after this cursor.
    #[arg(long, default_value_t = 0)]
    after: u64,
    /// Then wait for new ones and print them as they come, until Ctrl-C.
    #[arg(long)]
    follow: bool,
    /// How to print them: text, or JSON (with --follow, one object per line).
    #[arg(long, value_enum, default_value = "text")]
    output: Output,
    /// The notifier.
    #[arg(long, env = "MUSTER_NOTIFIER_URL", default_value_t = muster::context::default_url(muster::context::Service::Notifier))]
    notifier: String,
}

/// One notification as a line.
fn line(notification: &Notification) -> String {
    let event = notification.event.clone().unwrap_or_default();
    let kind = event_name(event.event_type);
    let reason = RecipientReason::try_from(notification.reason).unwrap_or_default();
    let reason = reason.as_str_name().trim_start_matches("RECIPIENT_REASON_").to_lowercase();
    let step = if event.step_id.is_empty() { String::new() } else { format!(" {}", event.step_id) };
    let summary = if notification.output_summary.is_empty() { &event.detail } else { &notification.output_summary };
    format!(
        "#{:<5} {}  {kind:<18} {}{step}  ({reason}){}",
        notification.cursor,
        when(notification.created_at.as_ref()),
        event.execution_id,
        if summary.is_empty() { String::new() } else { format!("  {summary}") }
    )
}

pub(crate) async fn run(args: NotificationsArgs, token: Option<&str>) -> anyhow::Result<()> {
    let mut client = NotifierServiceClient::new(super::endpoint(&args.notifier, token)?.channel()?);
    // Everything kept so far, page after page.
    let mut all = ListNotificationsResponse::default();
    let mut cursor = args.after;
    loop {
        let request = ListNotificationsRequest { agent_id: args.agent_id.clone(), after_cursor: cursor, limit: PAGE };
        let page = client.list_notifications(request).await.map_err(super::refused)?.into_inner();
        all.acknowledged_cursor = page.acknowledged_cursor;
        let Some(last) = page.notifications.last() else { break };
        cursor = last.cursor;
        let full = page.notifications.len() as u32 >= PAGE;
        all.notifications.extend(page.notifications);
        if !full {
            break;
        }
    }
    match (args.output, args.follow) {
        (Output::Json, false) => {
            println!("{}", to_json(&all, "muster.notifier.v1.ListNotificationsResponse")?);
            return Ok(());
        }
        (Output::Json, true) => {
            for notification in &all.notifications {
                println!("{}", to_json_line(notification, NOTIFICATION)?);
            }
        }
        (Output::Text, follow) => {
            if all.notifications.is_empty() && !follow {
                println!("(no notifications for {})", args.agent_id);
            }
            for notification in &all.notifications {
                println!("{}", line(notification));
            }
        }
    }
    if !args.follow {
        return Ok(());
    }
    loop {
        let request = SubscribeRequest { agent_id: args.agent_id.clone(), after_cursor: cursor };
        let mut stream = client.subscribe(request).await.map_err(super::refused)?.into_inner();
        let ended = tokio::select! {
            ended = async {
                while let Some(response) = stream.message().await.map_err(super::refused)? {
                    match response.message {
                        Some(subscribe_response::Message::Notification(notification)) => {
                            cursor = cursor.max(notification.cursor);
                            match args.output {
                                Output::Json => println!("{}", to_json_line(&notification, NOTIFICATION)?),
                                Output::Text => println!("{}", line(&notification)),
                            }
                        }
                        // Fell behind: subscribe again after what was printed.
                        Some(subscribe_response::Message::LaggedAfterCursor(_)) | None => return Ok(false),
                    }
                }
                anyhow::Ok(true)
            } => ended?,
            _ = muster_runtime::shutdown::signal() => return Ok(()),
        };
        anyhow::ensure!(!ended, "the notifier ended the subscription");
    }
}
