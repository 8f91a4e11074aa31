//! `muster.notifier.v1.NotifierService`: wire <-> domain conversions and the
//! four RPCs.

use std::{pin::Pin, sync::Arc, task::Poll};

use bytes::Bytes;
use muster_proto::{
    common::v1::{EventType, ExecutionStatus, StepEvent},
    frame::{Frame, NotificationFrame, SubscribeFrame},
    notifier::v1::{
        AcknowledgeNotificationsRequest, AcknowledgeNotificationsResponse, IngestEventsRequest, IngestEventsResponse,
        ListNotificationsRequest, ListNotificationsResponse, Notification, RecipientReason, SubscribeRequest,
        framed::notifier_service_server::NotifierService,
    },
};
use muster_runtime::auth::{Access, AgentDirectory, Caller, Rule, TokenHash, only_for_itself, permission_denied, rule};
use prost::Message as _;
use tokio::sync::mpsc;
use tokio_stream::{Stream, wrappers::ReceiverStream};
use tonic::{Request, Response, Status, Streaming};

use crate::{
    Error, Result,
    domain::{Event, EventKind, Reason},
    hub::Hub,
    ingest::{Incoming, Ingestor, JobReply, MAX_BATCH_EVENTS},
    store::{Store, StoredNotification},
};

/// Longest accepted event or agent id, in bytes.
const MAX_ID_BYTES: usize = 256;
/// Notifications read from the inbox per query while streaming a backlog.
const BACKLOG_PAGE: u32 = 1000;
/// Batches of one IngestEvents stream stored but not yet answered.
const IN_FLIGHT_BATCHES: usize = 8;
/// Earliest and latest timestamps accepted (years 1 and 9999).
const MIN_SECONDS: i64 = -62_135_596_800;
const MAX_SECONDS: i64 = 253_402_300_799;

fn kind_from_wire(value: i32) -> Option<EventKind> {
    Some(match EventType::try_from(value).ok()? {
        EventType::Unspecified => return None,
        EventType::StepStarted => EventKind::StepStarted,
        EventType::StepCompleted => EventKind::StepCompleted,
        EventType::StepFailed => EventKind::StepFailed,
        EventType::StepQueued => EventKind::StepQueued,
        EventType::StepDelegated => EventKind::StepDelegated,
        EventType::StepEscalated => EventKind::StepEscalated,
        EventType::ApprovalRequested => EventKind::ApprovalRequested,
        EventType::StepIntervened => EventKind::StepIntervened,
        EventType::ExecutionFinished => EventKind::ExecutionFinished,
        EventType::ExecutionStarted => EventKind::ExecutionStarted,
        EventType::SessionStarted => EventKind::SessionStarted,
        EventType::RoleAssigned => EventKind::RoleAssigned,
        EventType::LeadChanged => EventKind::LeadChanged,
        EventType::BudgetExceeded => EventKind::BudgetExceeded,
        EventType::StepProgress => EventKind::StepProgress,
        EventType::SubtaskRequested => EventKind::SubtaskRequested,
        EventType::SubtaskDecided => EventKind::SubtaskDecided,
    })
}

fn execution_status_name(value: i32) -> String {
    match ExecutionStatus::try_from(value) {
        Ok(ExecutionStatus::Unspecified) | Err(_) => String::new(),
        Ok(status) => status.as_str_name().trim_start_matches("EXECUTION_STATUS_").to_ascii_lowercase(),
    }
}

