//! Partitions: the cluster spread over hosts of a private network (each
//! replica, each worker and PostgreSQL on a host of its own), one link cut
//! for seconds while runs are started and driven, then healed. Whatever
//! the link, every run completes, each step completed once, its events
//! without gap or repeat, and the lead hears of each event once (in its
//! inbox and in its memory files). An execution replica cut off from the
//! database past its lease stops, and another takes its runs over; one
//! paused past its lease commits nothing when it wakes.

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use muster::credentials::Endpoint;
use muster_proto::{
    common::v1::{EventType, ExecutionStatus, StepEvent},
    execution::v1::{
        GetExecutionRequest, ListExecutionsRequest, PublishProcessRequest, StartExecutionRequest, StepStatus,
        execution_service_client::ExecutionServiceClient,
    },
};
use muster_tests::{
    agent, events_until_finished,
    spread::{Layout, SpreadCluster},
};

/// The execution replicas' lease here: a replica cut off from the
/// database stops within about this, and another takes its runs over.
pub(crate) const LEASE_MS: u64 = 2_000;
/// How long a link stays cut.
const CUT: Duration = Duration::from_secs(5);
/// How soon a replica that lost its lease has stopped: the lease, the
/// shutdown's grace for the calls in flight (5 s), a second for its drivers.
const STOPS_WITHIN: Duration = Duration::from_millis(LEASE_MS + 9_000);
/// Steps of each run.
pub(crate) const STEPS: usize = 24;
/// The agents the runs' steps go to, in turn.
pub(crate) const DOERS: usize = 4;

/// One roster, one notifier, two execution replicas, two workers.
fn layout() -> Layout {
    Layout { rosters: 1, notifiers: 1, executions: 2, lease_ms: LEASE_MS, worker_lease_ms: 3_000 }
}

/// A run of `steps` steps, each to the next of the doers, every event to
/// the lead (`watcher`).
pub(crate) fn process(name: &str, steps: usize) -> String {
    let mut yaml = format!("name: {name}\nlead: watcher\nsteps:\n");
    for index in 0..steps {
        let doer = format!("doer-{}", index % DOERS);
        yaml.push_str(&format!(
            "  - id: s{index}\n    type: agent_task\n    agent: {doer}\n    message: step {index}\n    roles:\n      executor: {doer}\n      informed: [watcher]\n"
        ));
        if index > 0 {
            yaml.push_str(&format!("    depends_on: [s{}]\n", index - 1));
        }
    }
    yaml
}

/// Registers the doers and the watcher, starts `workers` workers serving
/// them all, and publishes the process `name`.
pub(crate) async fn prepare(cluster: &mut SpreadCluster, workers: usize, name: &str) {
    let mut agents: Vec<_> = (0..DOERS).map(|index| agent(&format!("doer-{index}"), "worker", "team")).collect();
    agents.push(agent("watcher", "worker", "team"));
    let tokens = cluster.register_agents(&agents).await;
    cluster.start_workers(workers, &tokens).await;
    let mut execution = ExecutionServiceClient::new(cluster.operator("execution").channel().unwrap());
    let source = process(name, STEPS);
    execution
        .publish_process(PublishProcessRequest { source, file_name: format!("{name}.yaml") })
        .await
        .expect("publishing the process");
}

/// Starts runs of `name` until stopped (or `limit` were), through each
/// execution replica in turn, one every `every`; the ids of those whose start was answered (a
/// start whose answer was lost may have started a run too: the checks
/// list every run of the process).
pub(crate) struct Starter {
    stop: Arc<AtomicBool>,
    handle: tokio::task::JoinHandle<Vec<String>>,
}

