//! The delegation RPCs: Delegate and DelegateBatch decide who takes a task
//! (reserving a slot), ReleaseTask and ReleaseTasks give slots back (a freed
//! slot goes to the oldest task queued for its agent), PlaceTasks does both
//! on one stream, ListDelegations reads the audit trail. The trait methods
//! in `mod.rs` call these.

use std::collections::BTreeSet;

use muster_proto::roster::v1 as pb;
use muster_runtime::auth::{Caller, only_for_itself, permission_denied};
use tonic::{Request, Response, Status as GrpcStatus};
use tracing::Instrument as _;

use super::RosterGrpc;
use super::convert::{decision_to_wire, delegation_request_from_wire, record_to_wire};
use crate::domain::delegation::DelegationRequest;
use crate::error::Error;
use crate::store::{DelegationOutcome, DelegationQuery, QueueResolution, ReleaseOutcome, Store};

impl<S: Store> RosterGrpc<S> {
    pub(super) async fn serve_delegate(
        &self,
        request: Request<pb::DelegateRequest>,
    ) -> Result<Response<pb::DelegateResponse>, GrpcStatus> {
        let caller = Caller::of(&request)?;
        let mut request = delegation_request_from_wire(request.into_inner())?;
        // An agent delegates as itself: the requester is the caller.
        if let Some(own) = caller.agent_id() {
            if request.requester_id.is_empty() {
                request.requester_id = own.to_owned();
            }
            only_for_itself(&caller, &request.requester_id.clone(), "delegate on behalf of another agent")?;
        }
        if !request.requester_id.is_empty() {
            // An unknown requester is a caller's mistake, unlike an unknown named colleague.
            let requester =
                self.inner.store.indexed_agent(&request.requester_id).await.map_err(|error| match error {
                    Error::NotFound { .. } => Error::not_found(
                        crate::error::AGENT,
                        &request.requester_id,
                        format!("requester_id: agent {:?} is not in the roster", request.requester_id),
                    ),
                    other => other,
                })?;
            // An agent whose roster entry does not allow delegation may ask
            // what would be decided, but not reserve a colleague's capacity.
            if caller.agent_id().is_some() && !requester.allow_delegation && !request.dry_run {
                return Err(permission_denied(
                    &caller,
                    "delegate a task",
                    "DELEGATION_NOT_ALLOWED",
                    "its roster entry does not allow delegation; a dry run shows the decision without reserving anyone",
                    &[("agent_id", request.requester_id.clone())],
                ));
            }
        }
        let outcome = self.inner.store.delegate(&request, self.now(), self.inner.settings).await?;
        // Every step's slot: at debug level (the audit trail keeps the
        // roster's choices; a line per call costs the roster a twentieth of
        // its CPU when a run's steps go from agent to agent).
        tracing::debug!(
            task_id = %request.task_id,
            decision = outcome.decision.kind.as_str(),
            tier = outcome.decision.tier.as_str(),
            agent_id = %outcome.decision.primary_agent_id,
            dry_run = request.dry_run,
            "delegation decided"
        );
        if request.writes(outcome.decision.kind) {
            muster_runtime::metrics::count(
                "muster_delegation_decisions_total",
                "Delegation decisions, by tier of the delegation priority order and decision",
                &[("tier", outcome.decision.tier.as_str()), ("decision", outcome.decision.kind.as_str())],
                1,
            );
            if outcome.queue_changed {
                self.refresh_queue_gauge_after_change().await;
            }
        }
        self.announce_agents(pb::RosterChangeKind::AgentStatus, &outcome.changed_agents).await;
        Ok(Response::new(pb::DelegateResponse {
            decision: Some(decision_to_wire(&outcome.decision)),
            delegation_id: outcome.delegation_id,
        }))
    }

    pub(super) async fn serve_delegate_batch(
        &self,
        request: Request<pb::DelegateBatchRequest>,
    ) -> Result<Response<pb::DelegateBatchResponse>, GrpcStatus> {
        // At most 1,000 requests: the contract's limit, checked on the wire.
        let requests = delegations_from_wire(request.into_inner().requests, "requests")?;
        let responses = self.delegate_many(&requests).await?;
        Ok(Response::new(pb::DelegateBatchResponse { responses }))
    }

