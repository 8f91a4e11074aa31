//! The roster's delegations and releases sent together across executions:
//! while a few placements are in flight, the asks and releases of every
//! execution wait and go in the next one ([`Roster::place`]: the releases
//! first, then the delegations), so that a thousand executions each ending
//! a step and placing the next cost a handful of exchanges, not two
//! thousand calls. Alone, an ask or a release goes at once.
//!
//! A placement the roster refuses for the sake of one of its tasks is asked
//! again part by part, so each gets its own answer; one the roster cannot
//! take now fails each of its parts as unavailable (they are asked again).
//!
//! A placement with one ask is sent in the span the ask was made in (a
//! step's, so the roster's span sits under the step in the trace), one of
//! releases alone in theirs; any other has a span of its own. Each follows
//! from the spans of its other parts.

use std::{collections::HashSet, sync::Arc};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tracing::{Instrument as _, Span};

use super::roster::{AgentInfo, DelegationAsk, RoleGrants, Roster, RosterFailure};
use crate::{
    domain::model::{AgentContext, Decision},
    store::BoxFuture,
};

/// Placements in flight at once: one being decided, one on its way.
const IN_FLIGHT: usize = 2;
/// Most tasks in one placement.
const MOST: usize = 1000;

type Reply<T> = oneshot::Sender<Result<T, RosterFailure>>;

/// What an execution asks of the roster.
// Moved once, into the queue: boxing the ask would cost an allocation each.
#[allow(clippy::large_enum_variant)]
enum Part {
    /// A task to decide, and where its decision goes.
    Ask(DelegationAsk, Reply<Decision>),
    /// Tasks whose slots go back, and where the outcome goes.
    Release(Vec<String>, Reply<()>),
    /// Parts that go in the same placement ([`Roster::place`]).
    Together(Vec<Part>),
}

/// A roster whose delegations and releases go in batches.
pub(crate) struct Batched {
    inner: Arc<dyn Roster>,
    parts: mpsc::UnboundedSender<(Part, Span)>,
}

impl Batched {
    /// Batches `inner`'s calls; its task ends when it is dropped.
    pub(crate) fn new(inner: Arc<dyn Roster>) -> Self {
        let (parts, queued) = mpsc::unbounded_channel();
        tokio::spawn(send_parts(inner.clone(), queued));
        Self { inner, parts }
    }

    fn queue(&self, part: Part) -> Result<(), RosterFailure> {
        self.parts.send((part, Span::current())).map_err(|_| stopped())
    }
}

fn stopped() -> RosterFailure {
    RosterFailure::Unavailable("the service is stopping".to_owned())
}

async fn send_parts(inner: Arc<dyn Roster>, mut queue: mpsc::UnboundedReceiver<(Part, Span)>) {
    let in_flight = Arc::new(Semaphore::new(IN_FLIGHT));
    while let Some(first) = queue.recv().await {
        let Ok(slot) = in_flight.clone().acquire_owned().await else { return };
        let mut batch = Batch::default();
        batch.add(first, &inner);
        while batch.tasks < MOST {
            let Ok(next) = queue.try_recv() else { break };
            batch.add(next, &inner);
        }
        tokio::spawn(batch.send(inner.clone(), slot));
    }
}

/// The parts that go in one placement.
#[derive(Default)]
struct Batch {
    asks: Vec<(DelegationAsk, Reply<Decision>, Span)>,
    asked: HashSet<String>,
    releases: Vec<(Vec<String>, Reply<()>, Span)>,
    tasks: usize,
}

impl Batch {
    fn add(&mut self, (part, span): (Part, Span), inner: &Arc<dyn Roster>) {
        match part {
            // The roster takes a task once per placement: a second ask goes alone.
            Part::Ask(ask, reply) if !self.asked.insert(ask.task_id.clone()) => {
                tokio::spawn(ask_alone(inner.clone(), ask, reply, span));
            }
            Part::Ask(ask, reply) => {
                self.tasks += 1;
                self.asks.push((ask, reply, span));
            }
            Part::Release(task_ids, reply) => {
                self.tasks += task_ids.len();
                self.releases.push((task_ids, reply, span));
            }
            Part::Together(parts) => {
                for part in parts {
                    self.add((part, span.clone()), inner);
                }
            }
        }
    }

    /// The placement's span: the one ask's (the roster's span sits under
    /// its step), else a span of its own; either follows from the others.
    fn span(&self) -> Span {
        let mut spans = self.asks.iter().map(|(.., span)| span).chain(self.releases.iter().map(|(.., span)| span));
        let span = match (self.asks.as_slice(), self.asks.len() + self.releases.len()) {
            (_, 1) | ([_], _) => spans.next().cloned().unwrap_or_else(Span::none),
            _ => tracing::info_span!("roster batch", parts = self.asks.len() + self.releases.len()),
        };
        for part in spans {
            span.follows_from(part);
        }
        span
    }

