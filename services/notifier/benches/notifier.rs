//! Notifier throughput over real gRPC, the server in process on SQLite (or,
//! with `--postgres`, on a database of its own on the local PostgreSQL, where
//! the notifier takes turns writing as replicas do):
//! 1. events ingested per second over one IngestEvents stream (3 recipients
//!    per event), with the NDJSON memory files on and off;
//! 2. notifications delivered per second to 100 live subscribers, memory
//!    files on and off: 100 agents monitoring every event (100 stored
//!    notifications per event), and 100 subscriptions of the lead (1 stored
//!    notification per event, delivered 100 times).
//!
//! Run: `cargo bench -p muster-notifier --bench notifier -- [--events N] [--fanout-events M] [--postgres]`
//! (add `--profile dev` for an unoptimised build). The inbox is always durable.
//!
//! The subscribers run in the bench's process, on the notifier's cores, so
//! they decode of each message only what they count (the cursor, or the lag
//! notice): real subscribers decode on their own machines.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use clap::Parser as _;
use muster_notifier::Config;
use muster_proto::{
    common::v1::{EventType, StepEvent, StepRoles},
    notifier::v1::{IngestEventsRequest, SubscribeRequest, notifier_service_client::NotifierServiceClient},
};
use muster_runtime::{
    auth::client::{AuthChannel, with_credentials},
    testing::TestCredentials,
};
use tokio_stream::StreamExt as _;

const SUBSCRIBERS: usize = 100;
/// Longest wait for the next notification before a subscriber gives up.
const QUIET_LIMIT: Duration = Duration::from_secs(60);

/// What a bench subscriber decodes of a `SubscribeResponse`.
#[derive(Clone, PartialEq, prost::Message)]
struct Received {
    #[prost(message, optional, tag = "1")]
    notification: Option<CursorOnly>,
    #[prost(uint64, optional, tag = "2")]
    lagged_after_cursor: Option<u64>,
}

/// What it decodes of a `Notification`.
#[derive(Clone, PartialEq, prost::Message)]
struct CursorOnly {
    #[prost(uint64, tag = "1")]
    cursor: u64,
}

/// Subscribes `agent_id` after `after_cursor`; waits and tries again while
/// the notifier sheds the flood of subscriptions opening at once.
async fn subscribe(
    channel: AuthChannel,
    agent_id: String,
    after_cursor: u64,
) -> anyhow::Result<tonic::Streaming<Received>> {
    let mut grpc = tonic::client::Grpc::new(channel);
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/muster.notifier.v1.NotifierService/Subscribe");
    loop {
        grpc.ready().await.map_err(|error| anyhow::anyhow!(error))?;
        let codec = tonic_prost::ProstCodec::<SubscribeRequest, Received>::default();
        let request = tonic::Request::new(SubscribeRequest { agent_id: agent_id.clone(), after_cursor });
        match grpc.server_streaming(request, path.clone(), codec).await {
            Ok(response) => return Ok(response.into_inner()),
            Err(status) if status.code() == tonic::Code::ResourceExhausted => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(status) => return Err(status.into()),
        }
    }
}

struct Running {
    /// An operator's channel: subscribes to any inbox.
    operator: AuthChannel,
    /// The execution service: ingests.
    ingester: NotifierServiceClient<AuthChannel>,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<muster_notifier::Result<()>>,
    /// Dropped (the database removed) with the run.
    _database: Option<muster_runtime::testing::TestDatabase>,
}

/// Whether the bench runs on PostgreSQL (`--postgres`).
fn on_postgres() -> bool {
    std::env::args().any(|argument| argument == "--postgres")
}

