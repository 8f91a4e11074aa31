//! A bounded chaos run: three replicas of the roster, the notifier and the
//! execution service and three workers, each on a host of its own with a
//! private PostgreSQL, while 200 runs are started and driven; for two
//! minutes, one after another, a random process is killed (SIGKILL) and
//! started again, or a random link is cut for seconds and healed; slow
//! clients (silent connections, watchers that read slowly) hang on
//! throughout. Afterwards every run completed, each step once, and the lead
//! heard of each event once; no service grew past [`RSS_LIMIT_MIB`].
//! `MUSTER_CHAOS_SEED` replays a run's choices (the seed is printed).

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use muster_proto::execution::v1::{WatchExecutionRequest, execution_service_client::ExecutionServiceClient};
use muster_tests::spread::{Layout, SpreadCluster};

use crate::partitions::{LEASE_MS, STEPS, Starter, assert_every_run_completed_once, prepare, wait_until_finished};

/// How long the faults go on.
const CHAOS: Duration = Duration::from_secs(120);
/// How many runs are started.
const RUNS: usize = 200;
/// The most resident memory any service process may reach, in MiB.
const RSS_LIMIT_MIB: u64 = 128;
/// The services whose processes are killed, and the workers.
const KILLABLE: [&str; 4] = ["roster", "notifier", "execution", "worker"];

/// A small random source (xorshift), seeded so that a run can be replayed.
struct Dice(u64);

impl Dice {
    fn roll(&mut self, sides: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % sides
    }

    fn pause(&mut self, from_ms: u64, to_ms: u64) -> Duration {
        Duration::from_millis(from_ms + self.roll(to_ms - from_ms))
    }
}

