//! Executions: a filterable, paged list, and one execution drawn as its
//! graph, kept live by server-sent events from `WatchExecution`, with the
//! decisions and interventions its viewer is entitled to.

use std::{convert::Infallible, fmt::Write as _};

use axum::{
    Form, Json,
    extract::{Path, Query, State},
    response::{
        Html, IntoResponse, Redirect, Response,
        sse::{Event, KeepAlive, Sse},
    },
};
use muster_proto::{
    common::v1::ExecutionStatus,
    execution::v1::{
        Execution, GetExecutionRequest, GetProcessRequest, InterveneRequest, InterventionAction, ListExecutionsRequest,
        StepStatus, SubmitApprovalRequest, WatchExecutionRequest,
    },
};
use tokio_stream::StreamExt as _;

use crate::{
    Shared,
    cluster::{Failure, Signed, check_csrf, patiently, to_json},
    html::{self, escape},
    session::Session,
};

/// Executions per page of the list.
const PAGE: u32 = 50;

#[derive(Debug, Default, serde::Deserialize)]
pub(crate) struct ListQuery {
    #[serde(default)]
    status: String,
    #[serde(default)]
    process: String,
    #[serde(default)]
    page: String,
}

/// The executions the caller may see, newest first: all of them for an
/// operator, those it takes part in for an agent.
pub(crate) async fn list(
    State(console): State<Shared>,
    Signed(session): Signed,
    Query(query): Query<ListQuery>,
) -> Result<Html<String>, Failure> {
    let status = ExecutionStatus::from_str_name(&query.status).unwrap_or(ExecutionStatus::Unspecified);
    let request = ListExecutionsRequest {
        process_name: query.process.trim().to_owned(),
        status: status as i32,
        limit: PAGE,
        page_token: query.page.clone(),
        ..Default::default()
    };
    let client = console.cluster.execution(&session)?;
    let answer = patiently(|| {
        let (mut client, request) = (client.clone(), request.clone());
        async move { client.list_executions(request).await }
    })
    .await?
    .into_inner();
    let mut body = String::from("<form class=\"filters\" method=\"get\" action=\"/executions\" role=\"search\">");
    let _ = write!(
        body,
        "<label for=\"process\">Process</label> <input id=\"process\" name=\"process\" value=\"{}\"> \
         <label for=\"status\">Status</label> <select id=\"status\" name=\"status\"><option value=\"\">any</option>",
        escape(&query.process)
    );
    for candidate in [
        ExecutionStatus::Running,
        ExecutionStatus::Paused,
        ExecutionStatus::Completed,
        ExecutionStatus::Failed,
        ExecutionStatus::Cancelled,
    ] {
        let name = candidate.as_str_name();
        let selected = if candidate == status { " selected" } else { "" };
        let _ = write!(body, "<option value=\"{name}\"{selected}>{}</option>", status_word(name));
    }
    body.push_str("</select> <button type=\"submit\">Filter</button></form>");
    if answer.executions.is_empty() {
        body.push_str(&html::notice("info", "No executions match."));
    } else {
        body.push_str(
            "<div class=\"scroll\" tabindex=\"0\"><table class=\"executions\"><caption>Executions, newest first</caption><thead><tr>\
             <th scope=\"col\">Execution</th><th scope=\"col\">Process</th><th scope=\"col\">Status</th>\
             <th scope=\"col\">Lead</th><th scope=\"col\">Started</th><th scope=\"col\">Ended</th></tr></thead><tbody>",
        );
        for execution in &answer.executions {
            let status = status_word(execution.status().as_str_name());
            let _ = write!(
                body,
                "<tr><td><a href=\"/executions/{id}\">{id}</a></td><td>{process} v{version}</td>\
                 <td><span class=\"state {status}\">{status}</span></td><td>{lead}</td><td>{started}</td><td>{ended}</td></tr>",
                id = escape(&execution.id),
                process = escape(&execution.process_name),
                version = execution.process_version,
                lead = escape(&execution.lead_agent_id),
                started = when(execution.started_at.as_ref()),
                ended = when(execution.ended_at.as_ref()),
            );
        }
        body.push_str("</tbody></table></div>");
    }
    if !answer.next_page_token.is_empty() {
        let next = format!(
            "/executions?status={}&process={}&page={}",
            encode(&query.status),
            encode(&query.process),
            encode(&answer.next_page_token)
        );
        let _ = write!(body, "<p><a rel=\"next\" href=\"{}\">Next page</a></p>", escape(&next));
    }
    Ok(Html(html::page("Executions", "/executions", Some(&session), &body)))
}

