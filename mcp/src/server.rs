//! The MCP handler: tools, resources and subscriptions for one agent (over
//! stdio) or for the agent of each request's token (over HTTP).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError, atomic::Ordering},
};

use muster_agent::catalogue::ToolError;
use muster_proto::{
    notifier::v1::{ListNotificationsRequest, SubscribeRequest, subscribe_response},
    roster::v1::{GetAgentRequest, GetOrganizationRosterRequest, GetRoleDefinitionRequest, RenderSystemPromptRequest},
};
use rmcp::{
    ErrorData as McpError, RoleServer, ServerHandler,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, Implementation, ListResourceTemplatesResult,
        ListResourcesResult, ListToolsResult, PaginatedRequestParams, ReadResourceRequestParams, ReadResourceResponse,
        ReadResourceResult, Resource, ResourceContents, ResourceTemplate, ResourceUpdatedNotificationParam,
        ServerCapabilities, ServerConfig, SubscribeRequestParams, SubscriptionFilter, Tool, UnsubscribeRequestParams,
    },
    service::{RequestContext, SubscriptionContext},
};
use serde_json::{Value, json};
use tokio_stream::StreamExt as _;

use crate::member::Member;

/// The agent's notifications (`?after=CURSOR` for those after a cursor).
const NOTIFICATIONS: &str = "muster://notifications";
const ROLE: &str = "muster://role";
const PROMPT: &str = "muster://prompt";
const ROSTER: &str = "muster://roster";
/// Notifications one read of the resource gives, most.
const NOTIFICATIONS_PAGE: u32 = 100;
/// Subscriptions one agent may hold open at once.
const MAX_SUBSCRIPTIONS: usize = 8;

/// Tells the handler who it acts for.
#[derive(Clone)]
pub(crate) enum Acting {
    /// One agent, for the process's life (stdio).
    One(Arc<Member>),
    /// The agent each HTTP request's token names (put in the request's
    /// extensions by the server's sign-in layer).
    PerRequest,
}

/// The MCP server of `muster mcp`.
#[derive(Clone)]
pub(crate) struct McpServer {
    acting: Acting,
    /// Legacy `resources/subscribe` watches of this session, by URI.
    watches: Arc<Mutex<HashMap<String, tokio::task::AbortHandle>>>,
}

impl McpServer {
    pub(crate) fn new(acting: Acting) -> Self {
        Self { acting, watches: Arc::default() }
    }

    fn member(&self, context: &RequestContext<RoleServer>) -> Result<Arc<Member>, McpError> {
        match &self.acting {
            Acting::One(member) => Ok(member.clone()),
            Acting::PerRequest => context
                .extensions
                .get::<http::request::Parts>()
                .and_then(|parts| parts.extensions.get::<Arc<Member>>())
                .cloned()
                .ok_or_else(|| McpError::invalid_request("the request carries no agent's token", None)),
        }
    }
}

