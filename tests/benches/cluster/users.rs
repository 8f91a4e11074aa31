//! The shapes users run, on SQLite: the sample behaviour of `muster agent`
//! serves the agents, the steps of a run go to one agent after another with
//! the lead informed of each, and many runs go at once.
//!
//! - `chain/10`: one 1,000-step chain whose steps go to ten agents in turn.
//! - `chain/1`: the same chain, every step to one agent: what the sample
//!   behaviour costs apart from a roster call per step.
//! - `many`: 100, then 1,000 ten-step chains started at once (as fast as
//!   one client sends them) over 100 agents, ten to a process. Printed with
//!   the starts refused, the services' health throughout (the execution
//!   service and the roster asked every 50 ms), and how long a step waited
//!   for a worker once ready: from the worker answering the step before it
//!   to the step reaching the worker (so it includes the commit that makes
//!   the step ready, and any wait for a worker's slot), p50 and p99; and,
//!   from the execution service's histogram, the time from a step becoming
//!   ready to its assignment being sent, for the steps whose agent and a
//!   worker had room (the bucket bounds under which half and 99% fell, and
//!   the share sent within 5 ms), and how soon the starts were answered
//!   (the runs started first are stepping meanwhile). Every agent has room
//!   for every step at once (its capacity is 1,000), and the worker too (it
//!   takes 1,024 at once, as `muster agent` does), so no step waits for one.
//! - `paced/1000`: the same 1,000 runs, each step taking the worker
//!   [`PACE_MS`] (as a model's answer takes time): 2,000 steps a second
//!   offered, under what the cluster can do, so a step's wait is muster's
//!   own and not a queue of every run's steps. In `many`, whose worker
//!   answers at once, the thousand runs' steps all queue in the cluster: a
//!   step's cycle is the runs in flight over the steps a second, and the
//!   wait from ready to sent is most of it.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use muster::{
    sample::SampleBehaviour,
    worker::{AgentCredential, Behaviour, Step, StepOutcome},
};
use muster_proto::{
    execution::v1::{Assignment, StartExecutionRequest, ToolCall, ToolOutput, ToolSpec},
    roster::v1::Agent,
};
use muster_tests::{Backend, ExecutionClient, TestCluster, agent, spawn_worker};
use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient};

use super::{cpu_seconds, cpu_used, publish, run_once, scrape, series, service_pids};

/// Agents the many runs' steps go to.
const AGENTS: usize = 100;
/// Agents a process's steps go to, in turn.
const AGENTS_PER_PROCESS: usize = 10;
/// Steps of each of the many runs.
const STEPS: usize = 10;
/// How long each step of the paced runs takes the worker.
const PACE_MS: u64 = 500;

/// The sample behaviour, timing how long each step waited for the worker.
#[derive(Debug, Clone, Default)]
struct Timed {
    tally: Arc<Mutex<Tally>>,
}

#[derive(Debug, Default)]
struct Tally {
    /// When the worker last answered a step of each execution.
    answered: HashMap<String, Instant>,
    /// From a step's predecessor answered to the step reaching the worker.
    waits: Vec<Duration>,
}

impl Timed {
    /// The waits recorded since the last call, sorted.
    fn take_waits(&self) -> Vec<Duration> {
        let mut tally = self.tally.lock().expect("the tally");
        tally.answered.clear();
        let mut waits = std::mem::take(&mut tally.waits);
        waits.sort_unstable();
        waits
    }
}

impl Behaviour for Timed {
    async fn run(&self, assignment: Assignment, step: Step) -> StepOutcome {
        let arrived = Instant::now();
        let execution_id = assignment.execution_id.clone();
        {
            let mut tally = self.tally.lock().expect("the tally");
            if let Some(answered) = tally.answered.get(&execution_id).copied() {
                tally.waits.push(arrived - answered);
            }
        }
        let outcome = SampleBehaviour.run(assignment, step).await;
        self.tally.lock().expect("the tally").answered.insert(execution_id, Instant::now());
        outcome
    }

    fn tools(&self) -> Vec<ToolSpec> {
        SampleBehaviour.tools()
    }

    async fn call_tool(&self, call: ToolCall) -> ToolOutput {
        SampleBehaviour.call_tool(call).await
    }
}

/// A chain of `length` steps, step `i` run by `agents[i % agents.len()]`,
/// the lead informed of each.
fn chain_over(name: &str, length: usize, agents: &[String]) -> String {
    paced_chain_over(name, length, agents, 0)
}