/// Keeps connections open to every replica that never say a word, and
/// watchers that read one event a second, until `stop`.
fn slow_clients(cluster: &SpreadCluster, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<()> {
    let addresses: Vec<String> = ["roster", "notifier", "execution"]
        .iter()
        .flat_map(|service| {
            (0..cluster.replicas(service)).map(|index| cluster.replica_url(service, index).replace("http://", ""))
        })
        .collect();
    let execution = cluster.operator("execution");
    tokio::spawn(async move {
        let mut silent = Vec::new();
        let mut watchers = tokio::task::JoinSet::new();
        while !stop.load(Ordering::Relaxed) {
            // Connections that never speak: the services close them after
            // their handshake limit; they are opened again.
            silent.retain(|connection: &tokio::task::JoinHandle<()>| !connection.is_finished());
            for address in addresses.iter().cycle().take(24usize.saturating_sub(silent.len())) {
                let address = address.clone();
                silent.push(tokio::spawn(async move {
                    if let Ok(Ok(mut stream)) =
                        tokio::time::timeout(Duration::from_secs(1), tokio::net::TcpStream::connect(&address)).await
                    {
                        let mut buffer = [0_u8; 64];
                        let _ = tokio::time::timeout(
                            Duration::from_secs(30),
                            tokio::io::AsyncReadExt::read(&mut stream, &mut buffer),
                        )
                        .await;
                    }
                }));
            }
            // Watchers of the newest runs that read slowly.
            while watchers.len() < 12 {
                let execution = execution.clone();
                watchers.spawn(async move {
                    let Ok(channel) = execution.channel() else { return };
                    let mut client = ExecutionServiceClient::new(channel);
                    let Ok(runs) = client
                        .list_executions(muster_proto::execution::v1::ListExecutionsRequest {
                            limit: 5,
                            ..Default::default()
                        })
                        .await
                    else {
                        return;
                    };
                    let Some(run) = runs.into_inner().executions.pop() else { return };
                    let request = WatchExecutionRequest { execution_id: run.id, after_sequence: 0 };
                    let Ok(stream) = client.watch_execution(request).await else { return };
                    let mut stream = stream.into_inner();
                    for _ in 0..20 {
                        if !matches!(stream.message().await, Ok(Some(_))) {
                            return;
                        }
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                });
            }
            tokio::select! {
                _ = watchers.join_next() => {}
                () = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
        }
        for connection in silent {
            connection.abort();
        }
    })
}

/// Starts every process that is not running (a replica that lost its
/// lease stops itself).
async fn revive(cluster: &mut SpreadCluster) {
    for service in KILLABLE {
        for index in 0..cluster.replicas(service) {
            if !cluster.is_running(service, index) {
                cluster.restart(service, index).await;
            }
        }
    }
}

/// The largest resident memory of the cluster's service processes, in KiB,
/// with its owner.
fn largest_rss(cluster: &mut SpreadCluster) -> (u64, String) {
    let mut largest = (0, String::new());
    for service in ["roster", "notifier", "execution"] {
        for index in 0..cluster.replicas(service) {
            let rss = cluster.pid(service, index).map_or(0, muster_tests::rss_kib);
            if rss > largest.0 {
                largest = (rss, format!("{service}-{index}"));
            }
        }
    }
    largest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_minutes_of_kills_cuts_and_slow_clients_lose_nothing() {
    let layout = Layout { rosters: 3, notifiers: 3, executions: 3, lease_ms: LEASE_MS, worker_lease_ms: 3_000 };
    let Some(mut cluster) = SpreadCluster::start(&layout).await else { return };
    prepare(&mut cluster, 3, "chaos").await;
    let seed = std::env::var("MUSTER_CHAOS_SEED").ok().and_then(|seed| seed.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos() as u64 | 1
    });
    eprintln!("chaos seed {seed} (MUSTER_CHAOS_SEED={seed} replays its choices)");
    let mut dice = Dice(seed);
    let hosts: Vec<String> = ["postgres"]
        .into_iter()
        .map(str::to_owned)
        .chain(KILLABLE.iter().flat_map(|service| {
            let count = cluster.replicas(service);
            (0..count).map(move |index| format!("{service}-{index}"))
        }))
        .collect();

    let stop_slow = Arc::new(AtomicBool::new(false));
    let slow = slow_clients(&cluster, stop_slow.clone());
    let starter = Starter::new(&cluster, "chaos", CHAOS.mul_f64(0.75) / RUNS as u32, RUNS);
    let began = tokio::time::Instant::now();
    let mut peak = (0, String::new());
    let mut actions = Vec::new();
    while began.elapsed() < CHAOS {
        if dice.roll(2) == 0 {
            let service = KILLABLE[dice.roll(KILLABLE.len() as u64) as usize];
            let index = dice.roll(cluster.replicas(service) as u64) as usize;
            cluster.kill(service, index).await;
            tokio::time::sleep(dice.pause(200, 2_000)).await;
            actions.push(format!("killed {service}-{index}"));
        } else {
            let a = &hosts[dice.roll(hosts.len() as u64) as usize];
            let b = &hosts[dice.roll(hosts.len() as u64) as usize];
            // A worker talks to its execution replica alone.
            let worker = |x: &str, y: &str| x.starts_with("worker") && !y.starts_with("execution");
            if a == b || worker(a, b) || worker(b, a) {
                continue;
            }
            let cut = dice.pause(2_000, 6_000);
            cluster.network.cut(a, b);
            tokio::time::sleep(cut).await;
            cluster.network.heal(a, b);
            actions.push(format!("cut {a} from {b} for {cut:?}"));
        }
        revive(&mut cluster).await;
        let rss = largest_rss(&mut cluster);
        if rss.0 > peak.0 {
            peak = rss;
        }
        tokio::time::sleep(dice.pause(500, 2_000)).await;
    }
    let started = tokio::time::timeout(Duration::from_secs(120), starter.finish()).await.expect("200 runs started");
    stop_slow.store(true, Ordering::Relaxed);
    slow.abort();
    revive(&mut cluster).await;
    eprintln!("{} faults in {:?}: {}", actions.len(), began.elapsed(), actions.join("; "));
    let drained = wait_until_finished(&cluster, "chaos").await;
    eprintln!("every run finished {drained:?} after the last fault");
    let (runs, _) = assert_every_run_completed_once(&cluster, "chaos", &started, STEPS).await;
    let rss = largest_rss(&mut cluster);
    if rss.0 > peak.0 {
        peak = rss;
    }
    eprintln!("{runs} runs completed once; largest service process {} MiB ({})", peak.0 / 1024, peak.1);
    assert_eq!(started.len(), RUNS, "every start was answered in the end");
    assert!(peak.0 / 1024 <= RSS_LIMIT_MIB, "{} reached {} MiB", peak.1, peak.0 / 1024);
}