    /// Decides `requests` (checked by [`delegations_from_wire`]) together.
    async fn delegate_many(&self, requests: &[DelegationRequest]) -> Result<Vec<pb::DelegateResponse>, Error> {
        self.check_requesters(requests).await?;
        self.decide_checked(requests).await
    }

    /// [`Self::delegate_many`] of `requests` whose requesters were checked.
    async fn decide_checked(&self, requests: &[DelegationRequest]) -> Result<Vec<pb::DelegateResponse>, Error> {
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let outcomes = self.inner.store.delegate_batch(requests, self.now(), self.inner.settings).await?;
        Ok(self.decided(requests, outcomes).await)
    }

    /// An unknown requester is a caller's mistake: each is looked up once,
    /// in the organisation held in memory (as Delegate does).
    async fn check_requesters(&self, requests: &[DelegationRequest]) -> Result<(), Error> {
        let requesters: BTreeSet<&str> =
            requests.iter().map(|request| request.requester_id.as_str()).filter(|id| !id.is_empty()).collect();
        for requester in requesters {
            self.inner.store.indexed_agent(requester).await.map_err(|error| match error {
                Error::NotFound { .. } => Error::not_found(
                    crate::error::AGENT,
                    requester,
                    format!("requester_id: agent {requester:?} is not in the roster"),
                ),
                other => other,
            })?;
        }
        Ok(())
    }

    /// Counts, announces and answers the committed decisions of `requests`.
    async fn decided(
        &self,
        requests: &[DelegationRequest],
        outcomes: Vec<DelegationOutcome>,
    ) -> Vec<pb::DelegateResponse> {
        let mut changed = BTreeSet::new();
        let mut queue_changed = false;
        for (request, outcome) in requests.iter().zip(&outcomes) {
            if request.writes(outcome.decision.kind) {
                muster_runtime::metrics::count(
                    "muster_delegation_decisions_total",
                    "Delegation decisions, by tier of the delegation priority order and decision",
                    &[("tier", outcome.decision.tier.as_str()), ("decision", outcome.decision.kind.as_str())],
                    1,
                );
            }
            changed.extend(outcome.changed_agents.iter().cloned());
            queue_changed |= outcome.queue_changed;
        }
        tracing::debug!(tasks = outcomes.len(), "delegations decided in a batch");
        if queue_changed {
            self.refresh_queue_gauge_after_change().await;
        }
        self.announce_agents(pb::RosterChangeKind::AgentStatus, &changed.into_iter().collect::<Vec<_>>()).await;
        outcomes
            .into_iter()
            .map(|outcome| pb::DelegateResponse {
                decision: Some(decision_to_wire(&outcome.decision)),
                delegation_id: outcome.delegation_id,
            })
            .collect()
    }

    pub(super) async fn serve_release_task(
        &self,
        request: Request<pb::ReleaseTaskRequest>,
    ) -> Result<Response<pb::ReleaseTaskResponse>, GrpcStatus> {
        let task_id = request.into_inner().task_id.trim().to_owned();
        if task_id.is_empty() {
            return Err(Error::invalid("task_id", "task_id: required").into());
        }
        let outcome = self.inner.store.release_task(&task_id, self.now()).await?;
        if outcome.queue_changed {
            self.refresh_queue_gauge_after_change().await;
        }
        if let Some(agent_id) = &outcome.agent_id {
            tracing::debug!(task_id = %task_id, agent_id = %agent_id, "task released");
            self.announce_agents(pb::RosterChangeKind::AgentStatus, std::slice::from_ref(agent_id)).await;
        }
        if let Some(offered) = &outcome.offered {
            self.announce_resolutions(std::slice::from_ref(offered));
        }
        Ok(Response::new(pb::ReleaseTaskResponse { agent_id: outcome.agent_id.unwrap_or_default() }))
    }

    pub(super) async fn serve_release_tasks(
        &self,
        request: Request<pb::ReleaseTasksRequest>,
    ) -> Result<Response<pb::ReleaseTasksResponse>, GrpcStatus> {
        // At most 1,000 ids: the contract's limit, checked on the wire.
        let task_ids = task_ids_from_wire(request.into_inner().task_ids, "task_ids")?;
        let agent_ids = self.release_many(&task_ids).await?;
        Ok(Response::new(pb::ReleaseTasksResponse { agent_ids }))
    }

