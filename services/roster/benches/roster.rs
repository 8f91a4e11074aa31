//! Roster benchmark: `Delegate` and `GetOrganizationRoster(by_expertise)` over a
//! large organisation (default 100,000 agents in 1,000 teams with 200
//! expertise tags), in process (the service called directly) and over gRPC on
//! loopback, on SQLite. Prints p50/p99 and decisions per second.
//!
//! `cargo bench -p muster-roster --bench roster` (sizes: ROSTER_BENCH_AGENTS,
//! ROSTER_BENCH_TEAMS, ROSTER_BENCH_TAGS, ROSTER_BENCH_ITERATIONS).

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use muster_proto::roster::v1::{
    self as pb, roster_service_client::RosterServiceClient, roster_service_server::RosterService,
};
use muster_roster::{
    Config, RosterGrpc, SystemClock,
    domain::{
        delegation::{DelegationRequest, Settings, Snapshot, decide},
        model::Agent,
    },
    store::{AgentQuery, ImportPlan, SqlStore, Store},
};
use muster_runtime::{
    auth::{Caller, TokenHash, client::with_credentials},
    testing::TestCredentials,
};
use tonic::Request;

/// A request as the authentication layer hands it on: from an operator.
fn as_operator<T>(message: T) -> Request<T> {
    let mut request = Request::new(message);
    request.extensions_mut().insert(Caller::Operator { name: "bench".into() });
    request
}

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|value| value.parse().ok()).unwrap_or(default)
}

#[derive(Clone, Copy)]
struct Sizes {
    agents: usize,
    teams: usize,
    tags: usize,
    iterations: usize,
}

fn agent_at(index: usize, sizes: &Sizes) -> Agent {
    let team = index % sizes.teams;
    let lead = team; // the first agent of each team leads it
    let tags = [(index * 7) % sizes.tags, (index * 13 + 1) % sizes.tags, (index * 31 + 2) % sizes.tags];
    let mut expertise: Vec<String> = tags.iter().map(|tag| format!("tag-{tag}")).collect();
    expertise.sort();
    expertise.dedup();
    Agent {
        id: format!("agent-{index:06}"),
        name: format!("Agent {index}"),
        role: format!("role-{}", index % 20),
        team: format!("team-{team:04}"),
        senior_id: if index == lead { String::new() } else { format!("agent-{lead:06}") },
        expertise,
        workload_capacity: 5,
        max_iterations: 10,
        ..Agent::default()
    }
}

fn percentiles(mut samples: Vec<Duration>) -> (Duration, Duration, f64) {
    samples.sort();
    let total: Duration = samples.iter().sum();
    let at = |fraction: f64| samples[((samples.len() as f64 * fraction) as usize).min(samples.len() - 1)];
    (at(0.50), at(0.99), samples.len() as f64 / total.as_secs_f64())
}

/// The process's resident memory (Linux), in KiB; 0 where unknown.
fn resident_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn report(name: &str, samples: Vec<Duration>) {
    let count = samples.len();
    let (p50, p99, per_second) = percentiles(samples);
    println!("{name:<52} n={count:<6} p50={p50:>10.1?} p99={p99:>10.1?} {per_second:>10.0}/s");
}

fn delegate_request(iteration: usize, sizes: &Sizes) -> pb::DelegateRequest {
    let requester = (iteration * 7919) % sizes.agents;
    let agent = agent_at(requester, sizes);
    pb::DelegateRequest {
        task_id: format!("bench-{iteration}"),
        requester_id: agent.id,
        required_expertise: vec![format!("tag-{}", (iteration * 17) % sizes.tags)],
        ..Default::default()
    }
}