    async fn send(self, inner: Arc<dyn Roster>, _slot: OwnedSemaphorePermit) {
        let span = self.span();
        let parts = self.asks.len() + self.releases.len();
        let Self { asks, releases, .. } = self;
        let questions = asks.iter().map(|(ask, ..)| ask.clone()).collect();
        let released = releases.iter().flat_map(|(task_ids, ..)| task_ids.iter().cloned()).collect();
        match inner.place(released, questions).instrument(span.clone()).await {
            Ok(decisions) => {
                for (_, reply, _) in releases {
                    let _ = reply.send(Ok(()));
                }
                for ((_, reply, _), decision) in asks.into_iter().zip(decisions) {
                    let _ = reply.send(Ok(decision));
                }
            }
            Err(failure) if matches!(failure, RosterFailure::Unavailable(_)) || parts == 1 => {
                for (_, reply, _) in releases {
                    let _ = reply.send(Err(failure.clone()));
                }
                for (_, reply, _) in asks {
                    let _ = reply.send(Err(failure.clone()));
                }
            }
            Err(failure) => {
                tracing::warn!(error = %failure.message(), parts, "the roster refused a placement; asking part by part");
                let released: Vec<String> =
                    releases.iter().flat_map(|(task_ids, ..)| task_ids.iter().cloned()).collect();
                if !released.is_empty() {
                    let outcome = inner.release_batch(released).instrument(span).await;
                    for (_, reply, _) in releases {
                        let _ = reply.send(outcome.clone());
                    }
                }
                for (ask, reply, span) in asks {
                    tokio::spawn(ask_alone(inner.clone(), ask, reply, span));
                }
            }
        }
    }
}

async fn ask_alone(inner: Arc<dyn Roster>, ask: DelegationAsk, reply: Reply<Decision>, span: Span) {
    let _ = reply.send(inner.delegate(ask).instrument(span).await);
}

