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