/// The service binary's allocator, so that the service measured in process allocates as it does in its pod.
#[global_allocator]
static ALLOCATOR: muster_runtime::Allocator = muster_runtime::Allocator;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let sizes = Sizes {
        agents: setting("ROSTER_BENCH_AGENTS", 100_000),
        teams: setting("ROSTER_BENCH_TEAMS", 1_000),
        tags: setting("ROSTER_BENCH_TAGS", 200),
        iterations: setting("ROSTER_BENCH_ITERATIONS", 2_000),
    };
    let path = std::env::temp_dir().join(format!("muster-roster-bench-{}.db", std::process::id()));
    let url = format!("sqlite://{}", path.display());
    println!(
        "roster bench: {} agents, {} teams, {} tags, SQLite at {}",
        sizes.agents,
        sizes.teams,
        sizes.tags,
        path.display()
    );

    let store = SqlStore::connect(&url, 1).expect("store");
    store.migrate().await.expect("migrate");
    let started = Instant::now();
    let plan = ImportPlan {
        teams: (0..sizes.teams)
            .map(|team| muster_roster::domain::model::Team {
                name: format!("team-{team:04}"),
                description: String::new(),
                lead_agent_id: format!("agent-{team:06}"),
            })
            .collect(),
        roles: Vec::new(),
        agents: (0..sizes.agents)
            .map(|index| (agent_at(index, &sizes), TokenHash::of(&format!("token-{index}"))))
            .collect(),
    };
    store.import(&plan, 0).await.expect("import");
    println!("loaded in {:.1?}", started.elapsed());

    // The framework alone, over the snapshot of one expertise tag.
    let all =
        store.list_agents(&AgentQuery { expertise: "tag-3".into(), ..AgentQuery::default() }).await.expect("list");
    let snapshot = Snapshot { agents: all.iter().cloned().map(std::sync::Arc::new).collect(), ..Snapshot::default() };
    let mut samples = Vec::with_capacity(sizes.iterations);
    for iteration in 0..sizes.iterations {
        let requester = &all[iteration % all.len()];
        let request = DelegationRequest {
            task_id: "t".into(),
            requester_id: requester.id.clone(),
            required_expertise: vec!["tag-3".into()],
            ..DelegationRequest::default()
        };
        let start = Instant::now();
        let decision = decide(&request, &snapshot, 0, Settings::default());
        samples.push(start.elapsed());
        std::hint::black_box(decision);
    }
    report(&format!("decide() over one tag's {} agents (pure)", all.len()), samples);

    // The organisation in memory, loaded once (the service loads it on first use).
    let fresh = SqlStore::connect(&url, 1).expect("store");
    let before = resident_kib();
    let started = Instant::now();
    fresh.indexed_agent(&agent_at(0, &sizes).id).await.expect("index");
    println!(
        "roster index loaded in {:.1?}, resident memory {} -> {} MiB",
        started.elapsed(),
        before / 1024,
        resident_kib() / 1024
    );
    drop(fresh);
    store.indexed_agent(&agent_at(0, &sizes).id).await.expect("index");

    // In process: the service called directly (validation, transaction, reservation, audit),
    // with the audit trail folded in the background as the service does.
    let roster = RosterGrpc::new(store.clone(), Arc::new(SystemClock), Settings::default());
    let folding = store.clone();
    let folder = tokio::spawn(async move {
        let mut folds = tokio::time::interval(muster_roster::AUDIT_FOLD_INTERVAL);
        loop {
            folds.tick().await;
            folding.fold_audit_trail().await.expect("fold");
        }
    });
    let mut samples = Vec::with_capacity(sizes.iterations);
    for iteration in 0..sizes.iterations {
        let request = delegate_request(iteration, &sizes);
        let task_id = request.task_id.clone();
        let start = Instant::now();
        let response = roster.delegate(as_operator(request)).await.expect("delegate");
        samples.push(start.elapsed());
        std::hint::black_box(response);
        roster.release_task(as_operator(pb::ReleaseTaskRequest { task_id })).await.expect("release");
    }
    report("Delegate, in process", samples);
    folder.abort();

    let roster_iterations = (sizes.iterations / 10).max(20);
    let mut samples = Vec::with_capacity(roster_iterations);
    for iteration in 0..roster_iterations {
        let request = pb::GetOrganizationRosterRequest {
            agent_id: agent_at(iteration * 31 % sizes.agents, &sizes).id,
            filter: pb::RosterFilter::ByExpertise as i32,
            expertise: format!("tag-{}", iteration % sizes.tags),
        };
        let start = Instant::now();
        let response = roster.get_organization_roster(as_operator(request)).await.expect("roster");
        samples.push(start.elapsed());
        std::hint::black_box(response);
    }
    report("GetOrganizationRoster(by_expertise), in process", samples);

    // Over gRPC on loopback.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let mut config = Config::with_database(url.clone());
    let credentials = TestCredentials::new();
    credentials.apply(&mut config.server);
    let server = tokio::spawn(muster_roster::run(config, listener, async move {
        let _ = stopped.await;
    }));
    let channel = muster_runtime::testing::connect_when_serving(&format!("http://{address}")).await;
    let mut client = RosterServiceClient::new(with_credentials(channel, credentials.operator()));
    let mut samples = Vec::with_capacity(sizes.iterations);
    for iteration in 0..sizes.iterations {
        let mut request = delegate_request(iteration, &sizes);
        request.task_id = format!("grpc-{iteration}");
        let task_id = request.task_id.clone();
        let start = Instant::now();
        let response = client.delegate(request).await.expect("delegate");
        samples.push(start.elapsed());
        std::hint::black_box(response);
        client.release_task(pb::ReleaseTaskRequest { task_id }).await.expect("release");
    }
    report("Delegate, gRPC loopback", samples);

    // Sixteen callers at once, each on its own connection, as many clients would.
    const CALLERS: usize = 16;
    let per_caller = (sizes.iterations / CALLERS).max(10);
    let mut callers = Vec::with_capacity(CALLERS);
    for caller in 0..CALLERS {
        let channel = muster_runtime::testing::connect_when_serving(&format!("http://{address}")).await;
        callers.push((caller, RosterServiceClient::new(with_credentials(channel, credentials.operator()))));
    }
    let started = Instant::now();
    let tasks: Vec<_> = callers
        .into_iter()
        .map(|(caller, mut client)| {
            tokio::spawn(async move {
                let mut samples = Vec::with_capacity(per_caller);
                for iteration in 0..per_caller {
                    let mut request = delegate_request(caller * per_caller + iteration, &sizes);
                    request.task_id = format!("concurrent-{caller}-{iteration}");
                    let start = Instant::now();
                    client.delegate(request).await.expect("delegate");
                    samples.push(start.elapsed());
                }
                (client, samples)
            })
        })
        .collect();
    let mut samples = Vec::with_capacity(CALLERS * per_caller);
    let mut clients = Vec::with_capacity(CALLERS);
    for task in tasks {
        let (client, caller_samples) = task.await.expect("caller");
        samples.extend(caller_samples);
        clients.push(client);
    }
    let elapsed = started.elapsed();
    let count = samples.len();
    report(&format!("Delegate, gRPC loopback, {CALLERS} callers at once"), samples);
    println!("  {CALLERS} callers: {count} decisions in {elapsed:.2?}: {:.0}/s", count as f64 / elapsed.as_secs_f64());
    for caller in 0..CALLERS {
        for iteration in 0..per_caller {
            let task_id = format!("concurrent-{caller}-{iteration}");
            client.release_task(pb::ReleaseTaskRequest { task_id }).await.expect("release");
        }
    }
    let mut samples = Vec::with_capacity(roster_iterations);
    for iteration in 0..roster_iterations {
        let request = pb::GetOrganizationRosterRequest {
            agent_id: agent_at(iteration * 31 % sizes.agents, &sizes).id,
            filter: pb::RosterFilter::ByExpertise as i32,
            expertise: format!("tag-{}", iteration % sizes.tags),
        };
        let start = Instant::now();
        let response = client.get_organization_roster(request).await.expect("roster");
        samples.push(start.elapsed());
        std::hint::black_box(response);
    }
    report("GetOrganizationRoster(by_expertise), gRPC loopback", samples);

    let _ = stop.send(());
    let _ = server.await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}
