//! The engine on its own: a real store (a SQLite file), a roster and
//! workers of the test's making.

mod progress;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::sync::mpsc;

use super::{
    Engine, Settings, StartRequest,
    workers::{Connection, ServedAgent, ToWorker},
};
use crate::{
    clients::roster::{AgentInfo, DelegationAsk, RoleGrants, Roster, RosterFailure},
    domain::{
        ExecutionStatus, StepStatus,
        model::{AgentContext, Decision, DecisionKind, Event, EventKind, Outcome, RoleDefinition, Tool, ToolOutput},
    },
    store::{BoxFuture, SqlStore, Store},
};

/// A roster that knows a few agents and decides delegations with a rule of
/// the test's; it records what it was asked.
#[derive(Default)]
struct FakeRoster {
    agents: Vec<&'static str>,
    /// Agent chosen for a delegation, from the agents not in the chain.
    delegates: Vec<&'static str>,
    /// Agents at capacity: a step assigned to one is queued.
    full: Vec<&'static str>,
    /// Whether a queued task gets its agent's slot soon after (else never).
    queue_resolves: bool,
    /// Agents offline: a step assigned to one is escalated, to nobody.
    offline: Vec<&'static str>,
    /// How long an ask only if free takes to answer.
    ahead_delay: Duration,
    /// Releases answered UNAVAILABLE before the roster takes them.
    unavailable_releases: std::sync::atomic::AtomicUsize,
    /// The role each agent has, by agent.
    roles: HashMap<&'static str, RoleDefinition>,
    asked: Mutex<Vec<DelegationAsk>>,
    /// The size of each batch asked for.
    batches: Mutex<Vec<usize>>,
    released: Mutex<Vec<String>>,
    /// How many times an agent was asked about (`GetAgent`).
    agents_asked: std::sync::atomic::AtomicUsize,
    /// How many times an agent's context was asked for.
    contexts_asked: std::sync::atomic::AtomicUsize,
    /// How long asking about an agent, or for its context, takes.
    agent_delay: Duration,
}

impl Roster for FakeRoster {
    fn delegate(&self, ask: DelegationAsk) -> BoxFuture<'_, Result<Decision, RosterFailure>> {
        let chosen = self.delegates.iter().find(|agent| !ask.delegation_chain.iter().any(|passed| passed == *agent));
        let assigned = ask.assigned_agent_id.as_str();
        let decision = match chosen {
            _ if self.full.contains(&assigned) => Decision {
                kind: DecisionKind::Queue,
                primary_agent_id: assigned.to_owned(),
                wait_seconds: 60,
                reasoning: format!("{assigned} is at capacity"),
                ..Decision::default()
            },
            _ if self.offline.contains(&assigned) => Decision {
                kind: DecisionKind::Escalate,
                reasoning: format!("{assigned} is offline and nobody is senior to the requester"),
                ..Decision::default()
            },
            _ if self.agents.contains(&assigned) => Decision {
                kind: DecisionKind::Delegate,
                primary_agent_id: assigned.to_owned(),
                reasoning: format!("{assigned} is assigned the task"),
                ..Decision::default()
            },
            _ if !assigned.is_empty() => Decision {
                kind: DecisionKind::Escalate,
                reasoning: format!("{assigned} is not in the roster"),
                ..Decision::default()
            },
            Some(agent) => Decision {
                kind: DecisionKind::Delegate,
                primary_agent_id: (*agent).to_owned(),
                reasoning: format!("{agent} has the expertise"),
                ..Decision::default()
            },
            None => {
                Decision { kind: DecisionKind::Escalate, reasoning: "nobody is left".to_owned(), ..Decision::default() }
            }
        };
        let delay = if ask.only_if_free { self.ahead_delay } else { Duration::ZERO };
        self.asked.lock().unwrap().push(ask);
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            Ok(decision)
        })
    }

    fn delegate_batch(&self, asks: Vec<DelegationAsk>) -> BoxFuture<'_, Result<Vec<Decision>, RosterFailure>> {
        self.batches.lock().unwrap().push(asks.len());
        let answers: Vec<_> = asks.into_iter().map(|ask| self.delegate(ask)).collect();
        Box::pin(async move {
            let mut decisions = Vec::new();
            for answer in answers {
                decisions.push(answer.await?);
            }
            Ok(decisions)
        })
    }

    fn watch_queued(&self, _task_id: String) -> BoxFuture<'_, Result<Option<Decision>, RosterFailure>> {
        let resolution = self.queue_resolves.then(|| Decision {
            kind: DecisionKind::Delegate,
            primary_agent_id: self.full.first().copied().unwrap_or_default().to_owned(),
            reasoning: "a slot freed".to_owned(),
            ..Decision::default()
        });
        Box::pin(async move {
            match resolution {
                Some(decision) => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    Ok(Some(decision))
                }
                None => std::future::pending().await,
            }
        })
    }

    fn release(&self, task_id: String) -> BoxFuture<'_, Result<(), RosterFailure>> {
        self.release_batch(vec![task_id])
    }

    fn release_batch(&self, task_ids: Vec<String>) -> BoxFuture<'_, Result<(), RosterFailure>> {
        let unavailable = self
            .unavailable_releases
            .fetch_update(std::sync::atomic::Ordering::SeqCst, std::sync::atomic::Ordering::SeqCst, |left| {
                left.checked_sub(1)
            })
            .is_ok();
        if !unavailable {
            self.released.lock().unwrap().extend(task_ids);
        }
        Box::pin(
            async move { if unavailable { Err(RosterFailure::Unavailable("restarting".to_owned())) } else { Ok(()) } },
        )
    }

    fn agent(&self, agent_id: String) -> BoxFuture<'_, Result<AgentInfo, RosterFailure>> {
        self.agents_asked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let known = self.agents.contains(&agent_id.as_str());
        let delay = self.agent_delay;
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            if known {
                Ok(AgentInfo { id: agent_id, allow_delegation: true, ..AgentInfo::default() })
            } else {
                Err(RosterFailure::NotFound(format!("agent '{agent_id}' is not in the roster")))
            }
        })
    }

    fn agent_context(&self, agent_id: String) -> BoxFuture<'_, Result<AgentContext, RosterFailure>> {
        self.contexts_asked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let known = self.agents.contains(&agent_id.as_str());
        let role = self.roles.get(agent_id.as_str()).cloned();
        let delay = self.agent_delay;
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            if known {
                Ok(AgentContext {
                    max_iterations: 10,
                    system_prompt: "be brief".into(),
                    roster_role: role.as_ref().map(|role| role.name.clone()).unwrap_or_default(),
                    role_definition: role,
                    ..AgentContext::default()
                })
            } else {
                Err(RosterFailure::NotFound(agent_id))
            }
        })
    }

    fn role_grants(&self, _role: String) -> BoxFuture<'_, Result<RoleGrants, RosterFailure>> {
        Box::pin(async { Ok(RoleGrants::default()) })
    }

    fn validation_context(&self) -> BoxFuture<'_, Result<muster_format::Context, RosterFailure>> {
        let agents = self
            .agents
            .iter()
            .map(|id| muster_format::KnownAgent { id: (*id).to_owned(), role: None, offline: false })
            .collect();
        Box::pin(async move { Ok(muster_format::Context { agents: Some(agents), roles: None, tools: None }) })
    }
}

/// What a fake worker does with an assignment.
#[derive(Clone, Copy)]
enum Behaviour {
    /// Completes it, with `{"step": id}`.
    Complete,
    /// Fails the first attempt (retryable), completes the next.
    FailOnce,
    /// Never answers.
    Hold,
    /// Completes every step but this one, which it never answers.
    HoldStep(&'static str),
    /// Completes it, asking to remember "learnt in <step id>".
    Remember,
}

/// A SQLite file and the engine on it, removed when dropped.
struct Harness {
    engine: Arc<Engine>,
    roster: Arc<FakeRoster>,
    file: std::path::PathBuf,
    /// Every assignment a worker of the harness received, in order.
    received: Arc<Mutex<Vec<Arc<crate::domain::model::Assignment>>>>,
}

impl Drop for Harness {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", self.file.display()));
        }
    }
}