/// Validates a wire event into the domain view.
pub(crate) fn event_from_wire(wire: &StepEvent) -> Result<Event> {
    if wire.event_id.is_empty() {
        return Err(Error::invalid("event.event_id", "event.event_id is required"));
    }
    if wire.event_id.len() > MAX_ID_BYTES {
        return Err(Error::invalid("event.event_id", format!("event.event_id is longer than {MAX_ID_BYTES} bytes")));
    }
    let kind = kind_from_wire(wire.event_type).ok_or_else(|| {
        Error::invalid(
            "event.event_type",
            format!("event {}: event.event_type {} is not a known event type", wire.event_id, wire.event_type),
        )
    })?;
    let invalid = |field: &str, problem: String| {
        Error::invalid(format!("event.{field}"), format!("event {}: event.{field} {problem}", wire.event_id))
    };
    let output_json = match &wire.output {
        None => String::new(),
        Some(output) => {
            muster_runtime::json::value_to_text(Some(output)).map_err(|problem| invalid("output", problem))?
        }
    };
    let duration_ms =
        muster_runtime::time::from_duration(wire.duration.as_ref()).map_err(|problem| invalid("duration", problem))?;
    let wait_seconds = muster_runtime::time::from_duration(wire.estimated_wait.as_ref())
        .map_err(|problem| invalid("estimated_wait", problem))?
        / 1000;
    let occurred_at = wire.occurred_at.as_ref().ok_or_else(|| {
        Error::invalid("event.occurred_at", format!("event {}: event.occurred_at is required", wire.event_id))
    })?;
    if !(MIN_SECONDS..=MAX_SECONDS).contains(&occurred_at.seconds) {
        return Err(Error::invalid(
            "event.occurred_at",
            format!("event {}: event.occurred_at is outside the years 1 to 9999", wire.event_id),
        ));
    }
    if wire.execution_id.is_empty() {
        return Err(Error::invalid(
            "event.execution_id",
            format!("event {}: event.execution_id is required", wire.event_id),
        ));
    }
    let roles = wire.roles.clone().unwrap_or_default();
    let error = wire.error.clone().unwrap_or_default();
    Ok(Event {
        event_id: wire.event_id.clone(),
        kind,
        occurred_at: muster_runtime::time::from_timestamp(occurred_at),
        execution_id: wire.execution_id.clone(),
        process_name: wire.process_name.clone(),
        step_id: wire.step_id.clone(),
        step_name: wire.step_name.clone(),
        monitors: roles.monitors,
        informed: roles.informed,
        lead_agent_id: wire.lead_agent_id.clone(),
        output_json,
        error_code: error.code,
        error_message: error.message,
        retry_count: wire.retry_count,
        cost: wire.cost,
        duration_ms,
        agent_id: wire.agent_id.clone(),
        wait_seconds,
        detail: wire.detail.clone(),
        waiting_for: wire.waiting_for.clone(),
        execution_status: execution_status_name(wire.execution_status),
        participants: wire.participants.clone(),
    })
}

/// Decodes a stored event.
pub(crate) fn decode_event(bytes: &[u8]) -> Result<(StepEvent, Event)> {
    let wire = StepEvent::decode(bytes).map_err(|error| Error::Corrupt(format!("stored event: {error}")))?;
    let event = event_from_wire(&wire).map_err(|error| Error::Corrupt(format!("stored event: {error}")))?;
    Ok((wire, event))
}

fn reason_to_wire(reason: Reason) -> RecipientReason {
    match reason {
        Reason::Informed => RecipientReason::Informed,
        Reason::Monitor => RecipientReason::Monitor,
        Reason::Lead => RecipientReason::Lead,
        Reason::Participant => RecipientReason::Participant,
    }
}

/// A Subscribe message carrying a notification whose event is already encoded.
fn notification_frame(
    cursor: u64,
    agent_id: Arc<str>,
    reason: Reason,
    event: Bytes,
    output_summary: Arc<str>,
    created_at: i64,
) -> SubscribeFrame {
    SubscribeFrame {
        message: Some(Frame::Notification(NotificationFrame {
            cursor,
            agent_id,
            reason: reason_to_wire(reason).into(),
            event,
            output_summary,
            created_at: Some(muster_runtime::time::to_timestamp(created_at)),
        })),
    }
}

/// A stored notification as ListNotifications returns it.
fn stored_to_wire(stored: &StoredNotification) -> Result<Notification> {
    let event = StepEvent::decode(&stored.encoded[..])
        .map_err(|error| Error::Corrupt(format!("stored event {}: {error}", stored.event_id)))?;
    Ok(Notification {
        cursor: stored.cursor,
        agent_id: stored.agent_id.clone(),
        reason: reason_to_wire(stored.reason).into(),
        event: Some(event),
        output_summary: stored.output_summary.clone(),
        created_at: Some(muster_runtime::time::to_timestamp(stored.created_at)),
    })
}

