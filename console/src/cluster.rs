//! The console's side of the cluster: channels to the services, clients
//! that carry the signed-in caller's token, the session every page needs,
//! and how a refusal of the cluster becomes a page.

use axum::{
    extract::FromRequestParts,
    http::{StatusCode, request::Parts},
    response::{Html, IntoResponse, Redirect, Response},
};
use muster_client::{
    auth::{AuthChannel, Credentials, with_credentials},
    balance::Balanced,
};
use muster_proto::{
    execution::v1::execution_service_client::ExecutionServiceClient,
    roster::v1::roster_service_client::RosterServiceClient,
    validator::v1::validator_service_client::ValidatorServiceClient,
};

use crate::{Config, html, session::Session};

/// Largest answer the console reads from a service (a 1,000-step execution
/// with its outputs fits).
const MAX_ANSWER_BYTES: usize = 32 * 1024 * 1024;

/// Channels to the services the console calls.
#[derive(Debug)]
pub(crate) struct Cluster {
    execution: Balanced,
    roster: Balanced,
    validator: Balanced,
}

impl Cluster {
    /// Lazily connecting channels to the services `config` names.
    pub(crate) fn connect(config: &Config) -> muster_client::Result<Self> {
        let tls = muster_client::tls::ClientTls::load(&config.tls)?;
        Ok(Self {
            execution: Balanced::connect(&config.execution_url, Some(&tls))?,
            roster: Balanced::connect(&config.roster_url, Some(&tls))?,
            validator: Balanced::connect(&config.validator_url, Some(&tls))?,
        })
    }

    fn channel(channel: &Balanced, session: &Session) -> Result<AuthChannel, Failure> {
        let credentials = Credentials::bearer(&session.token).map_err(|_| Failure::SignIn)?;
        Ok(with_credentials(channel.clone(), credentials))
    }

    /// The execution service, as `session`'s caller.
    pub(crate) fn execution(&self, session: &Session) -> Result<ExecutionServiceClient<AuthChannel>, Failure> {
        Ok(ExecutionServiceClient::new(Self::channel(&self.execution, session)?)
            .max_decoding_message_size(MAX_ANSWER_BYTES))
    }

    /// The roster, as `session`'s caller.
    pub(crate) fn roster(&self, session: &Session) -> Result<RosterServiceClient<AuthChannel>, Failure> {
        Ok(RosterServiceClient::new(Self::channel(&self.roster, session)?).max_decoding_message_size(MAX_ANSWER_BYTES))
    }

    /// The validator, as `session`'s caller.
    pub(crate) fn validator(&self, session: &Session) -> Result<ValidatorServiceClient<AuthChannel>, Failure> {
        Ok(ValidatorServiceClient::new(Self::channel(&self.validator, session)?))
    }
}

/// Calls again, after a pause growing from 50 ms (about 1.5 s in all), a
/// read the service shed: the cluster gives each caller a fair share of its
/// reads, and a page's own calls (the page, its state, its live stream)
/// come as one caller.
pub(crate) async fn patiently<T, Call, Answer>(mut call: Call) -> Result<T, tonic::Status>
where
    Call: FnMut() -> Answer,
    Answer: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let mut pause = std::time::Duration::from_millis(50);
    for _ in 0..5 {
        match call().await {
            Err(status) if status.code() == tonic::Code::ResourceExhausted => {
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
            answer => return answer,
        }
    }
    call().await
}

/// Why a page cannot be shown.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Nobody is signed in, or the session's token no longer works.
    SignIn,
    /// A form or call without the session's CSRF token.
    Forgery,
    /// The request itself is wrong.
    BadRequest(String),
    /// The cluster refused or failed.
    Refused(tonic::Status),
}

impl From<tonic::Status> for Failure {
    fn from(status: tonic::Status) -> Self {
        if status.code() == tonic::Code::Unauthenticated { Self::SignIn } else { Self::Refused(status) }
    }
}

impl Failure {
    fn status_and_text(&self) -> (StatusCode, String) {
        match self {
            Self::SignIn => (StatusCode::UNAUTHORIZED, "sign in first".to_owned()),
            Self::Forgery => (StatusCode::FORBIDDEN, "the form is stale or was not sent by this console".to_owned()),
            Self::BadRequest(text) => (StatusCode::BAD_REQUEST, text.clone()),
            Self::Refused(status) => {
                let code = match status.code() {
                    tonic::Code::PermissionDenied => StatusCode::FORBIDDEN,
                    tonic::Code::NotFound => StatusCode::NOT_FOUND,
                    tonic::Code::InvalidArgument | tonic::Code::OutOfRange => StatusCode::BAD_REQUEST,
                    tonic::Code::FailedPrecondition | tonic::Code::AlreadyExists | tonic::Code::Aborted => {
                        StatusCode::CONFLICT
                    }
                    tonic::Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
                    _ => StatusCode::BAD_GATEWAY,
                };
                (code, format!("{:?}: {}", status.code(), status.message()))
            }
        }
    }

    /// The failure as JSON, for the page's script.
    pub(crate) fn json(self) -> Response {
        if matches!(self, Self::SignIn) {
            return (StatusCode::UNAUTHORIZED, axum::Json(serde_json::json!({"error": "sign in first"})))
                .into_response();
        }
        let (code, text) = self.status_and_text();
        (code, axum::Json(serde_json::json!({"error": text}))).into_response()
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        if matches!(self, Self::SignIn) {
            return Redirect::to("/signin").into_response();
        }
        let (code, text) = self.status_and_text();
        let body = format!("{}<p><a href=\"/executions\">Executions</a></p>", html::notice("error", &text));
        (code, Html(html::page("Refused", "", None, &body))).into_response()
    }
}

/// The signed-in session of a request; without one, the page sends the
/// browser to sign in.
pub(crate) struct Signed(pub Session);

impl<S: Send + Sync> FromRequestParts<S> for Signed {
    type Rejection = Failure;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Failure> {
        parts.extensions.get::<Session>().cloned().map(Signed).ok_or(Failure::SignIn)
    }
}

impl<S: Send + Sync> axum::extract::OptionalFromRequestParts<S> for Signed {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Option<Self>, Self::Rejection> {
        Ok(parts.extensions.get::<Session>().cloned().map(Signed))
    }
}

/// Checks a change's CSRF token against the session's.
pub(crate) fn check_csrf(session: &Session, sent: &str) -> Result<(), Failure> {
    if crate::session::same_secret(&session.csrf, sent) { Ok(()) } else { Err(Failure::Forgery) }
}

/// `message`, of the protobuf type `full_name`, in the canonical JSON
/// mapping with the `.proto` field names and every field present.
pub(crate) fn to_json(message: &impl prost::Message, full_name: &str) -> serde_json::Value {
    muster_client::json::message_to_json(message, full_name, true).unwrap_or_default()
}
