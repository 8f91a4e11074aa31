//! The roster's delegations and releases sent together across executions:
//! while a few calls of a kind are in flight, the asks of every execution
//! wait and go in the next one (`DelegateBatch`, `ReleaseTasks`), so that a
//! thousand executions each placing a step cost a handful of calls, not a
//! thousand. Alone, an ask goes at once as a call of its own.
//!
//! A batch the roster refuses for the sake of one of its tasks is asked
//! again task by task, so each gets its own answer; one the roster cannot
//! take now fails each of its asks as unavailable (they are asked again).
//!
//! An ask sent alone is sent in the span it was made in (a step's, so the
//! roster's span sits under the step in the trace); a batch has a span of
//! its own that follows from each of its asks'.

use std::{collections::HashSet, sync::Arc};

use tokio::sync::{Semaphore, mpsc, oneshot};
use tracing::{Instrument as _, Span};

use super::roster::{AgentInfo, DelegationAsk, RoleGrants, Roster, RosterFailure};
use crate::{
    domain::model::{AgentContext, Decision},
    store::BoxFuture,
};

/// Calls of each kind in flight at once.
const IN_FLIGHT: usize = 4;
/// Most tasks in one call.
const MOST: usize = 1000;

type Reply<T> = oneshot::Sender<Result<T, RosterFailure>>;
/// An ask, where its answer goes, and the span it was made in.
type Asked = (DelegationAsk, Reply<Decision>, Span);
/// Tasks to release, where the outcome goes, and the span they were given in.
type Released = (Vec<String>, Reply<()>, Span);

/// A roster whose delegations and releases go in batches.
pub(crate) struct Batched {
    inner: Arc<dyn Roster>,
    asks: mpsc::UnboundedSender<Asked>,
    releases: mpsc::UnboundedSender<Released>,
}

impl Batched {
    /// Batches `inner`'s calls; its tasks end when it is dropped.
    pub(crate) fn new(inner: Arc<dyn Roster>) -> Self {
        let (asks, asked) = mpsc::unbounded_channel();
        let (releases, released) = mpsc::unbounded_channel();
        tokio::spawn(send_asks(inner.clone(), asked));
        tokio::spawn(send_releases(inner.clone(), released));
        Self { inner, asks, releases }
    }
}

fn stopped() -> RosterFailure {
    RosterFailure::Unavailable("the service is stopping".to_owned())
}

/// A batch's span, following from each of its parts' spans.
fn batch_span<'a>(name: &'static str, parts: impl Iterator<Item = &'a Span>) -> Span {
    let span = tracing::info_span!("roster batch", call = name, tasks = tracing::field::Empty);
    let mut count = 0;
    for part in parts {
        span.follows_from(part);
        count += 1;
    }
    span.record("tasks", count);
    span
}

async fn send_asks(inner: Arc<dyn Roster>, mut queue: mpsc::UnboundedReceiver<Asked>) {
    let in_flight = Arc::new(Semaphore::new(IN_FLIGHT));
    while let Some(first) = queue.recv().await {
        let Ok(slot) = in_flight.clone().acquire_owned().await else { return };
        let mut tasks = HashSet::from([first.0.task_id.clone()]);
        let mut batch = vec![first];
        while batch.len() < MOST {
            let Ok(next) = queue.try_recv() else { break };
            // The roster takes a task once per batch: a second ask goes alone.
            if tasks.insert(next.0.task_id.clone()) {
                batch.push(next);
            } else {
                tokio::spawn(ask_alone(inner.clone(), next));
            }
        }
        let inner = inner.clone();
        tokio::spawn(async move {
            let _slot = slot;
            if batch.len() == 1 {
                return ask_alone(inner, batch.remove(0)).await;
            }
            let asks = batch.iter().map(|(ask, ..)| ask.clone()).collect();
            let span = batch_span("DelegateBatch", batch.iter().map(|(.., span)| span));
            match inner.delegate_batch(asks).instrument(span).await {
                Ok(decisions) => {
                    for ((_, reply, _), decision) in batch.into_iter().zip(decisions) {
                        let _ = reply.send(Ok(decision));
                    }
                }
                Err(failure @ RosterFailure::Unavailable(_)) => {
                    for (_, reply, _) in batch {
                        let _ = reply.send(Err(failure.clone()));
                    }
                }
                Err(failure) => {
                    tracing::warn!(error = %failure.message(), tasks = batch.len(), "the roster refused a batch; asking task by task");
                    for asked in batch {
                        tokio::spawn(ask_alone(inner.clone(), asked));
                    }
                }
            }
        });
    }
}