fn required_agent_id(agent_id: &str) -> Result<()> {
    if agent_id.is_empty() {
        return Err(Error::invalid("agent_id", "agent_id is required"));
    }
    if agent_id.len() > MAX_ID_BYTES {
        return Err(Error::invalid("agent_id", format!("agent_id is longer than {MAX_ID_BYTES} bytes")));
    }
    Ok(())
}

/// Who may call each method. Finer rules are in the handlers: only the
/// execution service ingests, an agent reads and acknowledges only its own
/// inbox (operators may read any).
pub const ACCESS: &[Rule] = &[
    rule("IngestEvents", Access::SERVICE),
    rule("Subscribe", Access::OPERATOR.or(Access::AGENT)),
    rule("ListNotifications", Access::OPERATOR.or(Access::AGENT)),
    rule("AcknowledgeNotifications", Access::AGENT),
];

/// The gRPC service.
pub(crate) struct NotifierGrpc<S> {
    pub(crate) store: Arc<S>,
    pub(crate) hub: Arc<Hub>,
    pub(crate) ingestor: Ingestor,
    /// The agents' credentials, to end a subscription whose token is revoked.
    pub(crate) agents: AgentDirectory,
}

/// The next message of `inbound` if one is already available, without waiting.
async fn ready_message(inbound: &mut Streaming<IngestEventsRequest>) -> Option<Result<IngestEventsRequest, Status>> {
    std::future::poll_fn(|context| match Pin::new(&mut *inbound).poll_next(context) {
        Poll::Ready(item) => Poll::Ready(item),
        Poll::Pending => Poll::Ready(None),
    })
    .await
}

enum InFlight {
    Batch { event_ids: Vec<String>, answer: tokio::sync::oneshot::Receiver<JobReply> },
    Refused(Status),
}

/// Reads an IngestEvents stream in batches of what is already available.
async fn read_ingest_stream(
    mut inbound: Streaming<IngestEventsRequest>,
    ingestor: Ingestor,
    in_flight: mpsc::Sender<InFlight>,
) {
    loop {
        let first = match inbound.message().await {
            Ok(Some(message)) => message,
            Ok(None) => return,
            Err(status) => {
                tracing::debug!(%status, "ingest stream ended with an error");
                return;
            }
        };
        let mut messages = vec![first];
        while messages.len() < MAX_BATCH_EVENTS {
            match ready_message(&mut inbound).await {
                Some(Ok(message)) => messages.push(message),
                _ => break,
            }
        }
        let mut events = Vec::with_capacity(messages.len());
        let mut refusal = None;
        for message in messages {
            let Some(wire) = message.event else {
                refusal = Some(Error::invalid("event", "event is required").into());
                break;
            };
            match event_from_wire(&wire) {
                Ok(event) => events.push(Incoming { wire: Arc::new(wire), event }),
                Err(error) => {
                    refusal = Some(error.into());
                    break;
                }
            }
        }
        if !events.is_empty() {
            let event_ids = events.iter().map(|incoming| incoming.event.event_id.clone()).collect();
            let item = match ingestor.submit(events).await {
                Ok(answer) => InFlight::Batch { event_ids, answer },
                Err(error) => InFlight::Refused(error.into()),
            };
            if in_flight.send(item).await.is_err() {
                return;
            }
        }
        if let Some(status) = refusal {
            let _ = in_flight.send(InFlight::Refused(status)).await;
            return;
        }
    }
}