async fn start(data_dir: &Path, memory_files: bool) -> anyhow::Result<Running> {
    let database = if on_postgres() {
        Some(
            muster_runtime::testing::TestDatabase::create()
                .await
                .ok_or_else(|| anyhow::anyhow!("--postgres: no PostgreSQL answers"))?,
        )
    } else {
        None
    };
    let database_url = match &database {
        Some(database) => database.url.clone(),
        None => format!("sqlite://{}", data_dir.join("notifier.db").display()),
    };
    let mut config = Config::parse_from([
        "muster-notifier".to_owned(),
        "--database-url".to_owned(),
        database_url,
        "--data-dir".to_owned(),
        data_dir.display().to_string(),
        "--memory-files".to_owned(),
        memory_files.to_string(),
        "--log-filter".to_owned(),
        "warn".to_owned(),
    ]);
    let credentials = TestCredentials::new();
    credentials.apply(&mut config.server);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = format!("http://{}", listener.local_addr()?);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(muster_notifier::run(config, listener, async move {
        let _ = stopped.await;
    }));
    let channel = muster_runtime::testing::connect_when_serving(&address).await;
    Ok(Running {
        operator: with_credentials(channel.clone(), credentials.operator()),
        ingester: NotifierServiceClient::new(with_credentials(channel, credentials.service("execution"))),
        stop,
        task,
        _database: database,
    })
}

