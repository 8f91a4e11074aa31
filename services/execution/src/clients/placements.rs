//! The roster's `PlaceTasks` stream, as [`RosterClient::place`] uses it: one
//! long-lived stream carries every placement (the slots of ended tasks
//! released, then the delegations decided), so that a step's placement
//! costs a message, not a call of its own. The roster answers in the order
//! asked, each answer carrying its request's id.
//!
//! The stream opens with the first placement and again with the first one
//! after it broke; a stream that broke fails the placements waiting on it
//! as unavailable (they are asked again), one the roster ended with a
//! status fails them with that status. A roster that does not know the
//! stream (UNIMPLEMENTED) is asked with `ReleaseTasks` and `DelegateBatch`
//! from then on.
//!
//! [`RosterClient::place`]: super::roster::RosterClient

use std::{
    collections::VecDeque,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use muster_proto::roster::v1 as roster;
use muster_runtime::auth::client::AuthChannel;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::roster::{RosterFailure, failure};

type Answer = Result<roster::PlaceTasksResponse, RosterFailure>;
/// A request and where its answer goes.
type Placement = (roster::PlaceTasksRequest, oneshot::Sender<Answer>);

/// The sending side of the stream; the task that carries it ends when this
/// is dropped.
#[derive(Debug)]
pub(super) struct Placements {
    queue: mpsc::UnboundedSender<Placement>,
    /// The roster answered the stream UNIMPLEMENTED.
    unimplemented: Arc<AtomicBool>,
}

impl Placements {
    /// Placements on `client`'s roster. Spawns the carrying task: call
    /// within the Tokio runtime.
    pub(super) fn new(client: roster::roster_service_client::RosterServiceClient<AuthChannel>) -> Self {
        let (queue, queued) = mpsc::unbounded_channel();
        let unimplemented = Arc::new(AtomicBool::new(false));
        tokio::spawn(carry(client, queued, unimplemented.clone()));
        Self { queue, unimplemented }
    }

    /// Whether the roster has no PlaceTasks stream (an older roster).
    pub(super) fn unimplemented(&self) -> bool {
        self.unimplemented.load(Ordering::Relaxed)
    }

    /// Sends `request` and waits for its answer (its `id` is set here).
    pub(super) async fn place(&self, request: roster::PlaceTasksRequest) -> Answer {
        let (reply, answer) = oneshot::channel();
        let stopped = || RosterFailure::Unavailable("the service is stopping".to_owned());
        self.queue.send((request, reply)).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

/// Carries placements over one stream after another, for as long as
/// placements come.
async fn carry(
    mut client: roster::roster_service_client::RosterServiceClient<AuthChannel>,
    mut queued: mpsc::UnboundedReceiver<Placement>,
    unimplemented: Arc<AtomicBool>,
) {
    let mut next_id = 0_u64;
    // Sent and not yet answered, oldest first.
    let mut waiting: VecDeque<(u64, oneshot::Sender<Answer>)> = VecDeque::new();
    while let Some(first) = queued.recv().await {
        let (requests, outgoing) = mpsc::unbounded_channel();
        let mut send = |(mut request, reply): Placement, waiting: &mut VecDeque<_>| {
            next_id += 1;
            request.id = next_id;
            // The receiver lives as long as the call: a send fails only once
            // the stream ended, and the answer's wait fails it then.
            let _ = requests.send(request);
            waiting.push_back((next_id, reply));
        };
        send(first, &mut waiting);
        let mut answers = match client.place_tasks(UnboundedReceiverStream::new(outgoing)).await {
            Ok(response) => response.into_inner(),
            Err(status) => {
                if status.code() == tonic::Code::Unimplemented {
                    unimplemented.store(true, Ordering::Relaxed);
                }
                fail_all(&mut waiting, &failure(status));
                continue;
            }
        };
        loop {
            tokio::select! {
                placement = queued.recv() => match placement {
                    Some(placement) => send(placement, &mut waiting),
                    None => return,
                },
                answer = answers.message() => {
                    let broken = match answer {
                        Ok(Some(answer)) => match waiting.pop_front() {
                            Some((id, reply)) if id == answer.id => {
                                let _ = reply.send(Ok(answer));
                                continue;
                            }
                            Some((id, reply)) => {
                                let message = format!("the roster answered placement {} when {id} was next", answer.id);
                                let _ = reply.send(Err(RosterFailure::Unavailable(message.clone())));
                                RosterFailure::Unavailable(message)
                            }
                            None => RosterFailure::Unavailable(format!("the roster answered placement {} unasked", answer.id)),
                        },
                        Ok(None) => RosterFailure::Unavailable("the roster ended the placement stream".to_owned()),
                        Err(status) => failure(status),
                    };
                    tracing::debug!(error = %broken.message(), "the placement stream broke; the next placement opens another");
                    fail_all(&mut waiting, &broken);
                    break;
                }
            }
        }
    }
}

/// Fails every waiting placement with `failure`.
fn fail_all(waiting: &mut VecDeque<(u64, oneshot::Sender<Answer>)>, failure: &RosterFailure) {
    for (_, reply) in waiting.drain(..) {
        let _ = reply.send(Err(failure.clone()));
    }
}

#[cfg(test)]
mod tests {
    use std::{
        convert::Infallible,
        sync::Mutex,
        task::{Context, Poll},
    };

    use super::*;
    use crate::{
        clients::roster::{DelegationAsk, Roster, RosterClient},
        store::BoxFuture,
    };

    /// A roster from before the PlaceTasks stream: it answers ReleaseTasks
    /// and DelegateBatch (every task to `agent-for-<task>`) and nothing
    /// else, recording the methods called.
    #[derive(Clone, Default)]
    struct Older(Arc<Mutex<Vec<String>>>);

    impl tonic::server::NamedService for Older {
        const NAME: &'static str = "muster.roster.v1.RosterService";
    }

    struct Release;
    impl tonic::server::UnaryService<roster::ReleaseTasksRequest> for Release {
        type Response = roster::ReleaseTasksResponse;
        type Future = std::future::Ready<Result<tonic::Response<Self::Response>, tonic::Status>>;
        fn call(&mut self, request: tonic::Request<roster::ReleaseTasksRequest>) -> Self::Future {
            let agent_ids = request.into_inner().task_ids.iter().map(|_| "freed".to_owned()).collect();
            std::future::ready(Ok(tonic::Response::new(roster::ReleaseTasksResponse { agent_ids })))
        }
    }

    struct Decide;
    impl tonic::server::UnaryService<roster::DelegateBatchRequest> for Decide {
        type Response = roster::DelegateBatchResponse;
        type Future = std::future::Ready<Result<tonic::Response<Self::Response>, tonic::Status>>;
        fn call(&mut self, request: tonic::Request<roster::DelegateBatchRequest>) -> Self::Future {
            let responses = request
                .into_inner()
                .requests
                .into_iter()
                .map(|request| roster::DelegateResponse {
                    decision: Some(roster::DelegationDecision {
                        decision: roster::DecisionKind::Delegate as i32,
                        primary_agent_id: format!("agent-for-{}", request.task_id),
                        ..Default::default()
                    }),
                    delegation_id: String::new(),
                })
                .collect();
            std::future::ready(Ok(tonic::Response::new(roster::DelegateBatchResponse { responses })))
        }
    }

    impl tower::Service<http::Request<tonic::body::Body>> for Older {
        type Response = http::Response<tonic::body::Body>;
        type Error = Infallible;
        type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
            let calls = self.0.clone();
            Box::pin(async move {
                let method = request.uri().path().rsplit('/').next().unwrap_or_default().to_owned();
                calls.lock().unwrap().push(method.clone());
                use tonic::server::Grpc;
                use tonic_prost::ProstCodec;
                Ok(match method.as_str() {
                    "ReleaseTasks" => Grpc::new(ProstCodec::default()).unary(Release, request).await,
                    "DelegateBatch" => Grpc::new(ProstCodec::default()).unary(Decide, request).await,
                    _ => tonic::Status::unimplemented("not in this version").into_http(),
                })
            })
        }
    }

    #[tokio::test]
    async fn a_roster_without_the_stream_is_asked_with_release_tasks_and_delegate_batch() {
        let older = Older::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(older.clone())
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}")).unwrap().connect_lazy();
        let roster = RosterClient::new(muster_runtime::auth::client::with_credentials(
            channel,
            muster_runtime::auth::client::Credentials::none(),
        ));
        let ask = |task: &str| DelegationAsk { task_id: task.to_owned(), ..DelegationAsk::default() };
        for round in 0..2 {
            let decisions = roster.place(vec![format!("done{round}")], vec![ask(&format!("next{round}"))]).await;
            let decisions = decisions.unwrap_or_else(|failure| panic!("round {round}: {failure:?}"));
            assert_eq!(decisions.len(), 1);
            assert_eq!(decisions[0].primary_agent_id, format!("agent-for-next{round}"));
        }
        let calls = older.0.lock().unwrap().clone();
        // The stream was tried once; then each placement in two calls.
        assert_eq!(
            calls,
            ["PlaceTasks", "ReleaseTasks", "DelegateBatch", "ReleaseTasks", "DelegateBatch"],
            "{calls:?}"
        );
        server.abort();
    }
}