async fn ask_alone(inner: Arc<dyn Roster>, (ask, reply, span): Asked) {
    let _ = reply.send(inner.delegate(ask).instrument(span).await);
}

async fn send_releases(inner: Arc<dyn Roster>, mut queue: mpsc::UnboundedReceiver<Released>) {
    let in_flight = Arc::new(Semaphore::new(IN_FLIGHT));
    while let Some(first) = queue.recv().await {
        let Ok(slot) = in_flight.clone().acquire_owned().await else { return };
        let mut tasks = first.0.len();
        let mut batch = vec![first];
        while tasks < MOST {
            let Ok(next) = queue.try_recv() else { break };
            tasks += next.0.len();
            batch.push(next);
        }
        let inner = inner.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let span = match batch.as_slice() {
                [(.., span)] => span.clone(),
                _ => batch_span("ReleaseTasks", batch.iter().map(|(.., span)| span)),
            };
            let mut task_ids: Vec<String> = Vec::with_capacity(tasks);
            let mut replies = Vec::with_capacity(batch.len());
            for (ids, reply, _) in batch {
                task_ids.extend(ids);
                replies.push(reply);
            }
            let released = match task_ids.as_slice() {
                [task_id] => inner.release(task_id.clone()).instrument(span).await,
                _ => inner.release_batch(task_ids).instrument(span).await,
            };
            for reply in replies {
                let _ = reply.send(released.clone());
            }
        });
    }
}

impl Roster for Batched {
    fn delegate(&self, ask: DelegationAsk) -> BoxFuture<'_, Result<Decision, RosterFailure>> {
        let (reply, answer) = oneshot::channel();
        let sent = self.asks.send((ask, reply, Span::current()));
        Box::pin(async move {
            sent.map_err(|_| stopped())?;
            answer.await.map_err(|_| stopped())?
        })
    }

    fn delegate_batch(&self, asks: Vec<DelegationAsk>) -> BoxFuture<'_, Result<Vec<Decision>, RosterFailure>> {
        self.inner.delegate_batch(asks)
    }

    fn watch_queued(&self, task_id: String) -> BoxFuture<'_, Result<Option<Decision>, RosterFailure>> {
        self.inner.watch_queued(task_id)
    }

    fn release(&self, task_id: String) -> BoxFuture<'_, Result<(), RosterFailure>> {
        self.release_batch(vec![task_id])
    }

    fn release_batch(&self, task_ids: Vec<String>) -> BoxFuture<'_, Result<(), RosterFailure>> {
        let (reply, answer) = oneshot::channel();
        let sent = self.releases.send((task_ids, reply, Span::current()));
        Box::pin(async move {
            sent.map_err(|_| stopped())?;
            answer.await.map_err(|_| stopped())?
        })
    }

    fn agent(&self, agent_id: String) -> BoxFuture<'_, Result<AgentInfo, RosterFailure>> {
        self.inner.agent(agent_id)
    }

    fn agent_context(&self, agent_id: String) -> BoxFuture<'_, Result<AgentContext, RosterFailure>> {
        self.inner.agent_context(agent_id)
    }

    fn role_grants(&self, role: String) -> BoxFuture<'_, Result<RoleGrants, RosterFailure>> {
        self.inner.role_grants(role)
    }

    fn validation_context(&self) -> BoxFuture<'_, Result<muster_format::Context, RosterFailure>> {
        self.inner.validation_context()
    }
}

