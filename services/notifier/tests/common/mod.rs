//! Fixtures: a notifier in process on port 0 with its own SQLite file and
//! memory root, a typed client, and step event builders.
#![allow(dead_code, unreachable_pub)]

use std::{collections::HashMap, path::PathBuf, sync::Mutex, time::Duration};

use clap::Parser as _;
use muster_notifier::Config;
use muster_proto::{
    common::v1::{EventType, StepError, StepEvent, StepRoles},
    notifier::v1::{
        IngestEventsRequest, IngestEventsResponse, ListNotificationsRequest,
        notifier_service_client::NotifierServiceClient,
    },
};
use muster_runtime::{
    auth::client::{AuthChannel, Credentials, with_credentials},
    testing::{FakeCredentials, TestCredentials},
};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::{StreamExt as _, wrappers::ReceiverStream};
use tonic::transport::Channel;

pub type Client = NotifierServiceClient<AuthChannel>;

/// A directory under the system temp dir, unique to this test, removed on drop.
pub struct TempDirectory(pub PathBuf);

impl TempDirectory {
    pub fn new(label: &str) -> Self {
        let path = std::env::temp_dir().join(format!("muster-notifier-{label}-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&path).expect("creating a temp dir");
        Self(path)
    }
}

impl Drop for TempDirectory {
    fn drop(&mut self) {
        muster_runtime::testing::remove_folder(&self.0);
    }
}

/// A running notifier, with the roster's credential stream played by a fake.
pub struct TestNotifier {
    /// Calls as an operator: reads any inbox.
    pub client: Client,
    /// Calls as the execution service: ingests.
    pub ingester: Client,
    pub address: String,
    pub memory_root: PathBuf,
    pub credentials: TestCredentials,
    pub agents: FakeCredentials,
    channel: Channel,
    tokens: Mutex<HashMap<String, String>>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<muster_notifier::Result<()>>>,
}

impl TestNotifier {
    /// Starts a notifier on `data_dir` (SQLite file and memory root inside it)
    /// with extra flags, and waits until it is SERVING.
    pub async fn start(data_dir: &std::path::Path, extra_flags: &[&str]) -> Self {
        let database = format!("sqlite://{}", data_dir.join("notifier.db").display());
        let mut arguments = vec![
            "muster-notifier".to_owned(),
            "--database-url".to_owned(),
            database,
            "--data-dir".to_owned(),
            data_dir.display().to_string(),
        ];
        arguments.extend(extra_flags.iter().map(|flag| (*flag).to_owned()));
        Self::start_with(Config::parse_from(arguments)).await
    }

    pub async fn start_with(mut config: Config) -> Self {
        let credentials = TestCredentials::new();
        credentials.apply(&mut config.server);
        let agents = FakeCredentials::start(&credentials).await;
        config.server.auth.roster_url = agents.url.clone();
        let memory_root = config.memory_root();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binding");
        let address = format!("http://{}", listener.local_addr().expect("address"));
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(muster_notifier::run(config, listener, async move {
            let _ = stopped.await;
        }));
        let channel = wait_until_serving(&address).await;
        Self {
            client: NotifierServiceClient::new(with_credentials(channel.clone(), credentials.operator())),
            ingester: NotifierServiceClient::new(with_credentials(channel.clone(), credentials.service("execution"))),
            address,
            memory_root,
            credentials,
            agents,
            channel,
            tokens: Mutex::new(HashMap::new()),
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// A client calling with these credentials.
    pub fn client_with(&self, credentials: Credentials) -> Client {
        NotifierServiceClient::new(with_credentials(self.channel.clone(), credentials))
    }

    /// The token of `agent_id`, issued on first use.
    pub fn token_of(&self, agent_id: &str) -> String {
        self.tokens.lock().unwrap().entry(agent_id.to_owned()).or_insert_with(|| self.agents.issue(agent_id)).clone()
    }

    /// A client calling as `agent_id`, once the notifier knows its token.
    pub async fn client_as(&self, agent_id: &str) -> Client {
        let mut client = self.client_with(Credentials::bearer(&self.token_of(agent_id)).unwrap());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let probe = ListNotificationsRequest { agent_id: agent_id.to_owned(), after_cursor: 0, limit: 1 };
            match client.list_notifications(probe).await {
                Ok(_) => return client,
                Err(status) => {
                    assert!(tokio::time::Instant::now() < deadline, "the notifier never accepted {agent_id}: {status}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }

    /// Stops the server and waits for it.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(15), task).await;
        }
    }

    /// Sends events over one IngestEvents stream and returns the acks.
    pub async fn ingest(&self, events: Vec<StepEvent>) -> Vec<IngestEventsResponse> {
        ingest(self.ingester.clone(), events).await
    }
}

impl Drop for TestNotifier {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Polls the health service until SERVING (never a fixed sleep).
pub async fn wait_until_serving(address: &str) -> Channel {
    muster_runtime::testing::connect_when_serving(address).await
}

/// Sends events over one stream (all at once) and collects one ack each.
pub async fn ingest(mut client: Client, events: Vec<StepEvent>) -> Vec<IngestEventsResponse> {
    let count = events.len();
    let (sender, receiver) = mpsc::channel(count.max(1));
    for event in events {
        sender.send(IngestEventsRequest { event: Some(event) }).await.expect("queueing");
    }
    let mut responses =
        client.ingest_events(ReceiverStream::new(receiver)).await.expect("opening IngestEvents").into_inner();
    let mut acks = Vec::with_capacity(count);
    while acks.len() < count {
        match responses.next().await {
            Some(Ok(ack)) => acks.push(ack),
            Some(Err(status)) => panic!("IngestEvents failed: {status}"),
            None => panic!("IngestEvents ended after {} of {count} acks", acks.len()),
        }
    }
    drop(sender);
    acks
}

/// 2026-01-16T10:30:00Z.
pub const EVENT_TIME_SECONDS: i64 = 1_768_559_400;

/// A step event of `kind` for step `step_id` of execution `x1` of
/// `content-pipeline`, led by `lead`, monitored by `monitor`, informing `informed`.
pub fn step_event(event_id: &str, kind: EventType, step_id: &str) -> StepEvent {
    StepEvent {
        event_id: event_id.to_owned(),
        sequence: 1,
        event_type: kind as i32,
        occurred_at: Some(prost_types::Timestamp { seconds: EVENT_TIME_SECONDS, nanos: 0 }),
        execution_id: "x1".to_owned(),
        process_name: "content-pipeline".to_owned(),
        process_version: 1,
        step_id: step_id.to_owned(),
        step_name: format!("Step {step_id}"),
        roles: Some(StepRoles {
            executor: "worker".to_owned(),
            monitors: vec!["monitor".to_owned()],
            informed: vec!["informed".to_owned()],
        }),
        lead_agent_id: "lead".to_owned(),
        ..StepEvent::default()
    }
}

pub fn completed(event_id: &str, step_id: &str, output_json: &str) -> StepEvent {
    StepEvent {
        output: Some(muster_runtime::json::value_from_text(output_json).expect("a JSON output")),
        cost: 0.1,
        duration: Some(muster_runtime::time::to_duration(45_500)),
        ..step_event(event_id, EventType::StepCompleted, step_id)
    }
}

pub fn failed(event_id: &str, step_id: &str) -> StepEvent {
    StepEvent {
        error: Some(StepError { code: "TIMEOUT".to_owned(), message: "Agent timeout".to_owned() }),
        retry_count: 3,
        ..step_event(event_id, EventType::StepFailed, step_id)
    }
}

/// The lines of an agent's memory file for the events' day (2026-01-16), parsed.
pub fn memory_lines(memory_root: &std::path::Path, agent: &str) -> Vec<serde_json::Value> {
    let path = memory_root.join(agent).join("events").join("notifications_2026-01-16.ndjson");
    match std::fs::read_to_string(&path) {
        Ok(text) => text
            .lines()
            .map(|line| serde_json::from_str(line).unwrap_or_else(|error| panic!("bad line {line:?}: {error}")))
            .collect(),
        Err(_) => Vec::new(),
    }
}