fn settings() -> Settings {
    Settings {
        max_parallel: 16,
        worker_lease: Duration::from_secs(30),
        schedule_to_start: None,
        ownership_lease: Duration::from_secs(30),
        replica_identity: String::new(),
    }
}

async fn engine_on(file: &std::path::Path, roster: Arc<FakeRoster>, settings: Settings) -> Arc<Engine> {
    engine_over(SqlStore::connect(&format!("sqlite://{}", file.display()), 1, 2).unwrap(), roster, settings).await
}

async fn engine_over(store: SqlStore, roster: Arc<FakeRoster>, settings: Settings) -> Arc<Engine> {
    let store: Arc<dyn Store> = Arc::new(store);
    store.migrate().await.unwrap();
    let engine = Engine::new(store, roster, settings);
    engine.join("", "").await.unwrap();
    engine.load_matrix().await.unwrap();
    engine
}

impl Harness {
    async fn new(roster: FakeRoster, settings: Settings) -> Self {
        Self::with_store(roster, settings).await.0
    }

    /// [`Harness::new`], and its store, for a test that counts its transactions.
    async fn with_store(roster: FakeRoster, settings: Settings) -> (Self, SqlStore) {
        let file = std::env::temp_dir().join(format!("muster-engine-{}.db", uuid::Uuid::new_v4().simple()));
        let store = SqlStore::connect(&format!("sqlite://{}", file.display()), 1, 2).unwrap();
        let roster = Arc::new(roster);
        let engine = engine_over(store.clone(), roster.clone(), settings).await;
        (Self { engine, roster, file, received: Arc::default() }, store)
    }