#[cfg(test)]
mod tests {
    use std::{sync::Mutex, time::Duration};

    use super::*;

    /// A roster that answers after a pause (so asks pile up behind the
    /// calls in flight), recording every call; `refuse` makes a batch
    /// holding that task refused, and the task refused alone.
    #[derive(Default)]
    struct Slow {
        calls: Mutex<Vec<String>>,
        refuse: Option<&'static str>,
        unavailable: bool,
    }

    impl Slow {
        fn decide(&self, ask: &DelegationAsk) -> Result<Decision, RosterFailure> {
            if self.refuse == Some(ask.task_id.as_str()) {
                return Err(RosterFailure::Refused(format!("{} is refused", ask.task_id)));
            }
            Ok(Decision { primary_agent_id: format!("agent-for-{}", ask.task_id), ..Decision::default() })
        }
    }

    impl Roster for Slow {
        fn delegate(&self, ask: DelegationAsk) -> BoxFuture<'_, Result<Decision, RosterFailure>> {
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                self.calls.lock().unwrap().push(format!("delegate {}", ask.task_id));
                self.decide(&ask)
            })
        }
        fn delegate_batch(&self, asks: Vec<DelegationAsk>) -> BoxFuture<'_, Result<Vec<Decision>, RosterFailure>> {
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                let tasks: HashSet<&str> = asks.iter().map(|ask| ask.task_id.as_str()).collect();
                if tasks.len() < asks.len() {
                    self.calls.lock().unwrap().push("a task twice in a batch".to_owned());
                    return Err(RosterFailure::Refused("a task asked about twice".to_owned()));
                }
                self.calls.lock().unwrap().push(format!("batch of {}", asks.len()));
                if self.unavailable {
                    return Err(RosterFailure::Unavailable("restarting".to_owned()));
                }
                asks.iter().map(|ask| self.decide(ask)).collect()
            })
        }
        fn watch_queued(&self, _: String) -> BoxFuture<'_, Result<Option<Decision>, RosterFailure>> {
            Box::pin(async { Ok(None) })
        }
        fn release(&self, task_id: String) -> BoxFuture<'_, Result<(), RosterFailure>> {
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                self.calls.lock().unwrap().push(format!("release {task_id}"));
                Ok(())
            })
        }
        fn release_batch(&self, task_ids: Vec<String>) -> BoxFuture<'_, Result<(), RosterFailure>> {
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                self.calls.lock().unwrap().push(format!("release {}", task_ids.join(",")));
                Ok(())
            })
        }
        fn agent(&self, agent_id: String) -> BoxFuture<'_, Result<AgentInfo, RosterFailure>> {
            Box::pin(async move { Err(RosterFailure::NotFound(agent_id)) })
        }
        fn agent_context(&self, agent_id: String) -> BoxFuture<'_, Result<AgentContext, RosterFailure>> {
            Box::pin(async move { Err(RosterFailure::NotFound(agent_id)) })
        }
        fn role_grants(&self, _: String) -> BoxFuture<'_, Result<RoleGrants, RosterFailure>> {
            Box::pin(async { Ok(RoleGrants::default()) })
        }
        fn validation_context(&self) -> BoxFuture<'_, Result<muster_format::Context, RosterFailure>> {
            Box::pin(async { Ok(muster_format::Context::default()) })
        }
    }

    fn ask(task_id: &str) -> DelegationAsk {
        DelegationAsk { task_id: task_id.to_owned(), ..DelegationAsk::default() }
    }

    /// Asks `tasks` at once through a batching roster over `slow`; the answers and the calls made.
    async fn ask_all(slow: Slow, tasks: &[&str]) -> (Vec<Result<Decision, RosterFailure>>, Vec<String>) {
        let slow = Arc::new(slow);
        let batched = Arc::new(Batched::new(slow.clone()));
        let asks: Vec<_> = tasks
            .iter()
            .map(|task| {
                let batched = batched.clone();
                let task = ask(task);
                tokio::spawn(async move { batched.delegate(task).await })
            })
            .collect();
        let mut answers = Vec::new();
        for asked in asks {
            answers.push(asked.await.unwrap());
        }
        let calls = slow.calls.lock().unwrap().clone();
        (answers, calls)
    }

    #[tokio::test]
    async fn asks_that_wait_for_the_calls_in_flight_go_together_each_with_its_own_answer() {
        let tasks: Vec<String> = (0..100).map(|index| format!("t{index}")).collect();
        let tasks: Vec<&str> = tasks.iter().map(String::as_str).collect();
        let (answers, calls) = ask_all(Slow::default(), &tasks).await;
        for (task, answer) in tasks.iter().zip(answers) {
            assert_eq!(answer.unwrap().primary_agent_id, format!("agent-for-{task}"));
        }
        assert!(calls.len() <= 2 * IN_FLIGHT, "100 asks in {} calls: {calls:?}", calls.len());
        assert!(calls.iter().any(|call| call.starts_with("batch of")), "{calls:?}");
    }

    #[tokio::test]
    async fn a_batch_refused_for_one_task_is_asked_task_by_task() {
        let tasks = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"];
        let (answers, calls) = ask_all(Slow { refuse: Some("c"), ..Slow::default() }, &tasks).await;
        for (task, answer) in tasks.iter().zip(answers) {
            match answer {
                Ok(decision) => assert_eq!(decision.primary_agent_id, format!("agent-for-{task}")),
                Err(failure) => assert_eq!((*task, failure), ("c", RosterFailure::Refused("c is refused".to_owned()))),
            }
        }
        assert!(calls.iter().any(|call| call == "delegate c"), "{calls:?}");
    }

    #[tokio::test]
    async fn a_batch_the_roster_cannot_take_now_fails_each_ask_as_unavailable() {
        let tasks = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"];
        let (answers, calls) = ask_all(Slow { unavailable: true, ..Slow::default() }, &tasks).await;
        let batched = calls.iter().filter(|call| call.starts_with("batch of")).count();
        assert!(batched > 0, "{calls:?}");
        let unavailable = answers.iter().filter(|answer| matches!(answer, Err(RosterFailure::Unavailable(_)))).count();
        // Only the asks that went alone (the first, before any call was in flight) were answered.
        assert!(unavailable >= tasks.len() - IN_FLIGHT, "{answers:?}");
        assert!(calls.iter().all(|call| call.starts_with("batch of") || call.starts_with("delegate ")), "{calls:?}");
    }

    #[tokio::test]
    async fn the_same_task_asked_twice_at_once_goes_alone_the_second_time() {
        let (answers, calls) = ask_all(Slow::default(), &["x", "y", "z", "a", "b", "c", "a", "d"]).await;
        assert!(answers.iter().all(Result::is_ok), "{answers:?}");
        assert!(calls.iter().any(|call| call.starts_with("batch of")), "{calls:?}");
        assert!(!calls.iter().any(|call| call == "a task twice in a batch"), "{calls:?}");
        assert!(calls.iter().any(|call| call == "delegate a"), "the second ask of a went alone: {calls:?}");
    }

    #[tokio::test]
    async fn releases_that_wait_go_together() {
        let slow = Arc::new(Slow::default());
        let batched = Arc::new(Batched::new(slow.clone()));
        let releases: Vec<_> = (0..50)
            .map(|index| {
                let batched = batched.clone();
                tokio::spawn(async move { batched.release(format!("t{index}")).await })
            })
            .collect();
        for released in releases {
            released.await.unwrap().unwrap();
        }
        let calls = slow.calls.lock().unwrap().clone();
        let released: usize = calls.iter().map(|call| call.trim_start_matches("release ").split(',').count()).sum();
        assert_eq!(released, 50, "{calls:?}");
        assert!(calls.len() <= 2 * IN_FLIGHT, "50 releases in {} calls: {calls:?}", calls.len());
    }
}