impl Starter {
    pub(crate) fn new(cluster: &SpreadCluster, name: &str, every: Duration, limit: usize) -> Self {
        let replicas: Vec<Endpoint> =
            (0..cluster.replicas("execution")).map(|index| cluster.operator_of("execution", index)).collect();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let name = name.to_owned();
        let handle = tokio::spawn(async move {
            let mut started = Vec::new();
            let mut turn = 0;
            while !stopped.load(Ordering::Relaxed) && started.len() < limit {
                let replica = &replicas[turn % replicas.len()];
                turn += 1;
                let mut client = ExecutionServiceClient::new(replica.channel().unwrap());
                let request = StartExecutionRequest { process_name: name.clone(), ..Default::default() };
                let answer = tokio::time::timeout(Duration::from_secs(3), client.start_execution(request)).await;
                if let Ok(Ok(response)) = answer {
                    started.push(response.into_inner().execution.expect("an execution").id);
                }
                tokio::time::sleep(every).await;
            }
            started
        });
        Self { stop, handle }
    }

    /// Waits until `limit` runs were started; their ids.
    pub(crate) async fn finish(self) -> Vec<String> {
        self.handle.await.expect("the starter")
    }

    /// Stops starting runs; the ids of those started.
    pub(crate) async fn stop(self) -> Vec<String> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.await.expect("the starter")
    }
}

/// Every run of process `name`, read through any execution replica.
async fn runs_of(execution: &Endpoint, name: &str) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    'again: loop {
        assert!(tokio::time::Instant::now() < deadline, "the runs could not be listed");
        let mut client = ExecutionServiceClient::new(execution.channel().unwrap());
        let mut ids = Vec::new();
        let mut page_token = String::new();
        loop {
            let request = ListExecutionsRequest {
                process_name: name.to_owned(),
                limit: 1000,
                page_token: page_token.clone(),
                ..Default::default()
            };
            let Ok(page) = client.list_executions(request).await else {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue 'again;
            };
            let page = page.into_inner();
            ids.extend(page.executions.into_iter().map(|execution| execution.id));
            if page.next_page_token.is_empty() {
                return ids;
            }
            page_token = page.next_page_token;
        }
    }
}