    /// A worker serving `agents`; its task ends when its connection does.
    fn worker(&self, agents: &[&str], behaviour: Behaviour) -> u64 {
        let (sender, mut inbox) = mpsc::unbounded_channel();
        let worker_id = self.engine.workers.register(Connection {
            name: "test".to_owned(),
            agents: agents
                .iter()
                .map(|agent| ServedAgent {
                    agent_id: (*agent).to_owned(),
                    token: muster_runtime::auth::TokenHash::of(agent),
                })
                .collect(),
            tools: Vec::new(),
            max_concurrency: 64,
            opened_with: None,
            relayed_by: None,
            sender,
        });
        let workers = self.engine.workers.clone();
        let received = self.received.clone();
        tokio::spawn(async move {
            while let Some(message) = inbox.recv().await {
                let ToWorker::Assignment(assignment) = message else { continue };
                received.lock().unwrap().push(assignment.clone());
                let outcome = match behaviour {
                    Behaviour::Hold => continue,
                    Behaviour::HoldStep(step) if assignment.step_id == step => continue,
                    Behaviour::FailOnce if assignment.attempt == 1 => Outcome::Failed {
                        error_code: "FLAKY".to_owned(),
                        message: "first attempts fail".to_owned(),
                        retryable: true,
                    },
                    _ => Outcome::Completed {
                        output_json: format!(r#"{{"step":"{}"}}"#, assignment.step_id),
                        output_value: None,
                        tokens_used: 1,
                        cost: 0.0,
                        duration_ms: 0,
                        iterations: 1,
                        post_to_inbox: String::new(),
                        remember: match behaviour {
                            Behaviour::Remember => vec![(Some(true), format!("learnt in {}", assignment.step_id))],
                            _ => Vec::new(),
                        },
                        skip_triggers: false,
                    },
                };
                workers.complete(worker_id, &assignment.assignment_id, outcome);
            }
        });
        worker_id
    }

    /// A worker providing `tools` (name, input schema), answering each call with `answer`.
    fn tool_worker(&self, tools: &[(&str, &str)], answer: fn(&str, serde_json::Value) -> ToolOutput) {
        let (sender, mut inbox) = mpsc::unbounded_channel();
        let worker_id = self.engine.workers.register(Connection {
            name: "tools".to_owned(),
            agents: Vec::new(),
            tools: tools
                .iter()
                .map(|(name, schema)| Tool {
                    name: (*name).to_owned(),
                    description: String::new(),
                    input_schema_json: (*schema).to_owned(),
                })
                .collect(),
            max_concurrency: 64,
            opened_with: None,
            relayed_by: None,
            sender,
        });
        let workers = self.engine.workers.clone();
        tokio::spawn(async move {
            while let Some(message) = inbox.recv().await {
                if let ToWorker::ToolCall(call) = message {
                    let input = serde_json::from_str(&call.input_json).unwrap();
                    workers.complete_tool_call(worker_id, &call.call_id, answer(&call.tool, input));
                }
            }
        });
    }

    /// An operator's intervention on a step, applied.
    async fn intervene(&self, execution_id: &str, step_id: &str, action: super::InterventionAction) {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let intervention = super::Intervention {
            step_id: Some(step_id.to_owned()),
            action,
            by: "operator:test".to_owned(),
            reason: String::new(),
            matrix_version: 0,
        };
        assert!(self.engine.control(execution_id, super::Control::Intervene { intervention, reply }));
        answer.await.unwrap().unwrap();
    }

    async fn run(&self, source: &str) -> String {
        let (process, _) = self.engine.publish(source.to_owned()).await.unwrap();
        let execution = self.engine.start(start_request(process, "")).await.unwrap();
        execution.id
    }

    /// Waits for the execution to end; returns its events.
    async fn finished(&self, execution_id: &str) -> (ExecutionStatus, Vec<Event>) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let execution = self.engine.store.execution(execution_id).await.unwrap().unwrap();
            if execution.status.is_final() {
                let events = self
                    .engine
                    .store
                    .events_after(execution_id, 0, 100_000)
                    .await
                    .unwrap()
                    .iter()
                    .map(|bytes| decode(bytes))
                    .collect();
                return (execution.status, events);
            }
            assert!(tokio::time::Instant::now() < deadline, "{execution_id} did not end");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn steps(&self, execution_id: &str) -> HashMap<String, crate::domain::model::Step> {
        self.engine.store.steps(execution_id).await.unwrap().into_iter().collect()
    }

    async fn wait_for(&self, execution_id: &str, step_id: &str, status: StepStatus) -> crate::domain::model::Step {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let step = self.steps(execution_id).await.remove(step_id).unwrap();
            if step.status == status {
                return step;
            }
            assert!(tokio::time::Instant::now() < deadline, "{step_id} never became {status:?}: {step:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// An event as stored, back in the domain's terms that the tests look at.
fn decode(bytes: &[u8]) -> Event {
    use muster_proto::common::v1::{EventType, StepEvent};
    let wire = <StepEvent as prost::Message>::decode(bytes).unwrap();
    let kind = match EventType::try_from(wire.event_type).unwrap() {
        EventType::StepStarted => EventKind::StepStarted,
        EventType::StepCompleted => EventKind::StepCompleted,
        EventType::StepFailed => EventKind::StepFailed,
        EventType::StepDelegated => EventKind::StepDelegated,
        EventType::ExecutionFinished => EventKind::ExecutionFinished,
        EventType::ExecutionStarted => EventKind::ExecutionStarted,
        EventType::StepIntervened => EventKind::StepIntervened,
        EventType::StepQueued => EventKind::StepQueued,
        EventType::StepEscalated => EventKind::StepEscalated,
        EventType::BudgetExceeded => EventKind::BudgetExceeded,
        EventType::StepProgress => EventKind::StepProgress,
        other => panic!("unexpected {other:?}"),
    };
    let mut execution = crate::domain::model::Execution {
        id: wire.execution_id,
        process_name: wire.process_name,
        process_version: wire.process_version,
        status: ExecutionStatus::Running,
        reason: String::new(),
        lead_agent_id: String::new(),
        inputs_json: String::new(),
        idempotency_key: None,
        started_at: 0,
        ended_at: None,
        last_sequence: wire.sequence - 1,
        trace_parent: String::new(),
        session: None,
    };
    let mut event = Event::new(&mut execution, kind, 0, String::new());
    event.step_id = wire.step_id;
    event.agent_id = wire.agent_id;
    event.detail = wire.detail;
    event.error = wire.error.map(|error| (error.code, error.message));
    (event.tokens_used, event.cost) = (wire.tokens_used, wire.cost);
    event
}

/// A start of `process` with no inputs, led by `lead` (none when empty).
fn start_request(process: Arc<crate::domain::model::ProcessVersion>, lead: &str) -> StartRequest {
    StartRequest {
        process,
        inputs_json: "{}".to_owned(),
        lead_agent_id: lead.to_owned(),
        idempotency_key: None,
        session: None,
        claimed_messages: Vec::new(),
        fired_schedule: None,
    }
}

fn chain(length: usize, agent: &str) -> String {
    let mut yaml = String::from("name: chain\nmax_parallel: 4\nsteps:\n");
    for index in 0..length {
        yaml.push_str(&format!("  - {{id: s{index}, type: agent_task, agent: {agent}, message: m"));
        if index > 0 {
            yaml.push_str(&format!(", depends_on: [s{}]", index - 1));
        }
        yaml.push_str("}\n");
    }
    yaml
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_runs_in_order_and_each_step_sees_its_upstream() {
    let harness = Harness::new(FakeRoster { agents: vec!["doer"], ..FakeRoster::default() }, settings()).await;
    harness.worker(&["doer"], Behaviour::Complete);
    let id = harness.run(&chain(50, "doer")).await;
    let (status, events) = harness.finished(&id).await;
    assert_eq!(status, ExecutionStatus::Completed);
    // Each step starts only after the one before it completed.
    let position = |kind: EventKind, step: &str| {
        events
            .iter()
            .position(|event| event.kind == kind && event.step_id == step)
            .unwrap_or_else(|| panic!("{kind:?} {step}"))
    };
    for index in 1..50 {
        assert!(
            position(EventKind::StepCompleted, &format!("s{}", index - 1))
                < position(EventKind::StepStarted, &format!("s{index}"))
        );
    }
    // Numbered without gaps, from 1.
    assert!(events.iter().enumerate().all(|(index, event)| event.sequence == index as u64 + 1));
    let steps = harness.steps(&id).await;
    assert_eq!(steps["s49"].output_json.as_deref(), Some(r#"{"step":"s49"}"#));
}

/// A start whose caller goes away while the run is being created (here
/// its commit waits for the event log's turn, held elsewhere, as behind a
/// replica cut off mid-transaction) still gives the run its driver.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_caller_went_away_while_it_was_created_is_driven_all_the_same() {
    use sqlx::Connection as _;
    let Some(database) = muster_runtime::testing::TestDatabase::create().await else { return };
    let store: Arc<dyn Store> = Arc::new(SqlStore::connect(&database.url, 4, 0).unwrap());
    store.migrate().await.unwrap();
    let roster = Arc::new(FakeRoster { agents: vec!["doer"], ..FakeRoster::default() });
    let engine = Engine::new(store, roster.clone(), settings());
    engine.join("", "").await.unwrap();
    engine.load_matrix().await.unwrap();
    let harness = Harness { engine, roster, file: std::path::PathBuf::new(), received: Arc::default() };
    harness.worker(&["doer"], Behaviour::Complete);
    let (process, _) = harness.engine.publish(chain(3, "doer")).await.unwrap();

    let mut turn = sqlx::PgConnection::connect(&database.url).await.unwrap();
    sqlx::query("SELECT pg_advisory_lock(1836413812, 7106407)").execute(&mut turn).await.unwrap();
    let start = harness.engine.start(start_request(process, ""));
    let answer = tokio::time::timeout(Duration::from_millis(500), start).await;
    assert!(answer.is_err(), "the creation waits for the log's turn: {answer:?}");
    sqlx::query("SELECT pg_advisory_unlock(1836413812, 7106407)").execute(&mut turn).await.unwrap();

    // Created once the turn came, it is driven to its end.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let id = loop {
        let id: Option<String> =
            sqlx::query_scalar("SELECT id FROM executions").fetch_optional(&mut turn).await.unwrap();
        if let Some(id) = id {
            break id;
        }
        assert!(tokio::time::Instant::now() < deadline, "the run was never created");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let (status, _) = harness.finished(&id).await;
    assert_eq!(status, ExecutionStatus::Completed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_roster_is_asked_about_an_agent_once_while_its_changes_are_followed() {
    let harness = Harness::new(FakeRoster { agents: vec!["doer"], ..FakeRoster::default() }, settings()).await;
    let engine = &harness.engine;
    let asked = || harness.roster.agents_asked.load(std::sync::atomic::Ordering::Relaxed);
    // Not following the roster's changes: asked every time.
    engine.roster_agent("doer").await.unwrap();
    engine.roster_agent("doer").await.unwrap();
    assert_eq!(asked(), 2);
    engine.contexts.following(true);
    engine.roster_agent("doer").await.unwrap();
    engine.roster_agent("doer").await.unwrap();
    assert_eq!(asked(), 3, "kept while the changes are followed");
    // An agent not in the roster is asked about again, every time.
    for _ in 0..2 {
        assert!(matches!(engine.roster_agent("ghost").await, Err(RosterFailure::NotFound(_))));
    }
    assert_eq!(asked(), 5);
    // A change of an agent or a role forgets what was kept.
    engine.contexts.forget();
    assert_eq!(engine.roster_agent("doer").await.unwrap().id, "doer");
    assert_eq!(asked(), 6);
    engine.contexts.following(false);
    engine.roster_agent("doer").await.unwrap();
    assert_eq!(asked(), 7, "nothing kept once the changes are no longer followed");
}

/// What `count` tasks calling `call` at once answered.
async fn at_once<T, F>(count: usize, engine: &Arc<Engine>, call: impl Fn(Arc<Engine>) -> F) -> Vec<T>
where
    T: Send + 'static,
    F: std::future::Future<Output = T> + Send + 'static,
{
    let tasks: Vec<_> = (0..count).map(|_| tokio::spawn(call(engine.clone()))).collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.expect("a call"));
    }
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_that_want_an_agent_at_the_same_moment_ask_the_roster_about_it_once() {
    let roster = FakeRoster { agents: vec!["doer"], agent_delay: Duration::from_millis(50), ..FakeRoster::default() };
    let harness = Harness::new(roster, settings()).await;
    let engine = &harness.engine;
    engine.contexts.following(true);
    let known = at_once(20, engine, |engine| async move { engine.roster_agent("doer").await }).await;
    let contexts = at_once(20, engine, |engine| async move { engine.agent_context("doer").await }).await;
    assert!(known.iter().all(|agent| agent.as_ref().is_ok_and(|agent| agent.id == "doer")), "{known:?}");
    assert!(contexts.iter().all(|context| context.as_ref().is_ok_and(|context| context.max_iterations == 10)));
    let asked = |count: &std::sync::atomic::AtomicUsize| count.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(asked(&harness.roster.agents_asked), 1, "one GetAgent for twenty runs");
    assert_eq!(asked(&harness.roster.contexts_asked), 1, "one context fetched for twenty runs");
    // An agent the roster does not know: each waiting caller asks in its turn, and hears so.
    let ghosts = at_once(3, engine, |engine| async move { engine.roster_agent("ghost").await }).await;
    assert!(ghosts.iter().all(|ghost| matches!(ghost, Err(RosterFailure::NotFound(_)))));
    assert_eq!(asked(&harness.roster.agents_asked), 4);
    assert!(engine.contexts.asking_nobody(), "no turn outlives its callers");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_fails_its_dependants_unless_a_step_goes_on_without_it() {
    let harness = Harness::new(FakeRoster { agents: vec!["doer", "ghost"], ..FakeRoster::default() }, settings()).await;
    harness.worker(&["doer"], Behaviour::Complete);
    let source = "name: failing\nsteps:\n\
        \x20 - {id: first, type: agent_task, agent: doer, message: m}\n\
        \x20 - {id: missing, type: agent_task, agent: doer, message: m, roles: {executor: nobody}}\n\
        \x20 - {id: after, type: agent_task, agent: doer, message: m, depends_on: [missing]}\n\
        \x20 - {id: later, type: agent_task, agent: doer, message: m, depends_on: [after]}\n\
        \x20 - {id: tolerant, type: agent_task, agent: doer, message: m, depends_on: [first]}\n";
    // 'nobody' is unknown to the roster: the process cannot even be published.
    assert!(harness.engine.publish(source.to_owned()).await.is_err());
    let source = source.replace("roles: {executor: nobody}", "roles: {executor: ghost}");
    let id = harness.run(&source).await;
    // Nobody serves the ghost: its step waits for a worker, then is cancelled.
    harness.wait_for(&id, "missing", StepStatus::WaitingForWorker).await;
    harness.intervene(&id, "missing", super::InterventionAction::Cancel).await;
    let (status, _) = harness.finished(&id).await;
    assert_eq!(status, ExecutionStatus::Failed);
    let steps = harness.steps(&id).await;
    assert_eq!(steps["missing"].status, StepStatus::Cancelled);
    for dependant in ["after", "later"] {
        assert_eq!(
            (steps[dependant].status, steps[dependant].error_code.as_str()),
            (StepStatus::Failed, "UPSTREAM_FAILED")
        );
        assert_eq!(steps[dependant].attempt, 0, "it never started");
    }
    assert_eq!(steps["tolerant"].status, StepStatus::Completed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retryable_failure_is_retried_after_a_pause() {
    let harness = Harness::new(FakeRoster { agents: vec!["doer"], ..FakeRoster::default() }, settings()).await;
    harness.worker(&["doer"], Behaviour::FailOnce);
    let id = harness
        .run("name: retry\nsteps:\n  - {id: flaky, type: agent_task, agent: doer, message: m, retries: 1}\n")
        .await;
    let (status, _) = harness.finished(&id).await;
    assert_eq!(status, ExecutionStatus::Completed);
    let step = harness.steps(&id).await.remove("flaky").unwrap();
    assert_eq!((step.attempt, step.retry_at), (2, None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_no_worker_takes_in_time_goes_back_to_the_roster_or_fails() {
    let roster =
        FakeRoster { agents: vec!["away", "here", "named"], delegates: vec!["away", "here"], ..FakeRoster::default() };
    let settings = Settings { schedule_to_start: Some(Duration::from_millis(300)), ..settings() };
    let harness = Harness::new(roster, settings).await;
    harness.worker(&["here"], Behaviour::Complete);
    let source = "name: nobody-takes-it\nsteps:\n\
        \x20 - {id: delegated, type: agent_task, message: m, delegate: {expertise: [x]}}\n\
        \x20 - {id: named, type: agent_task, agent: named, message: m}\n";
    let id = harness.run(source).await;
    let (status, events) = harness.finished(&id).await;
    assert_eq!(status, ExecutionStatus::Failed);
    let steps = harness.steps(&id).await;
    // The roster chose 'away', whom no worker serves; asked again without it, it chose 'here'.
    let delegated = &steps["delegated"];
    assert_eq!((delegated.status, delegated.executor.as_str()), (StepStatus::Completed, "here"));
    assert_eq!(delegated.delegation_chain, ["away"]);
    assert!(!delegated.roster_reserved, "the slot is released when the step ends");
    let asked: Vec<DelegationAsk> = harness
        .roster
        .asked
        .lock()
        .unwrap()
        .iter()
        .filter(|ask| ask.task_id.ends_with("/delegated"))
        .cloned()
        .collect();
    assert_eq!(asked.len(), 2);
    assert_eq!(asked[1].delegation_chain, ["away"]);
    let released = harness.roster.released.lock().unwrap().clone();
    assert_eq!(
        released.iter().filter(|task| task.ends_with("/delegated")).count(),
        1,
        "the second decision moved the task's slot; it is released once, at the end: {released:?}"
    );
    assert!(
        events
            .iter()
            .any(|event| event.kind == EventKind::StepDelegated && event.detail.contains("no worker serving 'away'"))
    );
    // A named executor no worker serves fails.
    let named = &steps["named"];
    assert_eq!((named.status, named.error_code.as_str()), (StepStatus::Failed, "NO_WORKER"));
    assert!(
        named.error_message.contains("no worker serving 'named' took the step within 300 ms"),
        "{}",
        named.error_message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_stops_mid_run_resumes_where_the_store_says() {
    let mut harness = Harness::new(FakeRoster { agents: vec!["doer"], ..FakeRoster::default() }, settings()).await;
    harness.worker(&["doer"], Behaviour::Hold);
    let id = harness.run(&chain(3, "doer")).await;
    let held = harness.wait_for(&id, "s0", StepStatus::Running).await;
    assert_eq!(held.attempt, 1);
    harness.engine.shutdown().await;

    // A new engine on the same store, with a worker that answers.
    harness.engine = engine_on(&harness.file, harness.roster.clone(), settings()).await;
    assert_eq!(harness.engine.adopt().await.unwrap(), 1);
    harness.worker(&["doer"], Behaviour::Complete);
    let (status, events) = harness.finished(&id).await;
    assert_eq!(status, ExecutionStatus::Completed);
    let steps = harness.steps(&id).await;
    assert_eq!(steps["s0"].attempt, 2, "the attempt under way when it stopped is started again");
    assert_eq!(steps["s2"].attempt, 1);
    assert!(events.iter().enumerate().all(|(index, event)| event.sequence == index as u64 + 1), "numbering goes on");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_step_remembers_is_in_the_assignment_of_the_step_it_makes_ready() {
    let harness =
        Harness::new(FakeRoster { agents: vec!["doer", "helper"], ..FakeRoster::default() }, settings()).await;
    harness.worker(&["doer", "helper"], Behaviour::Remember);
    // The helper's first step of the run (its context read), then the doer's second.
    let source = "name: learning\nsteps:\n\
        \x20 - {id: s0, type: agent_task, agent: doer, message: m}\n\
        \x20 - {id: s1, type: agent_task, agent: helper, message: m, depends_on: [s0]}\n\
        \x20 - {id: s2, type: agent_task, agent: doer, message: m, depends_on: [s1]}\n";
    // A run before it, so that both agents' contexts are kept by the engine.
    harness.engine.contexts.following(true);
    let id = harness.run(source).await;
    assert_eq!(harness.finished(&id).await.0, ExecutionStatus::Completed);
    harness.received.lock().unwrap().clear();
    let id = harness.run(source).await;
    assert_eq!(harness.finished(&id).await.0, ExecutionStatus::Completed);
    let received = harness.received.lock().unwrap().clone();
    let remembered = |step: &str| -> Vec<String> {
        let assignment = received.iter().find(|assignment| assignment.step_id == step).unwrap();
        assignment.context.memory.iter().map(|entry| entry.text.clone()).collect()
    };
    let earlier = ["learnt in s2", "learnt in s1", "learnt in s0"];
    assert_eq!(remembered("s0"), earlier, "what the run before learnt");
    assert_eq!(remembered("s1"), [&["learnt in s0"][..], &earlier].concat());
    assert_eq!(remembered("s2"), [&["learnt in s1", "learnt in s0"][..], &earlier].concat(), "newest first");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_added_between_runs_is_in_the_next_assignments_of_agents_whose_contexts_are_kept() {
    let harness =
        Harness::new(FakeRoster { agents: vec!["doer", "helper"], ..FakeRoster::default() }, settings()).await;
    harness.worker(&["doer", "helper"], Behaviour::Complete);
    let source = "name: kept\nsteps:\n\
        \x20 - {id: s0, type: agent_task, agent: doer, message: m}\n\
        \x20 - {id: s1, type: agent_task, agent: helper, message: m, depends_on: [s0]}\n";
    harness.engine.contexts.following(true);
    for added in ["the launch moved to Monday", "the client signed"] {
        let id = harness.run(source).await;
        assert_eq!(harness.finished(&id).await.0, ExecutionStatus::Completed);
        let now = muster_runtime::time::now_millis();
        let entry = crate::domain::memory::MemoryEntry::new("", added, "operator:test", "", now);
        harness.engine.store.append_memory(entry).await.unwrap();
    }
    harness.received.lock().unwrap().clear();
    let id = harness.run(source).await;
    assert_eq!(harness.finished(&id).await.0, ExecutionStatus::Completed);
    for assignment in harness.received.lock().unwrap().iter() {
        let texts: Vec<&str> = assignment.context.memory.iter().map(|entry| entry.text.as_str()).collect();
        assert_eq!(texts, ["the client signed", "the launch moved to Monday"], "{}", assignment.step_id);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_assignment_carries_the_history_and_memory_of_the_steps_it_builds_on() {
    let harness = Harness::new(FakeRoster { agents: vec!["doer"], ..FakeRoster::default() }, settings()).await;
    harness.worker(&["doer"], Behaviour::Complete);
    // s0, then s1 and s2 (both after s0), then s3 after both.
    let source = "name: diamond\nsteps:\n\
        \x20 - {id: s0, type: agent_task, agent: doer, message: m}\n\
        \x20 - {id: s1, type: agent_task, agent: doer, message: m, depends_on: [s0]}\n\
        \x20 - {id: s2, type: agent_task, agent: doer, message: m, depends_on: [s0]}\n\
        \x20 - {id: s3, type: agent_task, agent: doer, message: m, depends_on: [s1, s2]}\n";
    let id = harness.run(source).await;
    assert_eq!(harness.finished(&id).await.0, ExecutionStatus::Completed);
    let received = harness.received.lock().unwrap().clone();
    let seen = |step: &str| received.iter().find(|assignment| assignment.step_id == step).unwrap().clone();
    let ended = |assignment: &crate::domain::model::Assignment| -> Vec<String> {
        let mut steps: Vec<String> = assignment.history.iter().map(|entry| entry.step_id.clone()).collect();
        steps.sort();
        steps
    };
    // The shared memory as a worker decodes it.
    let memory = |assignment: &crate::domain::model::Assignment| -> serde_json::Value {
        use prost::Message as _;
        let encoded = crate::grpc::convert::shared_memory_to_wire(&assignment.shared_memory);
        muster_runtime::json::object_to_json(&prost_types::Struct::decode(encoded).unwrap()).unwrap()
    };
    assert!(seen("s0").history.is_empty());
    assert_eq!(memory(&seen("s0")), serde_json::json!({}));
    // s1 and s2 see s0 and never each other, whichever ended first: they
    // run side by side, neither builds on the other.
    for step in ["s1", "s2"] {
        let assignment = seen(step);
        assert_eq!(ended(&assignment), ["s0"], "{step}");
        assert_eq!(memory(&assignment), serde_json::json!({"s0": {"step": "s0"}}), "{step}");
    }
    let s3 = seen("s3");
    assert_eq!(ended(&s3), ["s0", "s1", "s2"]);
    assert_eq!(s3.history.first().map(|entry| entry.step_id.as_str()), Some("s0"), "oldest first");
    let memory = memory(&s3);
    assert_eq!(memory.as_object().unwrap().len(), 3);
    assert_eq!(memory["s2"], serde_json::json!({"step": "s2"}));
    assert_eq!(s3.shared_memory_left_out, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_side_by_side_see_nothing_of_each_other_and_a_long_chain_sees_its_nearest_hundred() {
    let harness = Harness::new(FakeRoster { agents: vec!["doer"], ..FakeRoster::default() }, settings()).await;
    harness.worker(&["doer"], Behaviour::Complete);
    let mut source = String::from("name: wide-then-long\nsteps:\n");
    for index in 0..20 {
        source.push_str(&format!("  - {{id: w{index}, type: agent_task, agent: doer, message: m}}\n"));
    }
    source.push_str("  - {id: c0, type: agent_task, agent: doer, message: m}\n");
    for index in 1..150 {
        source.push_str(&format!(
            "  - {{id: c{index}, type: agent_task, agent: doer, message: m, depends_on: [c{}]}}\n",
            index - 1
        ));
    }
    let id = harness.run(&source).await;
    assert_eq!(harness.finished(&id).await.0, ExecutionStatus::Completed);
    let received = harness.received.lock().unwrap().clone();
    let seen = |step: &str| received.iter().find(|assignment| assignment.step_id == step).unwrap().clone();
    for index in 0..20 {
        let wide = seen(&format!("w{index}"));
        assert!(wide.history.is_empty(), "w{index}");
        assert!(wide.shared_memory.outputs.is_empty(), "w{index}");
    }
    let last = seen("c149");
    let history: Vec<&str> = last.history.iter().map(|entry| entry.step_id.as_str()).collect();
    let expected: Vec<String> = (49..149).map(|index| format!("c{index}")).collect();
    assert_eq!(history, expected, "the nearest hundred it builds on, oldest first");
    let memory: Vec<&str> = last.shared_memory.outputs.iter().map(|output| output.step_id.as_str()).collect();
    assert_eq!(memory.len(), 100);
    assert_eq!((memory[0], memory[99]), ("c148", "c49"), "newest first");
    // Every other completed step of the execution is counted as left out.
    assert_eq!(last.shared_memory_left_out, 169 - 100);
}

/// The roster's questions and releases about one execution, as step ids.
fn roster_calls(roster: &FakeRoster, execution_id: &str) -> (Vec<String>, Vec<String>) {
    let step = |task: &str| task.strip_prefix(&format!("{execution_id}/")).unwrap_or(task).to_owned();
    let asked = roster.asked.lock().unwrap().iter().map(|ask| step(&ask.task_id)).collect();
    let released = roster.released.lock().unwrap().iter().map(|task| step(task)).collect();
    (asked, released)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_of_one_agent_keeps_one_roster_slot_from_first_step_to_last() {
    let harness = Harness::new(FakeRoster { agents: vec!["doer", "other"], ..FakeRoster::default() }, settings()).await;
    harness.worker(&["doer", "other"], Behaviour::Complete);
    // s0..s2 by doer, s3 by other, s4 by doer again.
    let source =
        chain(5, "doer").replace("{id: s3, type: agent_task, agent: doer", "{id: s3, type: agent_task, agent: other");
    let id = harness.run(&source).await;
    let (status, _) = harness.finished(&id).await;
    assert_eq!(status, ExecutionStatus::Completed);
    let (asked, released) = roster_calls(&harness.roster, &id);
    assert_eq!(asked, ["s0", "s3", "s4"], "s1 and s2 took over s0's slot");
    let mut released = released;
    released.sort();
    assert_eq!(released, ["s0", "s3", "s4"], "each slot is given back once, when its last holder ends");
    let steps = harness.steps(&id).await;
    assert!(steps.values().all(|step| !step.roster_reserved && step.slot_task.is_empty()), "{steps:?}");
}

/// A chain whose steps go from `agents[0]` to `agents[1]` and back.
fn alternating_chain(length: usize, agents: [&str; 2]) -> String {
    rotating_chain(length, &agents)
}

/// A chain whose step `i` goes to `agents[i % agents.len()]`.
fn rotating_chain(length: usize, agents: &[&str]) -> String {
    let mut source = chain(length, agents[0]);
    for index in 1..length {
        source = source.replace(
            &format!("{{id: s{index}, type: agent_task, agent: {}", agents[0]),
            &format!("{{id: s{index}, type: agent_task, agent: {}", agents[index % agents.len()]),
        );
    }
    source
}

/// The steps asked about only if free, and the others, in order.
fn asked_ahead(roster: &FakeRoster, execution_id: &str) -> (Vec<String>, Vec<String>) {
    let step = |task: &str| task.strip_prefix(&format!("{execution_id}/")).unwrap_or(task).to_owned();
    let asked = roster.asked.lock().unwrap();
    let (ahead, asked): (Vec<_>, Vec<_>) = asked.iter().partition(|ask| ask.only_if_free);
    (ahead.iter().map(|ask| step(&ask.task_id)).collect(), asked.iter().map(|ask| step(&ask.task_id)).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_from_agent_to_agent_asks_for_each_next_slot_while_the_step_before_runs() {
    for ahead_delay in [Duration::ZERO, Duration::from_millis(200)] {
        let roster = FakeRoster { agents: vec!["a", "b"], ahead_delay, ..FakeRoster::default() };
        let harness = Harness::new(roster, settings()).await;
        harness.worker(&["a", "b"], Behaviour::Complete);
        let id = harness.run(&alternating_chain(6, ["a", "b"])).await;
        let (status, _) = harness.finished(&id).await;
        assert_eq!(status, ExecutionStatus::Completed);
        // Answered at once, the slot waits for the step; answered late, the
        // step that started meanwhile takes the answer: asked once either way.
        let (ahead, asked) = asked_ahead(&harness.roster, &id);
        assert_eq!(ahead, ["s1", "s2", "s3", "s4", "s5"], "{ahead_delay:?}");
        assert_eq!(asked, ["s0"], "{ahead_delay:?}");
        let (_, mut released) = roster_calls(&harness.roster, &id);
        released.sort();
        assert_eq!(released, ["s0", "s1", "s2", "s3", "s4", "s5"], "{ahead_delay:?}: each slot given back once");
        let steps = harness.steps(&id).await;
        assert!(steps.values().all(|step| !step.roster_reserved && step.attempt == 1), "{steps:?}");
    }
}

/// A step whose slot is still being asked for ahead when the step before
/// it completes starts in the same commit as that completion (the commit
/// waits a moment for the answer): a chain from agent to agent costs a
/// commit a step, not two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_waiting_for_its_slot_asked_ahead_starts_in_the_commit_that_made_it_ready() {
    const STEPS: u64 = 20;
    let roster = FakeRoster { agents: vec!["a", "b"], ahead_delay: Duration::from_millis(1), ..FakeRoster::default() };
    let (harness, store) = Harness::with_store(roster, settings()).await;
    harness.worker(&["a", "b"], Behaviour::Complete);
    let before = store.transactions();
    let id = harness.run(&alternating_chain(STEPS as usize, ["a", "b"])).await;
    assert_eq!(harness.finished(&id).await.0, ExecutionStatus::Completed);
    let (ahead, _) = asked_ahead(&harness.roster, &id);
    assert_eq!(ahead.len(), STEPS as usize - 1, "every next slot was asked for ahead");
    // The start, a commit per step (two for some, should an answer come
    // late), the end; two a step would be 40 and more.
    let transactions = store.transactions() - before;
    assert!(transactions <= STEPS * 3 / 2, "{transactions} transactions for {STEPS} steps");
}

/// Waits until the roster was asked ahead for each of `steps`, which are
/// still pending and never started.
async fn reserved_ahead(harness: &Harness, id: &str, steps: &[&str]) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !steps.iter().all(|step| asked_ahead(&harness.roster, id).0.iter().any(|asked| asked == step)) {
        assert!(tokio::time::Instant::now() < deadline, "{steps:?} not all asked for ahead");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stored = harness.steps(id).await;
    for step in steps {
        assert_eq!((stored[*step].status, stored[*step].attempt), (StepStatus::Pending, 0), "{step}");
    }
}

/// Cancels the running `step`: the steps after it never run, and every
/// slot, s0's and those reserved ahead for s1 and s2, goes back once.
async fn cancelled_with_s1_and_s2_reserved_ahead(harness: &Harness, id: &str, step: &str) {
    harness.intervene(id, step, super::InterventionAction::Cancel).await;
    let (status, _) = harness.finished(id).await;
    assert_eq!(status, ExecutionStatus::Failed);
    let (ahead, asked) = asked_ahead(&harness.roster, id);
    assert_eq!((ahead, asked), (vec!["s1".to_owned(), "s2".to_owned()], vec!["s0".to_owned()]));
    let (_, mut released) = roster_calls(&harness.roster, id);
    released.sort();
    assert_eq!(released, ["s0", "s1", "s2"]);
    let steps = harness.steps(id).await;
    assert!(steps.values().all(|step| !step.roster_reserved), "{steps:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_reserved_ahead_goes_back_when_its_step_cannot_run() {
    let harness = Harness::new(FakeRoster { agents: vec!["a", "b"], ..FakeRoster::default() }, settings()).await;
    harness.worker(&["a", "b"], Behaviour::HoldStep("s1"));
    let id = harness.run(&alternating_chain(4, ["a", "b"])).await;
    harness.wait_for(&id, "s1", StepStatus::Running).await;
    reserved_ahead(&harness, &id, &["s2"]).await;
    cancelled_with_s1_and_s2_reserved_ahead(&harness, &id, "s1").await;
}

/// While a step runs, the slots of the next two steps are asked for when
/// each goes to an agent of its own: the second has a whole step's time
/// for its answer. Both go back when the running step is cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_step_has_the_slots_of_the_two_steps_after_it_asked_for_ahead() {
    let harness = Harness::new(FakeRoster { agents: vec!["a", "b", "c"], ..FakeRoster::default() }, settings()).await;
    harness.worker(&["a", "b", "c"], Behaviour::HoldStep("s0"));
    let id = harness.run(&rotating_chain(4, &["a", "b", "c"])).await;
    harness.wait_for(&id, "s0", StepStatus::Running).await;
    reserved_ahead(&harness, &id, &["s1", "s2"]).await;
    assert!(!asked_ahead(&harness.roster, &id).0.contains(&"s3".to_owned()), "s3 waits for s2, which is not running");
    cancelled_with_s1_and_s2_reserved_ahead(&harness, &id, "s0").await;
}

/// A slot reserved ahead tells nobody anything: it rides the next commit
/// made for another reason, never one of its own, however long the step
/// before it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_reserved_ahead_makes_no_commit_of_its_own() {
    let roster = FakeRoster { agents: vec!["a", "b", "c"], ..FakeRoster::default() };
    let (harness, store) = Harness::with_store(roster, settings()).await;
    harness.worker(&["a", "b", "c"], Behaviour::HoldStep("s0"));
    let id = harness.run(&rotating_chain(3, &["a", "b", "c"])).await;
    harness.wait_for(&id, "s0", StepStatus::Running).await;
    reserved_ahead(&harness, &id, &["s1", "s2"]).await;
    let before = store.transactions();
    // Staged lazily, the reservation would be written within 100 ms.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(store.transactions() - before, 0, "a commit while s0 runs and nothing else changed");
    let steps = harness.steps(&id).await;
    assert!(!steps["s1"].roster_reserved && !steps["s2"].roster_reserved, "not written: {steps:?}");
    cancelled_with_s1_and_s2_reserved_ahead(&harness, &id, "s0").await;
}

/// A run's agents' contexts are fetched as it starts, not as each agent's
/// first step becomes ready: while s0 runs, s1's and s2's agents are
/// already known.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_starting_run_has_the_contexts_of_its_agents_fetched_ahead_of_their_steps() {
    let harness = Harness::new(FakeRoster { agents: vec!["a", "b", "c"], ..FakeRoster::default() }, settings()).await;
    harness.engine.contexts.following(true);
    harness.worker(&["a", "b", "c"], Behaviour::HoldStep("s0"));
    let id = harness.run(&rotating_chain(3, &["a", "b", "c"])).await;
    harness.wait_for(&id, "s0", StepStatus::Running).await;
    let asked = || harness.roster.contexts_asked.load(std::sync::atomic::Ordering::Relaxed);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while asked() < 3 {
        assert!(tokio::time::Instant::now() < deadline, "{} of the three contexts fetched while s0 runs", asked());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    reserved_ahead(&harness, &id, &["s1", "s2"]).await;
    cancelled_with_s1_and_s2_reserved_ahead(&harness, &id, "s0").await;
    assert_eq!(asked(), 3, "each agent's context fetched once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ask_ahead_that_finds_no_free_slot_leaves_the_step_to_ask_when_it_is_ready() {
    let roster =
        FakeRoster { agents: vec!["a", "full"], full: vec!["full"], queue_resolves: true, ..FakeRoster::default() };
    let harness = Harness::new(roster, settings()).await;
    harness.worker(&["a", "full"], Behaviour::Complete);
    let id = harness.run(&alternating_chain(2, ["a", "full"])).await;
    let (status, events) = harness.finished(&id).await;
    assert_eq!(status, ExecutionStatus::Completed);
    let (ahead, asked) = asked_ahead(&harness.roster, &id);
    assert_eq!((ahead, asked), (vec!["s1".to_owned()], vec!["s0".to_owned(), "s1".to_owned()]));
    let queued: Vec<&str> =
        events.iter().filter(|event| event.kind == EventKind::StepQueued).map(|event| event.step_id.as_str()).collect();
    assert_eq!(queued, ["s1"], "queued once it was ready, not before");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_is_released_once_the_roster_is_back() {
    let roster = FakeRoster { agents: vec!["doer"], unavailable_releases: 2.into(), ..FakeRoster::default() };
    let harness = Harness::new(roster, settings()).await;
    harness.worker(&["doer"], Behaviour::Complete);
    let id = harness.run("name: one\nsteps:\n  - {id: only, type: agent_task, agent: doer, message: m}\n").await;
    let (status, _) = harness.finished(&id).await;
    assert_eq!(status, ExecutionStatus::Completed);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while roster_calls(&harness.roster, &id).1.is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "the slot was never released");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(roster_calls(&harness.roster, &id).1, ["only"]);
    assert_eq!(harness.roster.unavailable_releases.load(std::sync::atomic::Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_taken_over_survives_a_restart_and_goes_back_when_the_step_is_reassigned() {
    let mut harness =
        Harness::new(FakeRoster { agents: vec!["doer", "other"], ..FakeRoster::default() }, settings()).await;
    harness.worker(&["doer"], Behaviour::HoldStep("s1"));
    let id = harness.run(&chain(3, "doer")).await;
    let held = harness.wait_for(&id, "s1", StepStatus::Running).await;
    assert!(held.roster_reserved);
    assert_eq!(held.slot_task, format!("{id}/s0"), "stored with the step");
    harness.engine.shutdown().await;

    // A new engine resumes s1 on the slot it holds, without asking the roster.
    harness.engine = engine_on(&harness.file, harness.roster.clone(), settings()).await;
    assert_eq!(harness.engine.adopt().await.unwrap(), 1);
    harness.worker(&["doer"], Behaviour::HoldStep("s1"));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let resumed = loop {
        let step = harness.steps(&id).await.remove("s1").unwrap();
        if step.attempt == 2 && step.status == StepStatus::Running {
            break step;
        }
        assert!(tokio::time::Instant::now() < deadline, "s1 was not started again: {step:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(resumed.slot_task, format!("{id}/s0"));
    assert_eq!(roster_calls(&harness.roster, &id), (vec!["s0".to_owned()], Vec::new()));

    // Given to another agent, the step gives that slot back and asks the roster about its own task.
    harness.worker(&["other"], Behaviour::Complete);
    harness.intervene(&id, "s1", super::InterventionAction::Reassign("other".to_owned())).await;
    let (status, _) = harness.finished(&id).await;
    assert_eq!(status, ExecutionStatus::Completed);
    let (asked, mut released) = roster_calls(&harness.roster, &id);
    assert_eq!(asked, ["s0", "s1", "s2"]);
    released.sort();
    assert_eq!(released, ["s0", "s1", "s2"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_executor_goes_through_the_roster_capacity_and_status() {
    let roster = FakeRoster { agents: vec!["free", "full"], full: vec!["full"], ..FakeRoster::default() };
    let harness = Harness::new(roster, settings()).await;
    harness.worker(&["free", "full"], Behaviour::Complete);
    let source = "name: named\nsteps:\n\
        \x20 - {id: free, type: agent_task, agent: free, message: m}\n\
        \x20 - {id: full, type: agent_task, agent: full, message: m}\n";
    let id = harness.run(source).await;
    // At capacity: queued for the agent, not given to it.
    let queued = harness.wait_for(&id, "full", StepStatus::Queued).await;
    assert_eq!((queued.executor.as_str(), queued.wait_seconds, queued.attempt), ("full", 60, 1));
    harness.wait_for(&id, "free", StepStatus::Completed).await;
    let asked = harness.roster.asked.lock().unwrap().clone();
    let assigned: Vec<&str> = asked.iter().map(|ask| ask.assigned_agent_id.as_str()).collect();
    assert!(assigned.contains(&"free") && assigned.contains(&"full"), "{assigned:?}");
    // The reservation the roster made for the free agent is released when its step ends.
    let released = harness.roster.released.lock().unwrap().clone();
    assert_eq!(released, [format!("{id}/free")]);
    let steps = harness.steps(&id).await;
    assert_eq!(steps["full"].status, StepStatus::Queued, "still waiting for a slot: {:?}", steps["full"]);
}

/// The first step of an agent that was queued, then given a slot, runs: the
/// agent's description, fetched after the step was queued, starts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_step_starts_when_the_roster_gives_it_a_slot() {
    let roster = FakeRoster { agents: vec!["full"], full: vec!["full"], queue_resolves: true, ..FakeRoster::default() };
    let harness = Harness::new(roster, settings()).await;
    harness.worker(&["full"], Behaviour::Complete);
    let id = harness.run("name: queued\nsteps:\n  - {id: late, type: agent_task, agent: full, message: m}\n").await;
    let done = harness.wait_for(&id, "late", StepStatus::Completed).await;
    assert_eq!((done.executor.as_str(), done.attempt), ("full", 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offline_named_executor_nobody_stands_in_for_is_waited_for_and_a_missing_one_fails() {
    let roster = FakeRoster { agents: vec!["doer", "away"], offline: vec!["away"], ..FakeRoster::default() };
    let harness = Harness::new(roster, settings()).await;
    let source = "name: gone\nsteps:\n\
        \x20 - {id: a, type: agent_task, agent: away, message: m}\n\
        \x20 - {id: b, type: agent_task, agent: doer, message: m}\n";
    let id = harness.run(source).await;
    // Offline, with nobody to escalate to: the step waits for its agent
    // (where a lead or an operator sees it and can reassign it), holding no slot.
    let waiting = harness.wait_for(&id, "a", StepStatus::WaitingForWorker).await;
    assert_eq!((waiting.executor.as_str(), waiting.roster_reserved), ("away", false));
    // Reassigned to an agent the roster does not have: it fails, saying so.
    harness.wait_for(&id, "b", StepStatus::WaitingForWorker).await;
    harness.intervene(&id, "b", super::InterventionAction::Reassign("ghost".to_owned())).await;
    let failed = harness.wait_for(&id, "b", StepStatus::Failed).await;
    assert_eq!(failed.error_code, "NO_EXECUTOR", "{failed:?}");
    assert!(failed.error_message.contains("agent 'ghost' is not in the roster"), "{}", failed.error_message);
    let asked = harness.roster.asked.lock().unwrap().clone();
    assert_eq!(asked.last().unwrap().assigned_agent_id, "ghost");
}

fn role(name: &str, tools: &[&str], input_schema: &str, output_schema: &str) -> RoleDefinition {
    RoleDefinition {
        name: name.to_owned(),
        tools: tools.iter().map(|tool| (*tool).to_owned()).collect(),
        input_schema_json: input_schema.to_owned(),
        output_schema_json: output_schema.to_owned(),
        ..RoleDefinition::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_step_invokes_its_tool_under_its_executor_and_keeps_its_output() {
    let roster = FakeRoster {
        agents: vec!["doer", "lead"],
        roles: HashMap::from([
            ("doer", role("calculator", &["add", "later"], "", "")),
            ("lead", role("boss", &[], "", "")),
        ]),
        ..FakeRoster::default()
    };
    let harness = Harness::new(roster, settings()).await;
    let schema = r#"{"type": "object", "required": ["x", "y"], "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}}"#;
    harness.tool_worker(&[("add", schema), ("forbidden", "")], |tool, input| match tool {
        "add" => ToolOutput {
            output_json: serde_json::json!({"sum": input["x"].as_i64().unwrap() + input["y"].as_i64().unwrap()})
                .to_string(),
            error: String::new(),
            status_code: 200,
        },
        _ => ToolOutput::error(500, "unreachable".to_owned()),
    });
    harness.worker(&["doer"], Behaviour::Complete);
    let source = "name: tools\nsteps:\n\
        \x20 - {id: add, type: tool_call, agent: doer, tool: add, inputs: {x: 1, y: 2}}\n\
        \x20 - {id: after, type: agent_task, agent: doer, message: m, depends_on: [add]}\n\
        \x20 - {id: bad-input, type: tool_call, agent: doer, tool: add, inputs: {x: one, y: 2}}\n\
        \x20 - {id: not-permitted, type: tool_call, agent: doer, tool: forbidden}\n\
        \x20 - {id: as-lead, type: tool_call, tool: add, inputs: {x: 1, y: 1}}\n\
        \x20 - {id: later, type: tool_call, agent: doer, tool: later, inputs: {n: 5}}\n";
    // A tool step that names no agent needs the execution's lead.
    let (process, _) = harness.engine.publish(source.to_owned()).await.unwrap();
    let start = |lead: &str| start_request(process.clone(), lead);
    let refused = harness.engine.start(start("")).await.unwrap_err();
    assert!(refused.to_string().contains("tool_call step 'as-lead' runs under an agent's identity"), "{refused}");
    let id = harness.engine.start(start("lead")).await.unwrap().id;

    // Nobody provides 'later' yet: the step waits for a worker; a provider connecting runs it.
    harness.wait_for(&id, "later", StepStatus::WaitingForWorker).await;
    harness.tool_worker(&[("later", "")], |_, input| ToolOutput {
        output_json: serde_json::json!({"twice": input["n"].as_i64().unwrap() * 2}).to_string(),
        error: String::new(),
        status_code: 0,
    });
    let (status, _) = harness.finished(&id).await;
    assert_eq!(status, ExecutionStatus::Failed);
    let steps = harness.steps(&id).await;
    assert_eq!(steps["add"].status, StepStatus::Completed);
    assert_eq!(steps["add"].output_json.as_deref(), Some(r#"{"sum":3}"#));
    assert_eq!(steps["after"].status, StepStatus::Completed, "a tool step's dependants run");
    assert_eq!(steps["later"].output_json.as_deref(), Some(r#"{"twice":10}"#));
    let bad = &steps["bad-input"];
    assert_eq!((bad.status, bad.error_code.as_str()), (StepStatus::Failed, "INVALID_INPUT"));
    assert!(
        bad.error_message.contains("input schema of tool 'add'") && bad.error_message.contains("at /x"),
        "{}",
        bad.error_message
    );
    let denied = &steps["not-permitted"];
    assert_eq!((denied.status, denied.error_code.as_str()), (StepStatus::Failed, "PERMISSION_DENIED"));
    assert!(
        denied.error_message.contains("role 'calculator', which does not permit tool 'forbidden'"),
        "{}",
        denied.error_message
    );
    // The lead's role does not permit 'add': the step ran as the lead, and was refused as the lead.
    let as_lead = &steps["as-lead"];
    assert_eq!((as_lead.executor.as_str(), as_lead.error_code.as_str()), ("lead", "PERMISSION_DENIED"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_input_and_output_schemas_apply_to_its_steps() {
    let roster = FakeRoster {
        agents: vec!["writer", "strict"],
        roles: HashMap::from([
            (
                "writer",
                role("writer", &[], r#"{"type": "object", "required": ["topic"]}"#, r#"{"required": ["step"]}"#),
            ),
            ("strict", role("strict", &[], "", r#"{"type": "object", "required": ["text"]}"#)),
        ]),
        ..FakeRoster::default()
    };
    let harness = Harness::new(roster, settings()).await;
    harness.worker(&["writer", "strict"], Behaviour::Complete);
    let source = "name: schemas\nsteps:\n\
        \x20 - {id: fits, type: agent_task, agent: writer, message: m, inputs: {topic: t}}\n\
        \x20 - {id: no-topic, type: agent_task, agent: writer, message: m}\n\
        \x20 - {id: wrong-output, type: agent_task, agent: strict, message: m, retries: 1}\n";
    let id = harness.run(source).await;
    let (status, _) = harness.finished(&id).await;
    assert_eq!(status, ExecutionStatus::Failed);
    let steps = harness.steps(&id).await;
    assert_eq!(steps["fits"].status, StepStatus::Completed);
    let no_topic = &steps["no-topic"];
    assert_eq!((no_topic.error_code.as_str(), no_topic.started_at), ("INPUT_SCHEMA", None), "never handed to a worker");
    assert!(
        no_topic.error_message.contains("input schema of role 'writer'") && no_topic.error_message.contains("topic"),
        "{}",
        no_topic.error_message
    );
    let wrong = &steps["wrong-output"];
    assert_eq!((wrong.error_code.as_str(), wrong.attempt), ("OUTPUT_SCHEMA", 2), "a wrong output is retried");
    assert!(
        wrong.error_message.contains("output schema of role 'strict'") && wrong.error_message.contains("text"),
        "{}",
        wrong.error_message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_steps_a_turn_starts_are_placed_in_one_batch() {
    let harness = Harness::new(FakeRoster { agents: vec!["doer"], ..FakeRoster::default() }, settings()).await;
    harness.worker(&["doer"], Behaviour::Complete);
    let mut source = String::from("name: wide\nmax_parallel: 12\nsteps:\n");
    for index in 0..12 {
        source.push_str(&format!("  - {{id: s{index}, type: agent_task, agent: doer, message: m}}\n"));
    }
    let id = harness.run(&source).await;
    let (status, _) = harness.finished(&id).await;
    assert_eq!(status, ExecutionStatus::Completed);
    assert_eq!(*harness.roster.batches.lock().unwrap(), [12], "twelve steps, one question to the roster");
    let released = harness.roster.released.lock().unwrap().len();
    assert_eq!(released, 12, "every slot is released when its step ends");
}