    /// Releases `task_ids` together; per task, the agent whose slot was freed (or empty).
    async fn release_many(&self, task_ids: &[String]) -> Result<Vec<String>, Error> {
        if task_ids.is_empty() {
            return Ok(Vec::new());
        }
        let outcomes = self.inner.store.release_tasks(task_ids, self.now()).await?;
        Ok(self.released(task_ids, outcomes).await)
    }

    /// Announces the committed releases of `task_ids`; per task, the agent whose slot was freed (or empty).
    async fn released(&self, task_ids: &[String], outcomes: Vec<ReleaseOutcome>) -> Vec<String> {
        if outcomes.iter().any(|outcome| outcome.queue_changed) {
            self.refresh_queue_gauge_after_change().await;
        }
        let freed: BTreeSet<String> = outcomes.iter().filter_map(|outcome| outcome.agent_id.clone()).collect();
        tracing::debug!(tasks = task_ids.len(), agents = freed.len(), "tasks released");
        self.announce_agents(pb::RosterChangeKind::AgentStatus, &freed.into_iter().collect::<Vec<_>>()).await;
        let offered: Vec<QueueResolution> = outcomes.iter().filter_map(|outcome| outcome.offered.clone()).collect();
        self.announce_resolutions(&offered);
        outcomes.into_iter().map(|outcome| outcome.agent_id.unwrap_or_default()).collect()
    }

