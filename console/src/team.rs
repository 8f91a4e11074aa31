//! The team: a session's lead dashboard (`?execution=`), the permission
//! matrix's versions, an inbox's messages (`?inbox=`), budgets with their
//! use, schedules with their next due times, and memory. Each part shows
//! what the cluster lets the viewer read, or why it does not.

use std::fmt::Write as _;

use axum::{
    extract::{Query, State},
    response::Html,
};
use muster_proto::execution::v1::{
    GetSessionStatusRequest, ListBudgetsRequest, ListInboxMessagesRequest, ListMemoryRequest,
    ListPermissionMatrixVersionsRequest, ListSchedulesRequest,
};
use serde_json::Value;

use crate::{
    Shared,
    cluster::{Failure, Signed, to_json},
    html::{self, escape},
};

/// Rows per part.
const PAGE: u32 = 50;

#[derive(Debug, Default, serde::Deserialize)]
pub(crate) struct TeamQuery {
    #[serde(default)]
    execution: String,
    #[serde(default)]
    inbox: String,
}

/// The team page.
pub(crate) async fn page(
    State(console): State<Shared>,
    Signed(session): Signed,
    Query(query): Query<TeamQuery>,
) -> Result<Html<String>, Failure> {
    let mut execution = console.cluster.execution(&session)?;
    let mut body = format!(
        "<form class=\"filters\" method=\"get\" action=\"/team\">\
         <label for=\"session\">Session (execution id)</label> <input id=\"session\" name=\"execution\" value=\"{}\"> \
         <label for=\"inbox\">Inbox</label> <input id=\"inbox\" name=\"inbox\" value=\"{}\"> \
         <button type=\"submit\">Show</button></form>",
        escape(&query.execution),
        escape(&query.inbox)
    );
    if !query.execution.trim().is_empty() {
        let request = GetSessionStatusRequest { execution_id: query.execution.trim().to_owned() };
        body.push_str("<h2>Session</h2>");
        match execution.get_session_status(request).await {
            Ok(answer) => {
                let answer = answer.into_inner();
                let status = to_json(&answer, "muster.execution.v1.GetSessionStatusResponse");
                let _ = write!(body, "<p>Lead: <strong>{}</strong></p>", escape(text(&status["lead_agent_id"])));
                for (key, caption) in [
                    ("assignments", "Participants and their roles"),
                    ("blockers", "Blockers"),
                    ("suggested_interventions", "Suggestions"),
                    ("subtask_requests", "Subtask requests and their decisions"),
                ] {
                    body.push_str(&table(caption, status[key].as_array().map_or(&[][..], Vec::as_slice)));
                }
                body.push_str("<h3>Recent activity</h3><ol class=\"timeline\" tabindex=\"0\">");
                for event in &answer.recent_activity {
                    let kind = event.event_type().as_str_name().trim_start_matches("EVENT_TYPE_").to_ascii_lowercase();
                    let _ = write!(
                        body,
                        "<li>{} {}: {} {}</li>",
                        event.occurred_at.map(|at| at.to_string()).unwrap_or_default(),
                        escape(if event.step_id.is_empty() { "execution" } else { &event.step_id }),
                        kind.replace('_', " "),
                        escape(&event.agent_id)
                    );
                }
                body.push_str("</ol>");
            }
            Err(status) => body.push_str(&refused(&status)),
        }
    }
    if !query.inbox.trim().is_empty() {
        let request =
            ListInboxMessagesRequest { inbox: query.inbox.trim().to_owned(), page_size: PAGE, ..Default::default() };
        let answer = execution.list_inbox_messages(request).await;
        body.push_str(&section("Inbox", answer, "ListInboxMessagesResponse", "messages", "Messages and their notes"));
    }
    let request = ListPermissionMatrixVersionsRequest { page_size: PAGE, page_token: String::new() };
    let answer = execution.list_permission_matrix_versions(request).await;
    let versions = section(
        "Permission matrix",
        answer,
        "ListPermissionMatrixVersionsResponse",
        "versions",
        "Versions, newest first",
    );
    body.push_str(&versions);
    let answer = execution.list_budgets(ListBudgetsRequest { page_size: PAGE, ..Default::default() }).await;
    body.push_str(&section("Budgets", answer, "ListBudgetsResponse", "budgets", "Budgets and their use"));
    let answer = execution.list_schedules(ListSchedulesRequest { page_size: PAGE, page_token: String::new() }).await;
    let schedules =
        section("Schedules", answer, "ListSchedulesResponse", "schedules", "Schedules and when they are next due");
    body.push_str(&schedules);
    let answer = execution.list_memory(ListMemoryRequest { page_size: PAGE, ..Default::default() }).await;
    body.push_str(&section("Memory", answer, "ListMemoryResponse", "entries", "Memory entries"));
    Ok(Html(html::page("Team", "/team", Some(&session), &body)))
}

fn refused(status: &tonic::Status) -> String {
    html::notice("info", &format!("Not shown: {}", status.message()))
}

fn text(value: &Value) -> &str {
    value.as_str().unwrap_or_default()
}

/// A part of the page: `title`, and the list under `key` of the answer (an
/// `execution.v1` message named `message`) as a table, or why the cluster
/// did not answer.
fn section<M: prost::Message>(
    title: &str,
    answer: Result<tonic::Response<M>, tonic::Status>,
    message: &str,
    key: &str,
    caption: &str,
) -> String {
    let shown = match answer {
        Ok(answer) => {
            let answer = to_json(&answer.into_inner(), &format!("muster.execution.v1.{message}"));
            table(caption, answer[key].as_array().map_or(&[][..], Vec::as_slice))
        }
        Err(status) => refused(&status),
    };
    format!("<h2>{}</h2>{shown}", escape(title))
}

/// `rows` (JSON objects) as a table: a column per field of the first row;
/// nested values as compact JSON text. Everything is escaped.
fn table(caption: &str, rows: &[Value]) -> String {
    let Some(Value::Object(first)) = rows.first() else {
        return format!("<p class=\"empty\">{}: none.</p>", escape(caption));
    };
    let columns: Vec<&String> = first.keys().filter(|key| key.as_str() != "source").collect();
    let mut table =
        format!("<div class=\"scroll\" tabindex=\"0\"><table><caption>{}</caption><thead><tr>", escape(caption));
    for column in &columns {
        let _ = write!(table, "<th scope=\"col\">{}</th>", escape(&column.replace('_', " ")));
    }
    table.push_str("</tr></thead><tbody>");
    for row in rows {
        table.push_str("<tr>");
        for column in &columns {
            let cell = match &row[column.as_str()] {
                Value::String(text) => text.clone(),
                Value::Null => String::new(),
                other => other.to_string(),
            };
            let _ = write!(table, "<td>{}</td>", escape(&cell));
        }
        table.push_str("</tr>");
    }
    table.push_str("</tbody></table></div>");
    table
}