/// [`chain_over`] whose every step takes the sample behaviour `pace_ms`.
fn paced_chain_over(name: &str, length: usize, agents: &[String], pace_ms: u64) -> String {
    let mut yaml = format!("name: {name}\nlead: lead\nsteps:\n");
    for index in 0..length {
        let agent = &agents[index % agents.len()];
        yaml.push_str(&format!(
            "  - id: s{index}\n    type: agent_task\n    agent: {agent}\n    message: step {index}\n    roles:\n      executor: {agent}\n      informed: [lead]\n"
        ));
        if pace_ms > 0 {
            yaml.push_str(&format!("    inputs: {{sleep_ms: {pace_ms}}}\n"));
        }
        if index > 0 {
            yaml.push_str(&format!("    depends_on: [s{}]\n", index - 1));
        }
    }
    yaml
}

/// Asks the execution service's and the roster's health every 50 ms until
/// stopped; how many answers, and those that were not SERVING.
struct HealthWatch {
    stop: tokio::sync::oneshot::Sender<()>,
    watch: tokio::task::JoinHandle<(usize, Vec<String>)>,
}

impl HealthWatch {
    fn start(test: &TestCluster) -> Self {
        let services: Vec<(&'static str, HealthClient<_>)> = ["execution", "roster"]
            .into_iter()
            .map(|service| (service, HealthClient::new(test.operator(service).channel().expect("a channel"))))
            .collect();
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let watch = tokio::spawn(async move {
            let (mut asked, mut unwell) = (0, Vec::new());
            let mut services = services;
            loop {
                for (service, client) in &mut services {
                    asked += 1;
                    match client.check(HealthCheckRequest { service: String::new() }).await {
                        Ok(answer) if answer.get_ref().status == ServingStatus::Serving as i32 => {}
                        Ok(answer) => unwell.push(format!("{service}: status {}", answer.get_ref().status)),
                        Err(status) => unwell.push(format!("{service}: {status}")),
                    }
                }
                tokio::select! {
                    _ = &mut stopped => return (asked, unwell),
                    () = tokio::time::sleep(Duration::from_millis(50)) => {}
                }
            }
        });
        Self { stop, watch }
    }

    async fn stop(self) -> (usize, Vec<String>) {
        let _ = self.stop.send(());
        self.watch.await.expect("the health watch")
    }
}

/// Executions that ended, and those of them completed, as the execution
/// service counts them.
async fn runs_ended(url: &str) -> (f64, f64) {
    let text = scrape(url).await;
    let runs = |label: &str| -> f64 {
        series(&text, "muster_process_runs_total")
            .filter(|(line, _)| line.contains(label))
            .map(|(_, value)| value)
            .sum()
    };
    (runs(""), runs("status=\"completed\""))
}

/// The execution service's histogram of the time from a step becoming ready
/// to its assignment being sent: (upper bound in seconds, count within it).
async fn dispatch_histogram(url: &str) -> Vec<(f64, f64)> {
    let text = scrape(url).await;
    let mut buckets: Vec<(f64, f64)> = series(&text, "muster_execution_step_dispatch_seconds_bucket")
        .filter_map(|(line, count)| {
            let bound = line.split("le=\"").nth(1)?.split('"').next()?;
            Some((if bound == "+Inf" { f64::INFINITY } else { bound.parse().ok()? }, count))
        })
        .collect();
    buckets.sort_by(|left, right| left.0.total_cmp(&right.0));
    buckets
}

/// What a histogram counted since `before`: (upper bound in seconds, count within it).
fn since(before: &[(f64, f64)], after: &[(f64, f64)]) -> Vec<(f64, f64)> {
    after
        .iter()
        .map(|(bound, count)| {
            (*bound, count - before.iter().find(|(earlier, _)| earlier == bound).map_or(0.0, |(_, count)| *count))
        })
        .collect()
}

/// The bucket bound, in milliseconds, under which `share` of what `counted` holds fell.
fn bound_ms(counted: &[(f64, f64)], share: f64) -> f64 {
    let total = counted.last().map_or(0.0, |(_, count)| *count);
    counted.iter().find(|(_, count)| *count >= share * total).map_or(f64::NAN, |(bound, _)| bound * 1e3)
}

/// The dispatch measure since `before`: p50 and p99 bounds, share within 5 ms.
fn dispatch_since(before: &[(f64, f64)], after: &[(f64, f64)]) -> String {
    let sent = since(before, after);
    let total = sent.last().map_or(0.0, |(_, count)| *count);
    let within = sent.iter().find(|(bound, _)| (*bound - 0.005).abs() < 1e-9).map_or(0.0, |(_, count)| *count);
    format!("≤{:>5} / ≤{:>5} {:>6.1}%", bound_ms(&sent, 0.5), bound_ms(&sent, 0.99), 100.0 * within / total.max(1.0))
}

/// The `p`th percentile of sorted `waits`, in milliseconds.
fn percentile(waits: &[Duration], p: f64) -> f64 {
    if waits.is_empty() {
        return 0.0;
    }
    let index = ((waits.len() - 1) as f64 * p).round() as usize;
    waits[index].as_secs_f64() * 1e3
}

/// Runs the users' shapes and prints their rows: those `shapes` names
/// (`chain/10`, `chain/1`, `many/100`, `many/1000`), every one when it is
/// empty, the chains `chain` steps long.
pub(crate) async fn run(shapes: &[String], chain: usize) {
    let runs = |shape: &str| shapes.is_empty() || shapes.iter().any(|wanted| wanted == shape);
    let Some(test) = TestCluster::start(Backend::Sqlite).await else { return };
    let mut agents: Vec<Agent> = (0..AGENTS)
        .map(|index| Agent { workload_capacity: 1000, ..agent(&format!("user-{index}"), "worker", "users") })
        .collect();
    agents.push(agent("lead", "lead", "users"));
    let tokens = test.register_agents(&agents).await;
    let credentials: Vec<AgentCredential> = agents
        .iter()
        .zip(&tokens)
        .take(AGENTS)
        .map(|(agent, token)| AgentCredential { agent_id: agent.id.clone(), token: token.clone() })
        .collect();
    let timed = Timed::default();
    let (stop, worker) = spawn_worker(test.operator("execution"), credentials, timed.clone());
    let mut client = test.execution();
    let names: Vec<String> = agents.iter().take(AGENTS).map(|agent| agent.id.clone()).collect();
    let (mut processes, mut paced) = (Vec::new(), Vec::new());
    for (index, agents) in names.chunks(AGENTS_PER_PROCESS).enumerate() {
        processes.push(publish(&mut client, &chain_over(&format!("users-{index}"), STEPS, agents)).await);
        if runs("paced/1000") {
            let yaml = paced_chain_over(&format!("users-paced-{index}"), STEPS, agents, PACE_MS);
            paced.push(publish(&mut client, &yaml).await);
        }
    }
    // The worker's hello settles.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pids = service_pids(&test);

    println!();
    println!(
        "users'    {:<9} {:>6}  {:>7} {:>8} {:>8}  {:>7} {:>16} {:>26} {:>8}   CPU % of a core: execution notifier roster worker+client",
        "shape",
        "steps",
        "seconds",
        "steps/s",
        "µs/step",
        "refused",
        "to worker p50/99",
        "dispatch p50/p99 ms, ≤5 ms",
        "unwell"
    );
    if runs("chain/10") {
        let measure = Measure::start(&test, &pids).await;
        let seconds = run_once(&mut client, &chain_over("users-chain", chain, &names[..AGENTS_PER_PROCESS])).await;
        measure.row("chain/10", chain, seconds, 0, &timed).await;
    }
    if runs("chain/1") {
        let measure = Measure::start(&test, &pids).await;
        let seconds = run_once(&mut client, &chain_over("users-chain-1", chain, &names[..1])).await;
        measure.row("chain/1", chain, seconds, 0, &timed).await;
    }
    for executions in [100, 1000].into_iter().filter(|executions| runs(&format!("many/{executions}"))) {
        many(&test, &client, &timed, &processes, &format!("many/{executions}"), executions, &pids).await;
    }
    if runs("paced/1000") {
        many(&test, &client, &timed, &paced, "paced/1000", 1000, &pids).await;
    }
    let _ = stop.send(());
    let _ = worker.await;
    test.shutdown().await;
}

/// `executions` runs of the ten-step `processes` at once; prints their row, named `shape`.
async fn many(
    test: &TestCluster,
    client: &ExecutionClient,
    timed: &Timed,
    processes: &[String],
    shape: &str,
    executions: usize,
    pids: &[u32],
) {
    let url = test.cluster().execution_url();
    let (ended_before, completed_before) = runs_ended(&url).await;
    let measure = Measure::start(test, pids).await;
    let started = Instant::now();
    let starts: Vec<_> = (0..executions)
        .map(|index| {
            let mut client = client.clone();
            let process_name = processes[index % processes.len()].clone();
            tokio::spawn(async move {
                client.start_execution(StartExecutionRequest { process_name, ..Default::default() }).await.err()
            })
        })
        .collect();
    let mut refusals: HashMap<String, usize> = HashMap::new();
    for start in starts {
        if let Some(status) = start.await.expect("a start") {
            *refusals.entry(format!("{:?}: {}", status.code(), status.message())).or_default() += 1;
        }
    }
    let answered = started.elapsed().as_secs_f64();
    let refused: usize = refusals.values().sum();
    let running = (executions - refused) as f64;
    // Until every run started has ended.
    let ended = loop {
        let (ended, completed) = runs_ended(&url).await;
        if ended - ended_before >= running {
            break (ended - ended_before, completed - completed_before);
        }
        assert!(started.elapsed() < Duration::from_secs(600), "the runs did not end in 10 minutes");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let seconds = started.elapsed().as_secs_f64();
    measure.row(shape, running as usize * STEPS, seconds, refused, timed).await;
    println!(
        "          the {executions} starts answered in {answered:.3} s, {:.0} a second",
        executions as f64 / answered
    );
    assert_eq!(ended.0, ended.1, "every run that ended completed");
    for (reason, count) in refusals {
        println!("          {count} starts refused: {reason}");
    }
}

/// What a row measures around a run: the processes' CPU, the services'
/// health, the engine's dispatch histogram.
struct Measure<'a> {
    pids: &'a [u32],
    url: String,
    cpu_before: Vec<f64>,
    dispatched: Vec<(f64, f64)>,
    /// The execution store's transactions, the commits they held, and
    /// their time, by kind (progress, other).
    store_before: [[f64; 3]; 2],
    health: HealthWatch,
}

/// The execution store's transactions, the commits they held, and their
/// time in seconds, of the running executions' progress and of the rest.
async fn store_figures(url: &str) -> [[f64; 3]; 2] {
    let text = scrape(url).await;
    ["progress", "other"].map(|kind| {
        let label = format!("kind=\"{kind}\"");
        let sum =
            |name: &str| series(&text, name).filter(|(line, _)| line.contains(&label)).map(|(_, value)| value).sum();
        [
            sum("muster_execution_commit_seconds_count"),
            sum("muster_execution_commits_total"),
            sum("muster_execution_commit_seconds_sum"),
        ]
    })
}

impl<'a> Measure<'a> {
    async fn start(test: &TestCluster, pids: &'a [u32]) -> Self {
        let url = test.cluster().execution_url();
        let dispatched = dispatch_histogram(&url).await;
        let store_before = store_figures(&url).await;
        let cpu_before = pids.iter().map(|pid| cpu_seconds(*pid)).collect();
        Self { pids, url, cpu_before, dispatched, store_before, health: HealthWatch::start(test) }
    }

