//! The process editor: the YAML beside its role matrix, both editing one
//! document. The matrix is read from the text ([`muster_format::step_roles`])
//! and a matrix edit rewrites only the step's `roles` block
//! ([`muster_format::set_step_roles`]), so comments and everything else
//! survive; the validator's diagnostics come back as one types, each at its
//! line and column. Publishing and starting go to the execution service.

use std::fmt::Write as _;

use axum::{
    Form, Json,
    extract::{Query, State},
    http::HeaderMap,
    response::{Html, IntoResponse, Redirect, Response},
};
use muster_proto::{
    execution::v1::{GetProcessRequest, PublishProcessRequest, StartExecutionRequest},
    roster::v1::ListAgentsRequest,
    validator::v1::ValidateProcessRequest,
};

use crate::{
    Shared,
    cluster::{Failure, Signed, check_csrf},
    executions::encode,
    html::{self, escape},
    session::Session,
};

/// Largest process document the editor sends on (the service's own limit
/// is larger; a person's editor need not be).
const MAX_SOURCE_BYTES: usize = 1024 * 1024;

/// Most agents offered in the matrix's choices.
const MAX_AGENTS: usize = 2000;

/// What a new document starts as.
const STARTER: &str = "\
# A new process: steps run when what they depend on has completed.
name: my-process
description: What this process is for.
steps:
  - id: first
    name: First step
    type: agent_task
    message: What the executor should do
";

#[derive(Debug, Default, serde::Deserialize)]
pub(crate) struct EditorQuery {
    #[serde(default)]
    process: String,
}

/// The editor, with the latest version of `?process=` or a starter document.
pub(crate) async fn page(
    State(console): State<Shared>,
    Signed(session): Signed,
    Query(query): Query<EditorQuery>,
) -> Result<Html<String>, Failure> {
    let source = if query.process.trim().is_empty() {
        STARTER.to_owned()
    } else {
        let request = GetProcessRequest { name: query.process.trim().to_owned(), version: 0 };
        console.cluster.execution(&session)?.get_process(request).await?.into_inner().process.unwrap_or_default().source
    };
    let agents = agent_ids(&console, &session).await?;
    let mut body = String::new();
    let _ = write!(
        body,
        "<div class=\"editor\" data-csrf=\"{csrf}\">\
         <section class=\"yaml\" aria-labelledby=\"yaml-title\"><h2 id=\"yaml-title\">YAML</h2>\
         <form id=\"publish\" method=\"post\" action=\"/editor/publish\">{field}\
         <div class=\"code\"><ol id=\"gutter\" class=\"gutter\" aria-hidden=\"true\"></ol>\
         <textarea id=\"source\" name=\"source\" spellcheck=\"false\" aria-label=\"Process YAML\" aria-describedby=\"diagnostics-title\">{source}</textarea></div>\
         <p class=\"buttons\"><button type=\"submit\">Publish</button> <button type=\"submit\" name=\"start\" value=\"true\">Publish and start</button></p>\
         </form>\
         <h3 id=\"diagnostics-title\">Diagnostics</h3><ul id=\"diagnostics\" class=\"diagnostics\" aria-live=\"polite\"></ul></section>\
         <section class=\"matrix\" aria-labelledby=\"matrix-title\"><h2 id=\"matrix-title\">Role matrix</h2>\
         <p id=\"matrix-note\" class=\"note\" aria-live=\"polite\"></p>\
         <table id=\"matrix\"><caption>Who executes, monitors and is informed of each step</caption><thead><tr>\
         <th scope=\"col\">Step</th><th scope=\"col\">Executor</th><th scope=\"col\">Monitors</th><th scope=\"col\">Informed</th>\
         </tr></thead><tbody></tbody></table></section></div>{agents}",
        csrf = escape(&session.csrf),
        field = html::csrf_field(&session),
        source = escape(&source),
        agents = html::json_block("agents", &serde_json::json!(agents)),
    );
    Ok(Html(html::page("Process editor", "/editor", Some(&session), &body)))
}

/// The roster's agent ids, for the matrix's choices.
async fn agent_ids(console: &Shared, session: &Session) -> Result<Vec<String>, Failure> {
    let mut roster = console.cluster.roster(session)?;
    let mut ids = Vec::new();
    let mut page_token = String::new();
    loop {
        let request = ListAgentsRequest { page_size: 1000, page_token: page_token.clone(), ..Default::default() };
        let answer = roster.list_agents(request).await?.into_inner();
        ids.extend(answer.agents.into_iter().map(|agent| agent.id));
        if answer.next_page_token.is_empty() || ids.len() >= MAX_AGENTS {
            break;
        }
        page_token = answer.next_page_token;
    }
    ids.sort();
    Ok(ids)
}