/// One execution: its graph, the chosen step's details, the timeline, and
/// the forms its viewer may use; the script keeps them live.
pub(crate) async fn show(
    State(console): State<Shared>,
    Signed(session): Signed,
    Path(id): Path<String>,
) -> Result<Html<String>, Failure> {
    let state = state_of(&console, &session, &id).await?;
    let body = format!(
        "<div class=\"execution\" data-execution=\"{id}\" data-csrf=\"{csrf}\">\
         <p class=\"summary\" id=\"summary\" aria-live=\"polite\"></p>\
         <section aria-labelledby=\"graph-title\"><h2 id=\"graph-title\">Steps</h2>\
         <div id=\"graph\" class=\"graph\"></div></section>\
         <section id=\"actions\" aria-labelledby=\"actions-title\"><h2 id=\"actions-title\">Actions</h2><div id=\"action-forms\"></div></section>\
         <section aria-labelledby=\"step-title\"><h2 id=\"step-title\">Step</h2><div id=\"step\" class=\"step-details\">\
         <p>Choose a step in the graph.</p></div></section>\
         <section aria-labelledby=\"timeline-title\"><h2 id=\"timeline-title\">Timeline</h2><ol id=\"timeline\" class=\"timeline\" tabindex=\"0\"></ol></section>\
         </div>{data}",
        id = escape(&id),
        csrf = escape(&session.csrf),
        data = html::json_block("execution-state", &state),
    );
    Ok(Html(html::page(&format!("Execution {id}"), "/executions", Some(&session), &body)))
}

/// The execution as JSON with what its viewer may do: the script's source.
pub(crate) async fn state(State(console): State<Shared>, Signed(session): Signed, Path(id): Path<String>) -> Response {
    match state_of(&console, &session, &id).await {
        Ok(state) => Json(state).into_response(),
        Err(failure) => failure.json(),
    }
}

async fn state_of(console: &Shared, session: &Session, id: &str) -> Result<serde_json::Value, Failure> {
    let client = console.cluster.execution(session)?;
    let request = GetExecutionRequest { id: id.to_owned() };
    let execution = patiently(|| {
        let (mut client, request) = (client.clone(), request.clone());
        async move { client.get_execution(request).await }
    })
    .await?
    .into_inner()
    .execution
    .ok_or_else(|| Failure::BadRequest("the service answered without the execution".to_owned()))?;
    let decide = decidable_steps(console, session, &execution).await?;
    let intervene = may_intervene(session, &execution);
    Ok(serde_json::json!({
        "execution": to_json(&execution, "muster.execution.v1.Execution"),
        "decide": decide,
        "intervene": intervene,
        "viewer": session.who(),
    }))
}

/// The steps waiting for a decision that the viewer is one of the
/// approvers of, as the process names them (its `approvers`, else the
/// step's executor and monitors): the service decides again when asked.
async fn decidable_steps(console: &Shared, session: &Session, execution: &Execution) -> Result<Vec<String>, Failure> {
    let Some(agent_id) = session.agent_id() else { return Ok(Vec::new()) };
    let waiting: Vec<&str> = execution
        .steps
        .iter()
        .filter(|step| step.status() == StepStatus::WaitingApproval)
        .map(|step| step.step_id.as_str())
        .collect();
    if waiting.is_empty() {
        return Ok(Vec::new());
    }
    let request = GetProcessRequest { name: execution.process_name.clone(), version: execution.process_version };
    let source =
        console.cluster.execution(session)?.get_process(request).await?.into_inner().process.unwrap_or_default().source;
    let report = muster_format::validate_process(&source, &muster_format::Context::default());
    let Some(process) = report.process else { return Ok(Vec::new()) };
    Ok(process
        .steps
        .iter()
        .filter(|step| {
            waiting.contains(&step.id.as_str()) && step.approvers().iter().any(|approver| approver == agent_id)
        })
        .map(|step| step.id.clone())
        .collect())
}

/// Whether the viewer may intervene in the execution at all: operators,
/// its lead, and the monitors of its steps (the service decides each
/// intervention).
fn may_intervene(session: &Session, execution: &Execution) -> bool {
    let ended =
        matches!(execution.status(), ExecutionStatus::Completed | ExecutionStatus::Failed | ExecutionStatus::Cancelled);
    if ended {
        return false;
    }
    match session.agent_id() {
        None => true,
        Some(agent_id) => {
            execution.lead_agent_id == agent_id
                || execution.steps.iter().any(|step| {
                    step.roles.as_ref().is_some_and(|roles| roles.monitors.iter().any(|monitor| monitor == agent_id))
                })
        }
    }
}

