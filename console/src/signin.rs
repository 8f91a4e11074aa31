//! Signing in with a token and out again. The cluster says who a token
//! belongs to: a token that may list the workers is an operator's; an
//! agent's token is refused that, and the roster names its agent.

use axum::{
    Form,
    extract::State,
    http::header,
    response::{Html, IntoResponse, Redirect, Response},
};
use muster_proto::{execution::v1::ListWorkersRequest, roster::v1::AuthenticateRequest};

use crate::{
    Shared,
    cluster::{Failure, Signed, check_csrf},
    html,
    session::{Identity, Session},
};

/// The sign-in form.
pub(crate) async fn form(session: Option<Signed>) -> Response {
    if session.is_some() {
        return Redirect::to("/executions").into_response();
    }
    Html(page(None)).into_response()
}

fn page(problem: Option<&str>) -> String {
    let problem = problem.map(|text| html::notice("error", text)).unwrap_or_default();
    let body = format!(
        "{problem}<form class=\"signin\" method=\"post\" action=\"/signin\">\
         <p>Sign in with an operator's token or an agent's roster token. Everything you do here is done with it, \
         and the cluster decides what it allows.</p>\
         <label for=\"token\">Token</label> <input id=\"token\" name=\"token\" type=\"password\" autocomplete=\"off\" required> \
         <button type=\"submit\">Sign in</button></form>"
    );
    html::page("Sign in", "", None, &body)
}

/// Longer tokens are nobody's.
const MAX_TOKEN_BYTES: usize = 4096;

#[derive(serde::Deserialize)]
pub(crate) struct SignIn {
    token: String,
}

/// Signs in with the token of the form.
pub(crate) async fn sign_in(State(console): State<Shared>, Form(form): Form<SignIn>) -> Response {
    let token = form.token.trim().to_owned();
    if token.is_empty() {
        return Html(page(Some("give a token"))).into_response();
    }
    if token.len() > MAX_TOKEN_BYTES {
        return Html(page(Some("the cluster does not know this token"))).into_response();
    }
    let probe = Session::new(token.clone(), Identity::Operator);
    let identity = match identify(&console, &probe).await {
        Ok(identity) => identity,
        Err(Failure::SignIn) => return Html(page(Some("the cluster does not know this token"))).into_response(),
        Err(failure) => return failure.into_response(),
    };
    tracing::info!(who = %Session::new(String::new(), identity.clone()).who(), "signed in");
    let session = Session::new(token, identity);
    let cookie = console.set_cookie(&console.keys.seal(&session));
    ([(header::SET_COOKIE, cookie)], Redirect::to("/executions")).into_response()
}

async fn identify(console: &Shared, probe: &Session) -> Result<Identity, Failure> {
    let listed = console
        .cluster
        .execution(probe)?
        .list_workers(ListWorkersRequest { page_size: 1, page_token: String::new() })
        .await;
    match listed {
        Ok(_) => Ok(Identity::Operator),
        Err(status) if status.code() == tonic::Code::PermissionDenied => {
            let answer =
                console.cluster.roster(probe)?.authenticate(AuthenticateRequest { token: probe.token.clone() }).await?;
            let agent = answer.into_inner().agent.ok_or(Failure::SignIn)?;
            Ok(Identity::Agent(agent.id))
        }
        Err(status) => Err(status.into()),
    }
}

#[derive(serde::Deserialize)]
pub(crate) struct SignOut {
    csrf: String,
}

/// Ends the session.
pub(crate) async fn sign_out(
    State(console): State<Shared>,
    Signed(session): Signed,
    Form(form): Form<SignOut>,
) -> Response {
    if let Err(failure) = check_csrf(&session, &form.csrf) {
        return failure.into_response();
    }
    ([(header::SET_COOKIE, console.set_cookie(""))], Redirect::to("/signin")).into_response()
}