/// The script's calls carry the CSRF token in this header.
fn check_header(session: &Session, headers: &HeaderMap) -> Result<(), Failure> {
    let sent = headers.get("x-csrf-token").and_then(|value| value.to_str().ok()).unwrap_or_default();
    check_csrf(session, sent)
}

fn checked_source(source: &str) -> Result<(), Failure> {
    if source.len() > MAX_SOURCE_BYTES {
        return Err(Failure::BadRequest(format!(
            "the document is {} bytes, more than the editor's {MAX_SOURCE_BYTES}",
            source.len()
        )));
    }
    Ok(())
}

#[derive(Debug, serde::Deserialize)]
pub(crate) struct Analyse {
    source: String,
}

/// The validator's diagnostics of the document and its role matrix.
pub(crate) async fn analyse(
    State(console): State<Shared>,
    Signed(session): Signed,
    headers: HeaderMap,
    Json(request): Json<Analyse>,
) -> Response {
    let answer = async {
        check_header(&session, &headers)?;
        checked_source(&request.source)?;
        let validation = ValidateProcessRequest { source: request.source.clone(), ..Default::default() };
        let report = console.cluster.validator(&session)?.validate_process(validation).await?.into_inner();
        let diagnostics: Vec<serde_json::Value> = report
            .diagnostics
            .iter()
            .map(|diagnostic| {
                serde_json::json!({
                    "severity": if diagnostic.severity() == muster_proto::common::v1::Severity::Error { "error" } else { "warning" },
                    "code": diagnostic.code,
                    "message": diagnostic.message,
                    "path": diagnostic.path,
                    "line": diagnostic.line,
                    "column": diagnostic.column,
                })
            })
            .collect();
        let (rows, matrix_problem) = match muster_format::step_roles(&request.source) {
            Ok(rows) => (Some(rows), None),
            Err(problem) => (None, Some(problem)),
        };
        Ok::<_, Failure>(serde_json::json!({
            "valid": report.valid,
            "diagnostics": diagnostics,
            "rows": rows,
            "matrix_problem": matrix_problem,
        }))
    };
    match answer.await {
        Ok(answer) => Json(answer).into_response(),
        Err(failure) => failure.json(),
    }
}

#[derive(Debug, serde::Deserialize)]
pub(crate) struct RolesEdit {
    source: String,
    step_id: String,
    #[serde(default)]
    executor: String,
    #[serde(default)]
    monitors: Vec<String>,
    #[serde(default)]
    informed: Vec<String>,
}

/// The document with one step's roles rewritten from the matrix.
pub(crate) async fn roles(Signed(session): Signed, headers: HeaderMap, Json(edit): Json<RolesEdit>) -> Response {
    let answer = (|| {
        check_header(&session, &headers)?;
        checked_source(&edit.source)?;
        let roles =
            muster_format::StepRoles { executor: edit.executor, monitors: edit.monitors, informed: edit.informed };
        muster_format::set_step_roles(&edit.source, &edit.step_id, &roles).map_err(Failure::BadRequest)
    })();
    match answer {
        Ok(source) => Json(serde_json::json!({ "source": source })).into_response(),
        Err(failure) => failure.json(),
    }
}

#[derive(Debug, serde::Deserialize)]
pub(crate) struct Publish {
    csrf: String,
    source: String,
    #[serde(default)]
    start: String,
}

/// Publishes the document as the process's next version, and starts it
/// when asked.
pub(crate) async fn publish(
    State(console): State<Shared>,
    Signed(session): Signed,
    Form(form): Form<Publish>,
) -> Result<Response, Failure> {
    check_csrf(&session, &form.csrf)?;
    checked_source(&form.source)?;
    let mut execution = console.cluster.execution(&session)?;
    let request = PublishProcessRequest { source: form.source, file_name: "console.yaml".to_owned() };
    let process = execution.publish_process(request).await?.into_inner().process.unwrap_or_default();
    if form.start != "true" {
        return Ok(Redirect::to(&format!("/editor?process={}", encode(&process.name))).into_response());
    }
    let request = StartExecutionRequest {
        process_name: process.name.clone(),
        process_version: process.version,
        ..Default::default()
    };
    let started = execution.start_execution(request).await?.into_inner().execution.unwrap_or_default();
    Ok(Redirect::to(&format!("/executions/{}", encode(&started.id))).into_response())
}