impl Running {
    async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

fn event(index: usize, monitors: Vec<String>, informed: Vec<String>) -> StepEvent {
    StepEvent {
        event_id: format!("bench-{index}"),
        sequence: index as u64 + 1,
        event_type: EventType::StepCompleted as i32,
        occurred_at: Some(prost_types::Timestamp { seconds: 1_768_559_400 + index as i64, nanos: 0 }),
        execution_id: "bench-execution".to_owned(),
        process_name: "bench".to_owned(),
        step_id: format!("step-{index}"),
        step_name: format!("Step {index}"),
        roles: Some(StepRoles { executor: "worker".to_owned(), monitors, informed }),
        lead_agent_id: "lead".to_owned(),
        output: Some(muster_runtime::json::value_from_text("{\"result\":\"a short output\"}").expect("JSON")),
        cost: 0.1,
        duration: Some(muster_runtime::time::to_duration(1500)),
        ..StepEvent::default()
    }
}

/// Streams `events` over one IngestEvents call and waits for every ack.
async fn ingest(client: &mut NotifierServiceClient<AuthChannel>, events: Vec<StepEvent>) -> anyhow::Result<u64> {
    let count = events.len();
    let requests = tokio_stream::iter(events.into_iter().map(|event| IngestEventsRequest { event: Some(event) }));
    let mut responses = client.ingest_events(requests).await?.into_inner();
    let mut notifications = 0;
    for _ in 0..count {
        let ack = responses.next().await.ok_or_else(|| anyhow::anyhow!("stream ended early"))??;
        notifications += u64::from(ack.notifications);
    }
    Ok(notifications)
}

async fn bench_ingest(root: &Path, events: usize, memory_files: bool) -> anyhow::Result<()> {
    let data_dir = root.join(format!("ingest-{memory_files}"));
    std::fs::create_dir_all(&data_dir)?;
    let mut running = start(&data_dir, memory_files).await?;
    let batch: Vec<StepEvent> =
        (0..events).map(|index| event(index, vec!["monitor".to_owned()], vec!["informed".to_owned()])).collect();
    let started = Instant::now();
    let notifications = ingest(&mut running.ingester, batch).await?;
    let elapsed = started.elapsed().as_secs_f64();
    println!(
        "ingest   memory_files={memory_files:<5} events={events} notifications={notifications} \
         seconds={elapsed:.2} events/s={:.0} notifications/s={:.0}",
        events as f64 / elapsed,
        notifications as f64 / elapsed
    );
    running.stop().await;
    Ok(())
}

/// How the 100 subscribers relate to the events.
#[derive(Debug, Clone, Copy)]
enum Fanout {
    /// 100 agents, each subscribed once; every event monitored by all 100:
    /// 100 stored notifications per event.
    DistinctAgents,
    /// 100 subscriptions of one agent (the lead): 1 stored notification per
    /// event, delivered 100 times.
    OneAgent,
}

async fn bench_fanout(root: &Path, events: usize, memory_files: bool, fanout: Fanout) -> anyhow::Result<()> {
    let data_dir = root.join(format!("fanout-{memory_files}-{fanout:?}"));
    std::fs::create_dir_all(&data_dir)?;
    let running = start(&data_dir, memory_files).await?;
    let agents: Vec<String> = match fanout {
        Fanout::DistinctAgents => (0..SUBSCRIBERS).map(|index| format!("agent-{index}")).collect(),
        Fanout::OneAgent => vec!["lead".to_owned(); SUBSCRIBERS],
    };
    let monitors = match fanout {
        Fanout::DistinctAgents => agents.clone(),
        Fanout::OneAgent => Vec::new(),
    };
    let (ready_sender, mut ready_receiver) = tokio::sync::mpsc::channel::<Result<(), String>>(SUBSCRIBERS);
    let mut readers = Vec::new();
    for agent in &agents {
        let channel = running.operator.clone();
        let agent = agent.clone();
        let ready = ready_sender.clone();
        readers.push(tokio::spawn(async move {
            let subscribed = subscribe(channel.clone(), agent.clone(), 0).await;
            let _ = ready.send(subscribed.as_ref().map(|_| ()).map_err(|error| format!("{agent}: {error:#}"))).await;
            let mut stream = subscribed?;
            let (mut received, mut resubscribed) = (0, 0);
            while received < events {
                let Ok(next) = tokio::time::timeout(QUIET_LIMIT, stream.next()).await else {
                    anyhow::bail!("{agent} received nothing for {QUIET_LIMIT:?} after {received} notifications")
                };
                match next {
                    Some(Ok(Received { notification: Some(_), .. })) => received += 1,
                    // Cut off for falling behind: go on from the inbox, as a client does.
                    Some(Ok(Received { lagged_after_cursor: Some(cursor), .. })) => {
                        stream = subscribe(channel.clone(), agent.clone(), cursor).await?;
                        resubscribed += 1;
                    }
                    Some(Ok(_)) => {}
                    Some(Err(status)) => return Err(status.into()),
                    None => anyhow::bail!("{agent}'s stream ended after {received}"),
                }
            }
            Ok::<_, anyhow::Error>((received, resubscribed))
        }));
    }
    for _ in 0..SUBSCRIBERS {
        if let Some(Err(error)) = ready_receiver.recv().await {
            anyhow::bail!("subscribing failed: {error}");
        }
    }
    let batch: Vec<StepEvent> = (0..events).map(|index| event(index, monitors.clone(), Vec::new())).collect();
    let started = Instant::now();
    let ingest_task = {
        let mut client = running.ingester.clone();
        tokio::spawn(async move { ingest(&mut client, batch).await })
    };
    let (mut delivered, mut resubscribed) = (0, 0);
    for reader in readers {
        let (received, again) = reader.await??;
        delivered += received;
        resubscribed += again;
    }
    let elapsed = started.elapsed().as_secs_f64();
    ingest_task.await??;
    println!(
        "fan-out  {fanout:?} memory_files={memory_files:<5} subscribers={SUBSCRIBERS} events={events} delivered={delivered} \
         resubscribed={resubscribed} seconds={elapsed:.2} delivered/s={:.0}",
        delivered as f64 / elapsed
    );
    running.stop().await;
    Ok(())
}

fn flag(name: &str, default: usize) -> usize {
    let arguments: Vec<String> = std::env::args().collect();
    arguments
        .iter()
        .position(|argument| argument == name)
        .and_then(|index| arguments.get(index + 1))
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

/// The service binary's allocator, so that the service measured in process allocates as it does in its pod.
#[global_allocator]
static ALLOCATOR: muster_runtime::Allocator = muster_runtime::Allocator;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let events = flag("--events", 20_000);
    let fanout_events = flag("--fanout-events", 2_000);
    let root: PathBuf = std::env::temp_dir().join(format!("muster-notifier-bench-{}", std::process::id()));
    std::fs::create_dir_all(&root)?;
    let result = async {
        for memory_files in [true, false] {
            bench_ingest(&root, events, memory_files).await?;
        }
        for fanout in [Fanout::DistinctAgents, Fanout::OneAgent] {
            for memory_files in [true, false] {
                bench_fanout(&root, fanout_events, memory_files, fanout).await?;
            }
        }
        Ok::<_, anyhow::Error>(())
    }
    .await;
    let _ = std::fs::remove_dir_all(&root);
    result
}