impl Roster for Batched {
    fn delegate(&self, ask: DelegationAsk) -> BoxFuture<'_, Result<Decision, RosterFailure>> {
        let (reply, answer) = oneshot::channel();
        let sent = self.queue(Part::Ask(ask, reply));
        Box::pin(async move {
            sent?;
            answer.await.map_err(|_| stopped())?
        })
    }

    fn delegate_batch(&self, asks: Vec<DelegationAsk>) -> BoxFuture<'_, Result<Vec<Decision>, RosterFailure>> {
        self.inner.place(Vec::new(), asks)
    }

    fn watch_queued(&self, task_id: String) -> BoxFuture<'_, Result<Option<Decision>, RosterFailure>> {
        self.inner.watch_queued(task_id)
    }

    fn release(&self, task_id: String) -> BoxFuture<'_, Result<(), RosterFailure>> {
        self.release_batch(vec![task_id])
    }

    fn release_batch(&self, task_ids: Vec<String>) -> BoxFuture<'_, Result<(), RosterFailure>> {
        let (reply, answer) = oneshot::channel();
        let sent = self.queue(Part::Release(task_ids, reply));
        Box::pin(async move {
            sent?;
            answer.await.map_err(|_| stopped())?
        })
    }

    /// The releases and the asks go in the same placement, with whatever
    /// other executions queued; it fails if any of its parts does.
    fn place(
        &self,
        releases: Vec<String>,
        asks: Vec<DelegationAsk>,
    ) -> BoxFuture<'_, Result<Vec<Decision>, RosterFailure>> {
        let mut parts = Vec::with_capacity(asks.len() + 1);
        let released = (!releases.is_empty()).then(|| {
            let (reply, answer) = oneshot::channel();
            parts.push(Part::Release(releases, reply));
            answer
        });
        let answers: Vec<_> = asks
            .into_iter()
            .map(|ask| {
                let (reply, answer) = oneshot::channel();
                parts.push(Part::Ask(ask, reply));
                answer
            })
            .collect();
        let sent = if parts.is_empty() { Ok(()) } else { self.queue(Part::Together(parts)) };
        Box::pin(async move {
            sent?;
            if let Some(released) = released {
                released.await.map_err(|_| stopped())??;
            }
            let mut decisions = Vec::with_capacity(answers.len());
            for answer in answers {
                decisions.push(answer.await.map_err(|_| stopped())??);
            }
            Ok(decisions)
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
            self.place(Vec::new(), asks)
        }
        fn place(
            &self,
            releases: Vec<String>,
            asks: Vec<DelegationAsk>,
        ) -> BoxFuture<'_, Result<Vec<Decision>, RosterFailure>> {
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                let tasks: HashSet<&str> = asks.iter().map(|ask| ask.task_id.as_str()).collect();
                if tasks.len() < asks.len() {
                    self.calls.lock().unwrap().push("a task twice in a batch".to_owned());
                    return Err(RosterFailure::Refused("a task asked about twice".to_owned()));
                }
                self.calls.lock().unwrap().push(format!("place {} + batch of {}", releases.join(","), asks.len()));
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
        assert!(calls.iter().all(|call| call.starts_with("place  + batch of")), "{calls:?}");
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
        // The one refusal did not cost the tasks it went with their answers.
        let together = |call: &String| call.rsplit(' ').next().and_then(|asks| asks.parse::<usize>().ok()).unwrap_or(0);
        assert!(calls.iter().any(|call| together(call) > 1), "{calls:?}");
    }

    #[tokio::test]
    async fn a_batch_the_roster_cannot_take_now_fails_each_ask_as_unavailable() {
        let tasks = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"];
        let (answers, calls) = ask_all(Slow { unavailable: true, ..Slow::default() }, &tasks).await;
        assert!(calls.iter().all(|call| call.starts_with("place ")), "no ask was asked again: {calls:?}");
        assert!(answers.iter().all(|answer| matches!(answer, Err(RosterFailure::Unavailable(_)))), "{answers:?}");
    }

    #[tokio::test]
    async fn the_same_task_asked_twice_at_once_goes_alone_the_second_time() {
        let (answers, calls) = ask_all(Slow::default(), &["x", "y", "z", "a", "b", "c", "a", "d"]).await;
        assert!(answers.iter().all(Result::is_ok), "{answers:?}");
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
        let released: usize = calls
            .iter()
            .map(|call| call.trim_start_matches("place ").trim_end_matches(" + batch of 0").split(',').count())
            .sum();
        assert_eq!(released, 50, "{calls:?}");
        assert!(calls.len() <= 2 * IN_FLIGHT, "50 releases in {} calls: {calls:?}", calls.len());
    }

    #[tokio::test]
    async fn releases_and_asks_that_wait_go_in_one_placement_the_releases_first() {
        let slow = Arc::new(Slow::default());
        let batched = Arc::new(Batched::new(slow.clone()));
        let mut waits = Vec::new();
        for index in 0..20 {
            let (releasing, asking) = (batched.clone(), batched.clone());
            waits.push(tokio::spawn(async move { releasing.release(format!("done{index}")).await.map(|()| None) }));
            waits.push(tokio::spawn(async move { asking.delegate(ask(&format!("next{index}"))).await.map(Some) }));
        }
        for (index, wait) in waits.into_iter().enumerate() {
            match wait.await.unwrap().unwrap() {
                Some(decision) => assert_eq!(decision.primary_agent_id, format!("agent-for-next{}", index / 2)),
                None => assert_eq!(index % 2, 0, "a release answered an ask"),
            }
        }
        let calls = slow.calls.lock().unwrap().clone();
        assert!(calls.len() <= 2 * IN_FLIGHT, "40 parts in {} placements: {calls:?}", calls.len());
        assert!(
            calls.iter().any(|call| call.starts_with("place done") && !call.ends_with("batch of 0")),
            "releases and asks went together: {calls:?}"
        );
    }

    #[tokio::test]
    async fn slots_given_back_and_asks_placed_together_go_in_one_placement() {
        let slow = Arc::new(Slow::default());
        let batched = Arc::new(Batched::new(slow.clone()));
        // A call in flight, so what follows waits and is batched.
        let busy = {
            let batched = batched.clone();
            tokio::spawn(async move { batched.release("busy".to_owned()).await })
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        let mut placed = Vec::new();
        for index in 0..10 {
            let batched = batched.clone();
            placed.push(tokio::spawn(async move {
                batched
                    .place(vec![format!("done{index}")], vec![ask(&format!("a{index}")), ask(&format!("b{index}"))])
                    .await
            }));
        }
        for (index, placed) in placed.into_iter().enumerate() {
            let decisions = placed.await.unwrap().unwrap();
            let agents: Vec<_> = decisions.iter().map(|decision| decision.primary_agent_id.as_str()).collect();
            assert_eq!(agents, [format!("agent-for-a{index}"), format!("agent-for-b{index}")]);
        }
        busy.await.unwrap().unwrap();
        assert!(batched.place(Vec::new(), Vec::new()).await.unwrap().is_empty());
        let calls = slow.calls.lock().unwrap().clone();
        // Never split: each placement holds a release for every two asks.
        for call in &calls[1..] {
            let (released, asks) = call.trim_start_matches("place ").split_once(" + batch of ").unwrap();
            assert_eq!(released.split(',').count() * 2, asks.parse::<usize>().unwrap(), "{calls:?}");
        }
        assert!(calls.len() <= 3, "ten placements in {} calls: {calls:?}", calls.len());
        // One that fails fails whole.
        let refusing = Batched::new(Arc::new(Slow { refuse: Some("c"), ..Slow::default() }));
        let refused = refusing.place(vec!["done".to_owned()], vec![ask("c")]).await;
        assert_eq!(refused.unwrap_err(), RosterFailure::Refused("c is refused".to_owned()));
    }
}
