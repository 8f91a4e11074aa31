//! Calls that act on a running execution (approvals, interventions, role
//! assignments, a new lead, cancellation) are answered by the replica that
//! drives it. A replica that receives one for an execution another live
//! replica drives hands the call over once: the same request, carrying the
//! caller's own credential (never this service's), marked so that the
//! other replica answers it itself. A caller that authenticated without a
//! token (a service's certificate) is answered here, with NOT_RUNNING_HERE.

use std::{
    collections::HashMap,
    sync::{Mutex, PoisonError},
    time::Duration,
};

use muster_proto::execution::v1::execution_service_client::ExecutionServiceClient;
use muster_runtime::{
    auth::{Caller, client::AuthChannel},
    security::Security,
};
use tonic::{Request, Response, Status};

use super::{ExecutionGrpc, answer};
use crate::store::Replica;

/// The metadata that marks a call handed over by another replica (its
/// name): it is answered where it arrives, never handed on.
pub(super) const HANDED_OVER_BY: &str = "x-muster-handed-over-by";

/// How long a handed-over call may take (a cancellation waits up to 10 s
/// for the run to end).
const HAND_OVER_TIMEOUT: Duration = Duration::from_secs(30);

/// Another replica, over gRPC.
pub(super) type PeerClient = ExecutionServiceClient<AuthChannel>;

/// The connections to the other replicas, by URL and address.
pub(crate) struct Peers {
    security: Security,
    clients: Mutex<HashMap<(String, String), PeerClient>>,
}

impl Peers {
    pub(crate) fn new(security: Security) -> Self {
        Self { security, clients: Mutex::new(HashMap::new()) }
    }

    fn client(&self, replica: &Replica) -> Result<PeerClient, Status> {
        let key = (replica.url.clone(), replica.address.clone());
        let mut clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(client) = clients.get(&key) {
            return Ok(client.clone());
        }
        let channel = self.security.channel_at(&replica.url, &replica.address).map_err(|error| {
            Status::unavailable(format!(
                "cannot reach the replica that drives the execution at {}: {error}",
                replica.url
            ))
        })?;
        let client = ExecutionServiceClient::new(channel);
        clients.insert(key, client.clone());
        Ok(client)
    }
}

impl ExecutionGrpc {
    /// Answers a call about one execution (named by `execution_id`) where
    /// the execution is driven: by the replica that drives it when that is
    /// another ([`Self::hand_over`], which makes the same call there with
    /// `forward`), otherwise here, by `serve` for the caller.
    pub(super) async fn where_driven<Q, R, F, Fut, S, Served>(
        &self,
        request: Request<Q>,
        execution_id: fn(&Q) -> &str,
        forward: F,
        serve: S,
    ) -> Result<Response<R>, Status>
    where
        Q: Clone,
        F: FnOnce(PeerClient, Request<Q>) -> Fut,
        Fut: Future<Output = Result<Response<R>, Status>>,
        S: FnOnce(Caller, Q) -> Served,
        Served: Future<Output = crate::Result<R>>,
    {
        let id = execution_id(request.get_ref()).to_owned();
        if let Some(answer) = self.hand_over(&request, &id, forward).await {
            return answer;
        }
        let caller = Caller::of(&request)?;
        answer(serve(caller, request.into_inner()).await)
    }

    /// The answer of the replica that drives `execution_id`, when that is
    /// another live replica this one can reach and the caller presented a
    /// token; `None` when the call is answered here.
    async fn hand_over<Q, R, F, Fut>(
        &self,
        request: &Request<Q>,
        execution_id: &str,
        call: F,
    ) -> Option<Result<Response<R>, Status>>
    where
        Q: Clone,
        F: FnOnce(PeerClient, Request<Q>) -> Fut,
        Fut: Future<Output = Result<Response<R>, Status>>,
    {
        if self.engine.drives(execution_id) || request.metadata().contains_key(HANDED_OVER_BY) {
            return None;
        }
        let authorization = request.metadata().get("authorization")?.clone();
        let driver = match self.engine.store.driver_of(execution_id).await {
            Ok(Some(driver)) if driver.id != self.engine.replica && !driver.url.is_empty() => driver,
            Ok(_) => return None,
            Err(error) => return Some(Err(error.into())),
        };
        let client = match self.peers.client(&driver) {
            Ok(client) => client,
            Err(status) => return Some(Err(status)),
        };
        let mut handed = Request::new(request.get_ref().clone());
        handed.metadata_mut().insert("authorization", authorization);
        if let Ok(replica) = self.engine.replica.parse() {
            handed.metadata_mut().insert(HANDED_OVER_BY, replica);
        }
        handed.set_timeout(HAND_OVER_TIMEOUT);
        tracing::debug!(%execution_id, replica = %driver.id, url = %driver.url, "handing the call to the replica that drives the execution");
        Some(call(client, handed).await)
    }
}