/// Waits until no run of process `name` is running; how long that took.
pub(crate) async fn wait_until_finished(cluster: &SpreadCluster, name: &str) -> Duration {
    let began = tokio::time::Instant::now();
    let execution = cluster.operator("execution");
    let mut described = false;
    loop {
        assert!(began.elapsed() < Duration::from_secs(240), "runs of {name} still run after 4 minutes");
        let mut client = ExecutionServiceClient::new(execution.channel().unwrap());
        let request = ListExecutionsRequest {
            process_name: name.to_owned(),
            status: ExecutionStatus::Running as i32,
            limit: 10,
            ..Default::default()
        };
        if let Ok(page) = client.list_executions(request).await {
            let running = page.into_inner().executions;
            if running.is_empty() {
                return began.elapsed();
            }
            // A run this slow is worth a look: where its steps stand.
            if !described && began.elapsed() > Duration::from_secs(30) {
                described = true;
                for run in running {
                    let request = GetExecutionRequest { id: run.id.clone() };
                    let Ok(answer) = client.get_execution(request).await else { continue };
                    let steps = answer.into_inner().execution.map(|run| run.steps).unwrap_or_default();
                    let open: Vec<String> = steps
                        .iter()
                        .filter(|step| step.status != StepStatus::Completed as i32)
                        .map(|step| format!("{} {:?}", step.step_id, StepStatus::try_from(step.status)))
                        .take(3)
                        .collect();
                    eprintln!("run {} still runs {:?} later: {}", run.id, began.elapsed(), open.join(", "));
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every run of process `name` completed, each step once, its events
/// without gap or repeat; the lead heard of each event once, in its inbox
/// and in its memory files. Returns how many runs there were, and when
/// the lead had heard of every run's end.
pub(crate) async fn assert_every_run_completed_once(
    cluster: &SpreadCluster,
    name: &str,
    started: &[String],
    steps: usize,
) -> (usize, tokio::time::Instant) {
    let execution = cluster.operator("execution");
    let runs = runs_of(&execution, name).await;
    let known: HashSet<&String> = runs.iter().collect();
    for id in started {
        assert!(known.contains(id), "run {id} was started and is not listed");
    }
    // Read eight runs at a time.
    let mut reading = tokio::task::JoinSet::new();
    let mut fetched = Vec::new();
    for id in &runs {
        if reading.len() == 8 {
            fetched.push(reading.join_next().await.unwrap().unwrap());
        }
        let (execution, id) = (execution.clone(), id.clone());
        reading.spawn(async move { (events_until_finished(&execution, &id).await, id) });
    }
    fetched.extend(reading.join_all().await);
    let mut events_of: HashMap<String, Vec<StepEvent>> = HashMap::new();
    for (events, id) in fetched {
        let finished = events.last().unwrap();
        assert_eq!(finished.execution_status, ExecutionStatus::Completed as i32, "run {id}: {}", finished.detail);
        for (position, event) in events.iter().enumerate() {
            assert_eq!(event.sequence, position as u64 + 1, "run {id}: event sequences have no gap and no repeat");
        }
        let mut completed = HashMap::new();
        for event in events.iter().filter(|event| event.event_type == EventType::StepCompleted as i32) {
            *completed.entry(event.step_id.clone()).or_insert(0) += 1;
        }
        assert_eq!(completed.len(), steps, "run {id}: every step completed");
        assert!(completed.values().all(|count| *count == 1), "run {id}: a step completed twice: {completed:?}");
        events_of.insert(id, events);
    }

    // The lead's inbox, read whole until it holds every run's end: every
    // event of every run, once.
    let notifier = cluster.operator("notifier");
    let ends: HashSet<&str> = events_of.values().map(|events| events.last().unwrap().event_id.as_str()).collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let heard: HashMap<String, usize> = loop {
        let mut heard: HashMap<String, usize> = HashMap::new();
        for notification in muster::inbox::all(&notifier, "watcher").await.unwrap_or_default() {
            *heard.entry(notification.event.unwrap().event_id).or_insert(0) += 1;
        }
        if ends.iter().all(|end| heard.contains_key(*end)) {
            break heard;
        }
        assert!(tokio::time::Instant::now() < deadline, "the lead never heard that every run finished");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let heard_all = tokio::time::Instant::now();
    // Its memory: a line for each event, none twice (lines carry no
    // sequence: counted by run, kind and step).
    let mut lines: HashMap<(String, String, String), usize> = HashMap::new();
    for line in muster_tests::ndjson_lines(&cluster.data_dir.join("agents/watcher/events")) {
        let text = |field: &str| line[field].as_str().unwrap_or_default().to_owned();
        *lines.entry((text("execution_id"), text("event_type"), text("step_id"))).or_insert(0) += 1;
    }
    let mut expected: HashMap<(String, String, String), usize> = HashMap::new();
    for (id, events) in &events_of {
        for event in events {
            assert_eq!(
                heard.get(&event.event_id),
                Some(&1),
                "run {id}: event {} in the lead's inbox once",
                event.sequence
            );
            let kind = EventType::try_from(event.event_type).unwrap().as_str_name();
            let kind = kind.trim_start_matches("EVENT_TYPE_").to_lowercase();
            *expected.entry((id.clone(), kind, event.step_id.clone())).or_insert(0) += 1;
        }
    }
    assert_eq!(lines, expected, "a memory line for each event the lead heard of, none twice");
    (runs.len(), heard_all)
}

/// Runs are started and driven while the link between hosts `a` and `b`
/// is cut for [`CUT`], then healed: nothing is lost or doubled.
async fn through_a_cut(a: &str, b: &str) {
    let Some(mut cluster) = SpreadCluster::start(&layout()).await else { return };
    prepare(&mut cluster, 2, "cut").await;
    let starter = Starter::new(&cluster, "cut", Duration::from_millis(150), usize::MAX);
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster.network.cut(a, b);
    tokio::time::sleep(CUT).await;
    cluster.network.heal(a, b);
    let healed = tokio::time::Instant::now();
    let started = starter.stop().await;
    assert!(started.len() > 10, "runs were started: {}", started.len());
    wait_until_finished(&cluster, "cut").await;
    let finished = healed.elapsed();
    let (runs, heard) = assert_every_run_completed_once(&cluster, "cut", &started, STEPS).await;
    eprintln!(
        "{a} cut from {b} for {CUT:?}: {runs} runs; the last finished {finished:?} after the heal, the lead had heard of every event {:?} after it",
        heard - healed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn execution_cut_from_the_roster() {
    through_a_cut("execution-0", "roster-0").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn execution_cut_from_the_notifier() {
    through_a_cut("execution-0", "notifier-0").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_cut_from_its_execution_replica() {
    through_a_cut("worker-0", "execution-0").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_notifier_cut_from_the_database() {
    through_a_cut("notifier-0", "postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_execution_replicas_cut_from_each_other() {
    through_a_cut("execution-0", "execution-1").await;
}

/// How many steps of the run have completed, asked through `execution`.
async fn completed_steps(execution: &Endpoint, id: &str) -> usize {
    let mut client = ExecutionServiceClient::new(execution.channel().unwrap());
    let run = client.get_execution(GetExecutionRequest { id: id.to_owned() }).await.expect("reading a run");
    let steps = run.into_inner().execution.expect("a run").steps;
    steps.iter().filter(|step| step.status == StepStatus::Completed as i32).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_execution_replica_cut_from_the_database_stops_and_its_runs_move() {
    let Some(mut cluster) = SpreadCluster::start(&layout()).await else { return };
    prepare(&mut cluster, 2, "cut").await;
    let starter = Starter::new(&cluster, "cut", Duration::from_millis(150), usize::MAX);
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster.network.cut("execution-0", "postgres");
    let cut_at = tokio::time::Instant::now();

    // Past its lease the replica stops itself (its calls in flight given
    // the shutdown's grace): it can neither renew nor commit.
    assert!(
        cluster.wait_for_exit("execution", 0, STOPS_WITHIN).await,
        "execution-0, cut off from the database, still runs {:?} later",
        cut_at.elapsed()
    );
    eprintln!("execution-0 stopped {:?} after it was cut off from the database", cut_at.elapsed());
    // The other replica drives its runs on while the cut lasts: a run
    // started through it before the cut makes progress.
    let other = cluster.operator_of("execution", 1);
    let started_before = runs_of(&other, "cut").await;
    let unfinished = |counts: &[(String, usize)]| counts.iter().filter(|(_, count)| *count < STEPS).count();
    let mut before = Vec::new();
    for id in &started_before {
        before.push((id.clone(), completed_steps(&other, id).await));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut moved = 0;
    for (id, count) in &before {
        moved += usize::from(*count < STEPS && completed_steps(&other, id).await > *count);
    }
    assert!(unfinished(&before) == 0 || moved > 0, "no unfinished run moved on while execution-0 was cut off");
    cluster.network.heal("execution-0", "postgres");
    cluster.restart("execution", 0).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let started = starter.stop().await;
    let (runs, _) = assert_every_run_completed_once(&cluster, "cut", &started, STEPS).await;
    eprintln!("{runs} runs completed; {moved} moved on while execution-0 was cut off");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_execution_replica_paused_past_its_lease_commits_nothing_when_it_wakes() {
    use nix::sys::signal::{Signal, kill};
    let Some(mut cluster) = SpreadCluster::start(&layout()).await else { return };
    prepare(&mut cluster, 2, "paused").await;
    let starter = Starter::new(&cluster, "paused", Duration::from_millis(150), usize::MAX);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pid = nix::unistd::Pid::from_raw(cluster.pid("execution", 0).expect("execution-0 runs") as i32);
    // Frozen mid-run (commits queued, a transaction perhaps open), as a
    // long pause of the process or its machine would: the other replica
    // takes its runs over once the lease lapses by the database's clock.
    kill(pid, Signal::SIGSTOP).unwrap();
    tokio::time::sleep(Duration::from_millis(LEASE_MS * 3)).await;
    kill(pid, Signal::SIGCONT).unwrap();
    // Woken, whatever it had queued is refused by the database; it stops.
    assert!(cluster.wait_for_exit("execution", 0, STOPS_WITHIN).await, "execution-0 woke and still runs");
    cluster.restart("execution", 0).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let started = starter.stop().await;
    assert_every_run_completed_once(&cluster, "paused", &started, STEPS).await;
}