impl Drop for McpServer {
    fn drop(&mut self) {
        if Arc::strong_count(&self.watches) == 1 {
            for watch in self.watches.lock().unwrap_or_else(PoisonError::into_inner).values() {
                watch.abort();
            }
        }
    }
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        let capabilities =
            ServerCapabilities::builder().enable_tools().enable_resources().enable_resources_subscribe().build();
        ServerConfig::new(capabilities)
            .with_server_info(Implementation::new("muster", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "You are an agent of a muster cluster. Take your steps with next_assignment and end each with \
                 complete_step, fail_step or delegate_step; the cluster's authority decides every call. Your \
                 notifications are the resource muster://notifications.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let tools = crate::tools::TOOLS
            .iter()
            .map(|tool| Tool::new(tool.name, tool.description.clone(), tool.schema.clone()))
            .collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        if !crate::tools::TOOLS.iter().any(|tool| tool.name == request.name) {
            return Err(McpError::invalid_params(format!("no tool named '{}'", request.name), None));
        }
        let member = self.member(&context)?;
        let arguments = request.arguments.map_or_else(|| json!({}), Value::Object);
        let call_id = uuid::Uuid::new_v4().to_string();
        let result = crate::tools::call(&member, &request.name, &call_id, arguments).await;
        // A call may wait a minute (next_assignment): idle from its end.
        member.touch();
        Ok(match result {
            Ok(value) => CallToolResult::structured(value),
            Err(error) => CallToolResult::structured_error(error.to_json()),
        }
        .into())
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let resource = |uri: &str, name: &str, description: &str, mime: &str| {
            Resource::new(uri, name).with_description(description).with_mime_type(mime)
        };
        Ok(ListResourcesResult::with_all_items(vec![
            resource(
                NOTIFICATIONS,
                "notifications",
                "Your notifications, oldest first, 100 at a time (`?after=CURSOR` for the next page)",
                "application/json",
            ),
            resource(ROLE, "role", "Your role's definition", "application/json"),
            resource(PROMPT, "system prompt", "Your rendered system prompt", "text/plain"),
            resource(ROSTER, "roster", "The organisation's roster as you see it", "application/json"),
        ]))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        let template =
            ResourceTemplate::new(format!("{NOTIFICATIONS}?after={{cursor}}"), "notifications after a cursor")
                .with_description("Your notifications with a cursor greater than `cursor`, 100 at a time")
                .with_mime_type("application/json");
        Ok(ListResourceTemplatesResult::with_all_items(vec![template]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let member = self.member(&context)?;
        let uri = request.uri.as_str();
        let refused = |error: tonic::Status| McpError::invalid_request(ToolError::from(error).message, None);
        let (base, query) = uri.split_once('?').map_or((uri, None), |(base, query)| (base, Some(query)));
        if query.is_some() && base != NOTIFICATIONS {
            return Err(McpError::resource_not_found(format!("no resource {uri}"), None));
        }
        let (text, mime) = match base {
            NOTIFICATIONS => {
                let after = match query {
                    None => 0,
                    Some(query) => query
                        .strip_prefix("after=")
                        .and_then(|cursor| cursor.parse::<u64>().ok())
                        .ok_or_else(|| McpError::invalid_params(format!("{uri}: the query is `after=CURSOR`"), None))?,
                };
                let request = ListNotificationsRequest {
                    agent_id: member.agent_id.clone(),
                    after_cursor: after,
                    limit: NOTIFICATIONS_PAGE,
                };
                let page = member.notifier.clone().list_notifications(request).await.map_err(refused)?.into_inner();
                let next = (page.notifications.len() == NOTIFICATIONS_PAGE as usize)
                    .then(|| page.notifications.last().map(|last| format!("{NOTIFICATIONS}?after={}", last.cursor)))
                    .flatten();
                let mut body = muster_agent::wire_json(&page, "muster.notifier.v1.ListNotificationsResponse");
                body["next"] = next.map_or(Value::Null, Value::String);
                (body.to_string(), "application/json")
            }
            ROLE => {
                let mut roster = member.roster.clone();
                let agent = roster.get_agent(GetAgentRequest { id: member.agent_id.clone() }).await.map_err(refused)?;
                let role = agent.into_inner().agent.map(|agent| agent.role).unwrap_or_default();
                if role.is_empty() {
                    (json!({"role": null}).to_string(), "application/json")
                } else {
                    let definition =
                        roster.get_role_definition(GetRoleDefinitionRequest { name: role }).await.map_err(refused)?;
                    (
                        muster_agent::wire_json(&definition.into_inner(), "muster.roster.v1.GetRoleDefinitionResponse")
                            .to_string(),
                        "application/json",
                    )
                }
            }
            PROMPT => {
                let request = RenderSystemPromptRequest { agent_id: member.agent_id.clone() };
                let prompt = member.roster.clone().render_system_prompt(request).await.map_err(refused)?;
                (prompt.into_inner().system_prompt, "text/plain")
            }
            ROSTER => {
                let request = GetOrganizationRosterRequest { agent_id: member.agent_id.clone(), ..Default::default() };
                let roster = member.roster.clone().get_organization_roster(request).await.map_err(refused)?;
                (
                    muster_agent::wire_json(&roster.into_inner(), "muster.roster.v1.GetOrganizationRosterResponse")
                        .to_string(),
                    "application/json",
                )
            }
            _ => return Err(McpError::resource_not_found(format!("no resource {uri}"), None)),
        };
        let contents = ResourceContents::text(text, uri).with_mime_type(mime);
        Ok(ReadResourceResult::new(vec![contents]).into())
    }

    fn accepted_subscription_filter(&self, requested: &SubscriptionFilter) -> Option<SubscriptionFilter> {
        let uris = requested.resource_subscriptions.as_ref()?;
        let accepted: Vec<String> = uris.iter().filter(|uri| *uri == NOTIFICATIONS).cloned().collect();
        Some(SubscriptionFilter::builder().resource_subscriptions(accepted).build())
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), McpError> {
        let member = self.member(context.request_context())?;
        let subscribed = context
            .accepted()
            .resource_subscriptions
            .as_ref()
            .is_some_and(|uris| uris.iter().any(|uri| uri == NOTIFICATIONS));
        if !subscribed {
            context.cancelled().await;
            return Ok(());
        }
        let _slot = Slot::take(&member)?;
        let sink = context.sink().clone();
        tokio::select! {
            () = context.cancelled() => Ok(()),
            ended = watch(&member, || {
                let sink = sink.clone();
                async move { sink.notify_resource_updated(NOTIFICATIONS).await.is_ok() }
            }) => ended,
        }
    }

    #[allow(deprecated)]
    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        if request.uri != NOTIFICATIONS {
            return Err(McpError::invalid_params(
                format!("{}: only {NOTIFICATIONS} can be subscribed to", request.uri),
                None,
            ));
        }
        let member = self.member(&context)?;
        let slot = Slot::take(&member)?;
        let peer = context.peer.clone();
        let task = tokio::spawn(async move {
            let _slot = slot;
            let _ = watch(&member, || {
                let peer = peer.clone();
                async move {
                    peer.notify_resource_updated(ResourceUpdatedNotificationParam::new(NOTIFICATIONS)).await.is_ok()
                }
            })
            .await;
        });
        if let Some(earlier) =
            self.watches.lock().unwrap_or_else(PoisonError::into_inner).insert(request.uri, task.abort_handle())
        {
            earlier.abort();
        }
        Ok(())
    }

    #[allow(deprecated)]
    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        if let Some(watch) = self.watches.lock().unwrap_or_else(PoisonError::into_inner).remove(&request.uri) {
            watch.abort();
        }
        Ok(())
    }
}

/// One of an agent's subscription slots, given back when dropped.
struct Slot(Arc<Member>);

impl Slot {
    fn take(member: &Arc<Member>) -> Result<Self, McpError> {
        if member.subscriptions.fetch_add(1, Ordering::SeqCst) >= MAX_SUBSCRIPTIONS {
            member.subscriptions.fetch_sub(1, Ordering::SeqCst);
            return Err(McpError::invalid_request(
                format!("an agent may hold {MAX_SUBSCRIPTIONS} subscriptions at once; end one first"),
                None,
            ));
        }
        Ok(Self(member.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.subscriptions.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Follows the agent's notifications as the notifier delivers them live,
/// calling `updated` for each (from the first not yet acknowledged); ends
/// when `updated` says the client is gone, or with the notifier's refusal.
async fn watch<F, Fut>(member: &Member, updated: F) -> Result<(), McpError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let refused = |error: tonic::Status| McpError::internal_error(format!("the notifier: {}", error.message()), None);
    let mut notifier = member.notifier.clone();
    let first = ListNotificationsRequest { agent_id: member.agent_id.clone(), after_cursor: 0, limit: 1 };
    let mut after = notifier.list_notifications(first).await.map_err(refused)?.into_inner().acknowledged_cursor;
    loop {
        let request = SubscribeRequest { agent_id: member.agent_id.clone(), after_cursor: after };
        let mut stream = notifier.subscribe(request).await.map_err(refused)?.into_inner();
        loop {
            match stream.next().await {
                Some(Ok(message)) => match message.message {
                    Some(subscribe_response::Message::Notification(notification)) => {
                        after = notification.cursor;
                        if !updated().await {
                            return Ok(());
                        }
                    }
                    Some(subscribe_response::Message::LaggedAfterCursor(cursor)) => {
                        after = cursor;
                        break;
                    }
                    None => {}
                },
                Some(Err(error)) => return Err(refused(error)),
                None => break,
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}