    /// Prints the row of `steps` run in `seconds`, with the waits `timed` recorded.
    async fn row(self, shape: &str, steps: usize, seconds: f64, refused: usize, timed: &Timed) {
        let (asked, unwell) = self.health.stop().await;
        let waits = timed.take_waits();
        println!(
            "{:<9} {shape:<9} {steps:>6}  {seconds:>7.3} {:>8.0} {:>8.0}  {refused:>7} {:>7.2} / {:>6.2} {:>26} {:>8}   {}",
            "SQLite",
            steps as f64 / seconds,
            seconds * 1e6 / steps as f64,
            percentile(&waits, 0.5),
            percentile(&waits, 0.99),
            dispatch_since(&self.dispatched, &dispatch_histogram(&self.url).await),
            format!("{}/{asked}", unwell.len()),
            cpu_used(self.pids, &self.cpu_before, seconds)
        );
        let store = store_figures(&self.url).await;
        for (kind, (after, before)) in ["progress", "other"].iter().zip(store.iter().zip(&self.store_before)) {
            let [transactions, commits, time] = [0, 1, 2].map(|index| after[index] - before[index]);
            println!(
                "          the execution store's {kind}: {transactions} transactions holding {commits} commits, {:.0} µs each, {:.0}% of the time",
                time * 1e6 / transactions.max(1.0),
                time * 100.0 / seconds
            );
        }
        for reason in unwell.iter().take(5) {
            println!("          not serving: {reason}");
        }
    }
}
