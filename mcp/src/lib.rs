//! `muster mcp`: the cluster as a Model Context Protocol server acting as
//! one agent, so that any MCP client (a coding assistant, an agent runtime)
//! can be a member of a team.
//!
//! - **Tools**: the cluster's tools of the agent catalogue (roster,
//!   delegation, roles, inboxes, memory), sessions (`start_session`,
//!   `set_lead`), notifications (`list_notifications`,
//!   `acknowledge_notifications`), and the work loop: `next_assignment`
//!   takes the agent's next step as a worker receives it (the server holds
//!   it as a worker does: heartbeats, lease), `complete_step`, `fail_step`
//!   and `delegate_step` end it, `invoke_tool` calls a tool another worker
//!   provides ([`tools`]).
//! - **Resources**: the agent's notifications (`muster://notifications`,
//!   paged), its role, its rendered system prompt and the organisation's
//!   roster; a subscription to the notifications hears of each new one as
//!   the notifier delivers it ([`server`]).
//! - **Transports**: stdio ([`serve_stdio`], one agent, the token given at
//!   start; the client exiting ends the server and its steps go back to the
//!   cluster) and streamable HTTP ([`serve_http`], the agent of each
//!   request's `Authorization: Bearer` token; an agent idle past the idle
//!   timeout is let go and its steps go back to the cluster).
//!
//! Every call is made with the agent's own token: the cluster's authority
//! decides, and the server has no powers of its own.

use std::{sync::Arc, time::Duration};

use axum::{
    extract::{Request, State},
    middleware::Next,
    response::{IntoResponse as _, Response},
};
use rmcp::{
    ServiceExt as _,
    transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
    },
};

mod member;
pub mod server;
pub mod tools;

use member::{Member, Members};
use server::{Acting, McpServer};

/// Where the cluster is, and how long an HTTP client may stay silent.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The execution service.
    pub execution_url: String,
    /// The roster.
    pub roster_url: String,
    /// The notifier.
    pub notifier_url: String,
    /// Over HTTP, how long an agent may make no call before it is let go
    /// (its worker session closed, its steps given back).
    pub idle_timeout: Duration,
    /// Over HTTP, the `Host` names requests may carry (besides loopback
    /// names), against DNS rebinding; empty allows only loopback names.
    pub allowed_hosts: Vec<String>,
}

/// Serves one agent (the token's) over stdin and stdout until the client
/// closes stdin.
pub async fn serve_stdio(settings: Settings, token: &str) -> anyhow::Result<()> {
    let member = Arc::new(Member::sign_in(Arc::new(settings), token).await?);
    let running = McpServer::new(Acting::One(member)).serve(rmcp::transport::stdio()).await?;
    running.waiting().await?;
    Ok(())
}

/// Serves MCP over streamable HTTP at `/mcp` on `listener` until `shutdown`
/// resolves: each request acts as the agent its bearer token names; a
/// request without one, or with one the roster refuses, is answered 401.
pub async fn serve_http(
    settings: Settings,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let settings = Arc::new(settings);
    let members = Arc::new(Members::default());
    let stop = tokio_util::sync::CancellationToken::new();
    let mut hosts = vec!["localhost".to_owned(), "127.0.0.1".to_owned(), "::1".to_owned()];
    hosts.extend(settings.allowed_hosts.iter().cloned());
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(hosts)
        .with_sse_keep_alive(Some(Duration::from_secs(15)))
        .with_cancellation_token(stop.child_token());
    let service = StreamableHttpService::new(
        || Ok(McpServer::new(Acting::PerRequest)),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let router = axum::Router::new()
        .nest_service("/mcp", service)
        .layer(axum::middleware::from_fn_with_state((settings.clone(), members.clone()), sign_in));
    let expiry = {
        let members = members.clone();
        let timeout = settings.idle_timeout;
        tokio::spawn(async move {
            let mut every =
                tokio::time::interval((timeout / 4).clamp(Duration::from_millis(100), Duration::from_secs(10)));
            loop {
                every.tick().await;
                members.expire(timeout).await;
            }
        })
    };
    let served = axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            shutdown.await;
            stop.cancel();
        })
        .await;
    expiry.abort();
    Ok(served?)
}

/// Puts the agent of the request's bearer token into its extensions, or
/// answers 401 saying why.
async fn sign_in(
    State((settings, members)): State<(Arc<Settings>, Arc<Members>)>,
    mut request: Request,
    next: Next,
) -> Response {
    let token = request
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|token| !token.is_empty() && token.len() <= 4096)
        .map(str::to_owned);
    let refuse = |why: String| {
        (http::StatusCode::UNAUTHORIZED, [(http::header::WWW_AUTHENTICATE, "Bearer")], why).into_response()
    };
    let Some(token) = token else {
        return refuse(
            "muster mcp acts as the agent whose roster token the request carries: send `Authorization: Bearer TOKEN`"
                .to_owned(),
        );
    };
    match members.get(&settings, &token).await {
        Ok(member) => {
            request.extensions_mut().insert(member);
            next.run(request).await
        }
        Err(error) => refuse(format!("{error:#}")),
    }
}