/// Answers each batch, in the order received, once it is stored.
async fn answer_ingest_stream(
    mut in_flight: mpsc::Receiver<InFlight>,
    output: mpsc::Sender<Result<IngestEventsResponse, Status>>,
) {
    while let Some(item) = in_flight.recv().await {
        match item {
            InFlight::Batch { event_ids, answer } => match answer.await {
                Ok(Ok(counts)) => {
                    for (event_id, notifications) in event_ids.into_iter().zip(counts) {
                        if output.send(Ok(IngestEventsResponse { event_id, notifications })).await.is_err() {
                            return;
                        }
                    }
                }
                Ok(Err(error)) => {
                    let _ = output.send(Err(error.into())).await;
                    return;
                }
                Err(_) => {
                    let _ = output.send(Err(Error::ShuttingDown.into())).await;
                    return;
                }
            },
            InFlight::Refused(status) => {
                let _ = output.send(Err(status)).await;
                return;
            }
        }
    }
}

/// The count of notifications handed to agents, by how they were read.
fn delivered(via: &str) -> muster_runtime::metrics::CounterSeries {
    muster_runtime::metrics::counter(
        "muster_notifications_delivered_total",
        "Notifications handed to agents: Subscribe streams replaying the inbox (backlog), live, or ListNotifications",
        &[("via", via)],
    )
}

/// Streams an agent's backlog after `after_cursor`, then live
/// notifications; with `revoked`, it ends with UNAUTHENTICATED when that
/// resolves (the subscriber's token was revoked).
async fn run_subscription<S: Store>(
    store: Arc<S>,
    hub: Arc<Hub>,
    agent_id: String,
    after_cursor: u64,
    output: mpsc::Sender<Result<SubscribeFrame, Status>>,
    revoked: impl std::future::Future<Output = ()>,
) {
    let mut revoked = std::pin::pin!(revoked);
    let send = |frame: SubscribeFrame| output.send(Ok(frame));
    // Counted as an open stream, with its lag, until this returns.
    let subscription = hub.open(&agent_id);
    let (backlog_delivered, live_delivered) = (delivered("backlog"), delivered("live"));
    let mut last_sent = after_cursor;
    'resubscribe: loop {
        // Live first, then the backlog: whatever commits in between arrives
        // through both and is skipped by cursor on the live side.
        let mut live = subscription.live();
        loop {
            let page = match store.list(&agent_id, last_sent, BACKLOG_PAGE).await {
                Ok(page) => page,
                Err(error) => {
                    let _ = output.send(Err(error.into())).await;
                    return;
                }
            };
            // The stored bytes of each event go out as they are, undecoded.
            for stored in &page {
                let frame = notification_frame(
                    stored.cursor,
                    Arc::from(stored.agent_id.as_str()),
                    stored.reason,
                    stored.encoded.clone(),
                    Arc::from(stored.output_summary.as_str()),
                    stored.created_at,
                );
                if send(frame).await.is_err() {
                    return;
                }
                last_sent = stored.cursor;
            }
            backlog_delivered.add(page.len() as u64);
            if page.len() < BACKLOG_PAGE as usize {
                break;
            }
        }
        if live.overflowed() {
            // Fell behind while catching up: catch up from the inbox again.
            continue 'resubscribe;
        }
        loop {
            let next = tokio::select! {
                next = live.recv() => next,
                () = output.closed() => return,
                () = &mut revoked => {
                    let _ = output.send(Err(muster_runtime::auth::unauthenticated(
                        "CREDENTIAL_REVOKED",
                        format!("the token of agent '{agent_id}' was revoked; the subscription ends"),
                    ))).await;
                    return;
                }
            };
            match next {
                Some(live) if live.cursor > last_sent => {
                    let frame = notification_frame(
                        live.cursor,
                        Arc::clone(&live.agent_id),
                        live.reason,
                        live.event.clone(),
                        Arc::clone(&live.output_summary),
                        live.created_at,
                    );
                    if send(frame).await.is_err() {
                        return;
                    }
                    live_delivered.add(1);
                    last_sent = live.cursor;
                }
                Some(_) => {}
                None => {
                    if live.overflowed() {
                        muster_runtime::metrics::count(
                            "muster_subscribers_lagged_total",
                            "Live subscriptions cut off because the subscriber fell behind",
                            &[],
                            1,
                        );
                        let lagged = SubscribeFrame { message: Some(Frame::LaggedAfterCursor(last_sent)) };
                        let _ = output.send(Ok(lagged)).await;
                    }
                    return;
                }
            }
        }
    }
}

type ResponseStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl<S: Store> NotifierService for NotifierGrpc<S> {
    type IngestEventsStream = ResponseStream<IngestEventsResponse>;
    type SubscribeStream = ResponseStream<SubscribeFrame>;

    async fn ingest_events(
        &self,
        request: Request<Streaming<IngestEventsRequest>>,
    ) -> Result<Response<Self::IngestEventsStream>, Status> {
        let caller = Caller::of(&request)?;
        if !caller.is_service("execution") {
            return Err(permission_denied(
                &caller,
                "ingest events",
                "EXECUTION_SERVICE_ONLY",
                "only the execution service records what happens in executions",
                &[],
            ));
        }
        let inbound = request.into_inner();
        let (in_flight_sender, in_flight_receiver) = mpsc::channel(IN_FLIGHT_BATCHES);
        let (output_sender, output_receiver) = mpsc::channel(MAX_BATCH_EVENTS);
        tokio::spawn(read_ingest_stream(inbound, self.ingestor.clone(), in_flight_sender));
        tokio::spawn(answer_ingest_stream(in_flight_receiver, output_sender));
        Ok(Response::new(Box::pin(ReceiverStream::new(output_receiver))))
    }

    async fn subscribe(&self, request: Request<SubscribeRequest>) -> Result<Response<Self::SubscribeStream>, Status> {
        let caller = Caller::of(&request)?;
        let request = request.into_inner();
        required_agent_id(&request.agent_id)?;
        only_for_itself(&caller, &request.agent_id, "subscribe to the notifications of another agent")?;
        let (output_sender, output_receiver) = mpsc::channel(64);
        let token: Option<TokenHash> = match &caller {
            Caller::Agent { token, .. } => Some(*token),
            _ => None,
        };
        let agents = self.agents.clone();
        let revoked = async move {
            match token {
                Some(token) => agents.until_revoked(token).await,
                None => std::future::pending().await,
            }
        };
        tokio::spawn(run_subscription(
            Arc::clone(&self.store),
            Arc::clone(&self.hub),
            request.agent_id,
            request.after_cursor,
            output_sender,
            revoked,
        ));
        Ok(Response::new(Box::pin(ReceiverStream::new(output_receiver))))
    }

    async fn list_notifications(
        &self,
        request: Request<ListNotificationsRequest>,
    ) -> Result<Response<ListNotificationsResponse>, Status> {
        let caller = Caller::of(&request)?;
        let request = request.into_inner();
        required_agent_id(&request.agent_id)?;
        only_for_itself(&caller, &request.agent_id, "read the notifications of another agent")?;
        let limit = match request.limit {
            0 => 100,
            limit => limit.min(1000),
        };
        let stored = self.store.list(&request.agent_id, request.after_cursor, limit).await?;
        let notifications = stored.iter().map(stored_to_wire).collect::<Result<Vec<_>>>()?;
        delivered("list").add(notifications.len() as u64);
        let acknowledged_cursor = self.store.acknowledged_cursor(&request.agent_id).await?;
        Ok(Response::new(ListNotificationsResponse { notifications, acknowledged_cursor }))
    }

    async fn acknowledge_notifications(
        &self,
        request: Request<AcknowledgeNotificationsRequest>,
    ) -> Result<Response<AcknowledgeNotificationsResponse>, Status> {
        let caller = Caller::of(&request)?;
        let request = request.into_inner();
        required_agent_id(&request.agent_id)?;
        only_for_itself(&caller, &request.agent_id, "acknowledge the notifications of another agent")?;
        let newest = self.store.newest_cursor(&request.agent_id).await?;
        if request.cursor > newest {
            let message = format!(
                "cursor {} is past the newest notification of '{}' (cursor {newest}): acknowledge only what was read",
                request.cursor, request.agent_id
            );
            return Err(Error::OutOfRange { field: "cursor", message }.into());
        }
        let acknowledged_cursor = self.store.acknowledge(&request.agent_id, request.cursor).await?;
        Ok(Response::new(AcknowledgeNotificationsResponse { acknowledged_cursor }))
    }
}