/// The execution's events as they happen, as server-sent events: `step`
/// events carry a `StepEvent` as JSON; `end` says the watch is over.
pub(crate) async fn events(State(console): State<Shared>, Signed(session): Signed, Path(id): Path<String>) -> Response {
    let client = match console.cluster.execution(&session) {
        Ok(client) => client,
        Err(failure) => return failure.json(),
    };
    let mut client = client;
    let stream = match client.watch_execution(WatchExecutionRequest { execution_id: id, after_sequence: 0 }).await {
        Ok(answer) => answer.into_inner(),
        Err(status) => return Failure::from(status).json(),
    };
    let events = stream
        .map(|item| -> Result<Event, Infallible> {
            Ok(match item {
                Ok(answer) => match answer.event {
                    Some(event) => {
                        Event::default().event("step").data(to_json(&event, "muster.common.v1.StepEvent").to_string())
                    }
                    None => Event::default().comment("empty"),
                },
                Err(status) => Event::default().event("end").data(status.message()),
            })
        })
        .chain(tokio_stream::once(Ok(Event::default().event("end").data("the execution ended"))));
    // The stream ends at `None`: after the watch's last event, or when the
    // console stops (with an `end` the page understands).
    let stopping = tokio_stream::wrappers::WatchStream::from_changes(console.stopping.clone())
        .filter(|stopping| *stopping)
        .take(1)
        .map(|_| Some(Ok(Event::default().event("end").data("the console is stopping"))))
        .chain(tokio_stream::once(None));
    let events = events.map(Some).chain(tokio_stream::once(None)).merge(stopping).map_while(|event| event);
    Sse::new(events).keep_alive(KeepAlive::default()).into_response()
}

#[derive(Debug, serde::Deserialize)]
pub(crate) struct Decision {
    csrf: String,
    step_id: String,
    approved: String,
    #[serde(default)]
    comment: String,
}

/// Approves or rejects a step waiting for a decision.
pub(crate) async fn decide(
    State(console): State<Shared>,
    Signed(session): Signed,
    Path(id): Path<String>,
    Form(form): Form<Decision>,
) -> Result<Redirect, Failure> {
    check_csrf(&session, &form.csrf)?;
    let request = SubmitApprovalRequest {
        execution_id: id.clone(),
        step_id: form.step_id,
        approved: form.approved == "true",
        comment: form.comment,
    };
    console.cluster.execution(&session)?.submit_approval(request).await?;
    Ok(Redirect::to(&format!("/executions/{}", encode(&id))))
}

#[derive(Debug, serde::Deserialize)]
pub(crate) struct Intervention {
    csrf: String,
    #[serde(default)]
    step_id: String,
    action: String,
    #[serde(default)]
    target_agent_id: String,
    #[serde(default)]
    output: String,
    #[serde(default)]
    reason: String,
}

/// Pauses, resumes, retries, reassigns, overrides or cancels.
pub(crate) async fn intervene(
    State(console): State<Shared>,
    Signed(session): Signed,
    Path(id): Path<String>,
    Form(form): Form<Intervention>,
) -> Result<Redirect, Failure> {
    check_csrf(&session, &form.csrf)?;
    let action = InterventionAction::from_str_name(&form.action)
        .filter(|action| *action != InterventionAction::Unspecified)
        .ok_or_else(|| Failure::BadRequest(format!("'{}' is not an intervention", form.action)))?;
    let output = if action == InterventionAction::OverrideOutput {
        let value: serde_json::Value = serde_json::from_str(&form.output)
            .map_err(|error| Failure::BadRequest(format!("the output is not JSON: {error}")))?;
        Some(muster_client::json::from_json(value))
    } else {
        None
    };
    let request = InterveneRequest {
        execution_id: id.clone(),
        step_id: form.step_id,
        action: action as i32,
        target_agent_id: form.target_agent_id,
        output,
        reason: form.reason,
    };
    console.cluster.execution(&session)?.intervene(request).await?;
    Ok(Redirect::to(&format!("/executions/{}", encode(&id))))
}

/// `EXECUTION_STATUS_RUNNING` → `running`.
fn status_word(name: &str) -> String {
    name.rsplit_once("STATUS_").map_or(name, |(_, word)| word).to_ascii_lowercase()
}

fn when(timestamp: Option<&prost_types::Timestamp>) -> String {
    timestamp.map_or_else(
        || "–".to_owned(),
        |timestamp| {
            let text = timestamp.to_string();
            text.split_once('.').map_or(text.clone(), |(whole, _)| format!("{whole}Z"))
        },
    )
}

/// `text` as a URL query value.
pub(crate) fn encode(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~".contains(&byte) {
            encoded.push(byte as char);
        } else {
            let _ = write!(encoded, "%{byte:02X}");
        }
    }
    encoded
}