    /// The PlaceTasks stream: its requests handled one after another, in
    /// order, each answered (or refused) on its own; the stream ends when
    /// the caller's does, or the caller goes away.
    pub(super) async fn serve_place_tasks(
        &self,
        request: Request<tonic::Streaming<pb::PlaceTasksRequest>>,
    ) -> Result<Response<super::ResponseStream<pb::PlaceTasksResponse>>, GrpcStatus> {
        let mut requests = request.into_inner();
        let (answers, answered) = tokio::sync::mpsc::channel(PLACEMENTS_AHEAD);
        let service = self.clone();
        tokio::spawn(async move {
            loop {
                let request = tokio::select! {
                    request = requests.message() => request,
                    () = answers.closed() => return,
                };
                let answer = match request {
                    Ok(Some(request)) => {
                        let (releases, delegations) = (request.release_task_ids.len(), request.delegations.len());
                        // Named for what a trace reader looks for: a step placed, or slots given back.
                        let span = if delegations == 0 {
                            tracing::info_span!("release", id = request.id, releases)
                        } else {
                            tracing::info_span!("placement", id = request.id, releases, delegations)
                        };
                        muster_runtime::telemetry::continue_from(&span, &request.trace_parent);
                        Ok(service.place(request).instrument(span).await)
                    }
                    Ok(None) => return,
                    // A message over its limits, or a broken stream: the stream ends with it.
                    Err(status) => Err(status),
                };
                let ended = answer.is_err();
                if answers.send(answer).await.is_err() || ended {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(answered))))
    }

    /// One PlaceTasks request: its releases, then its delegations.
    async fn place(&self, request: pb::PlaceTasksRequest) -> pb::PlaceTasksResponse {
        let id = request.id;
        let placed = async {
            let releases = task_ids_from_wire(request.release_task_ids, "release_task_ids")?;
            let delegations = delegations_from_wire(request.delegations, "delegations")?;
            // Before anything is released.
            self.check_requesters(&delegations).await?;
            if !releases.is_empty() && !delegations.is_empty() {
                // In one transaction where the store can.
                let placed = self.inner.store.place_together(&releases, &delegations, self.now(), self.inner.settings);
                if let Some((released, decided)) = placed.await? {
                    return Ok((self.released(&releases, released).await, self.decided(&delegations, decided).await));
                }
            }
            let released = self.release_many(&releases).await?;
            Ok::<_, Error>((released, self.decide_checked(&delegations).await?))
        };
        match placed.await {
            Ok((released_agent_ids, delegations)) => {
                pb::PlaceTasksResponse { id, released_agent_ids, delegations, refusal: None }
            }
            Err(error) => {
                let status = GrpcStatus::from(error);
                pb::PlaceTasksResponse {
                    id,
                    refusal: Some(pb::PlaceTasksRefusal {
                        code: status.code() as i32,
                        message: status.message().to_owned(),
                    }),
                    ..Default::default()
                }
            }
        }
    }

    pub(super) async fn serve_list_delegations(
        &self,
        request: Request<pb::ListDelegationsRequest>,
    ) -> Result<Response<pb::ListDelegationsResponse>, GrpcStatus> {
        let caller = Caller::of(&request)?;
        let request = request.into_inner();
        let mut agent_id = request.agent_id.trim().to_owned();
        // An agent sees the decisions it asked for or was chosen by.
        if let Some(own) = caller.agent_id() {
            if agent_id.is_empty() {
                agent_id = own.to_owned();
            }
            only_for_itself(&caller, &agent_id, "list the delegations of another agent")?;
        }
        let query = DelegationQuery {
            agent_id,
            task_id: request.task_id.trim().to_owned(),
            since: request.since.as_ref().map(muster_runtime::time::from_timestamp),
            until: request.until.as_ref().map(muster_runtime::time::from_timestamp),
            limit: request.limit,
            after: delegation_page(&request.page_token)?,
        };
        let records = self.inner.store.list_delegations(&query).await?;
        let page_size = if request.limit == 0 { 1000 } else { request.limit.min(10_000) };
        // A full page may have a next one; the last page, read short, has none.
        let next_page_token = match records.last() {
            Some(last) if records.len() == page_size as usize => format!("{}/{}", last.position.0, last.position.1),
            _ => String::new(),
        };
        let records = records.iter().map(record_to_wire).collect();
        Ok(Response::new(pb::ListDelegationsResponse { records, next_page_token }))
    }
}

/// Answers a PlaceTasks stream keeps ready for a caller slow to read them.
const PLACEMENTS_AHEAD: usize = 4;

/// The task ids of a batch, trimmed; `field` names the list in errors.
fn task_ids_from_wire(task_ids: Vec<String>, field: &str) -> Result<Vec<String>, Error> {
    let task_ids: Vec<String> = task_ids.iter().map(|id| id.trim().to_owned()).collect();
    match task_ids.iter().position(String::is_empty) {
        Some(index) => Err(Error::invalid(format!("{field}[{index}]"), format!("{field}[{index}]: required"))),
        None => Ok(task_ids),
    }
}

/// The delegations of a batch, checked: distinct tasks, no dry run; `field`
/// names the list in errors.
fn delegations_from_wire(requests: Vec<pb::DelegateRequest>, field: &str) -> Result<Vec<DelegationRequest>, Error> {
    let mut decided = Vec::with_capacity(requests.len());
    let mut tasks = std::collections::HashSet::new();
    for (index, request) in requests.into_iter().enumerate() {
        let request = delegation_request_from_wire(request).map_err(|error| match error {
            Error::InvalidArgument { field: inner, message } => {
                Error::invalid(format!("{field}[{index}].{inner}"), format!("{field}[{index}]: {message}"))
            }
            other => Error::invalid(format!("{field}[{index}]"), format!("{field}[{index}]: {other}")),
        })?;
        if request.dry_run {
            return Err(Error::invalid(
                format!("{field}[{index}].dry_run"),
                format!("{field}[{index}]: a batch takes no dry runs"),
            ));
        }
        if !tasks.insert(request.task_id.clone()) {
            return Err(Error::invalid(
                format!("{field}[{index}].task_id"),
                format!("{field}[{index}]: task_id {:?} is asked about twice", request.task_id),
            ));
        }
        decided.push(request);
    }
    Ok(decided)
}

/// The position a ListDelegations `page_token` names: `decided_at/seq`.
fn delegation_page(page_token: &str) -> Result<Option<(i64, i64)>, Error> {
    if page_token.is_empty() {
        return Ok(None);
    }
    let refused = || Error::invalid("page_token", "page_token is not one this service gave");
    let (decided_at, seq) = page_token.split_once('/').ok_or_else(refused)?;
    Ok(Some((decided_at.parse().map_err(|_| refused())?, seq.parse().map_err(|_| refused())?)))
}
