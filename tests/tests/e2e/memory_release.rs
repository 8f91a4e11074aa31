//! A service gives back the memory a burst of load took once the load ends:
//! the notifier's resident memory, taken up by 500 live subscribers and what
//! they read, comes back to within 10 MB of its idle figure once they leave
//! (docs/deploy.md, "Memory"; the figures in docs/benchmarks.md, "Memory
//! given back after a burst").

use std::time::Duration;

use muster_proto::{
    common::v1::{EventType, StepEvent, StepRoles},
    notifier::v1::{IngestEventsRequest, SubscribeRequest},
};
use muster_tests::{Backend, NotifierClient, TestCluster, admitted, rss_kib};

const SUBSCRIBERS: usize = 500;
/// The subscribers' connections: fewer streams each than a connection may open (256).
const CONNECTIONS: usize = 4;
/// Agents monitoring each event, so each event makes this many notifications.
const GROUP: usize = 25;
/// Events per group of agents: the notifications each subscriber reads.
const EVENTS_PER_GROUP: usize = 20;
/// How far above idle the resident memory may stay once the subscribers left.
const SLACK_KIB: u64 = 10 * 1024;
/// How long the memory has to come back.
const RELEASE_DEADLINE: Duration = Duration::from_secs(30);

/// Event `index`, of a step `monitors` hear of, with an output of about 1 KiB.
fn event(index: usize, monitors: Vec<String>) -> IngestEventsRequest {
    let output = muster_tests::value(&format!(r#"{{"text": "{}"}}"#, "x".repeat(1024)));
    IngestEventsRequest {
        event: Some(StepEvent {
            event_id: format!("memory-{index}"),
            sequence: index as u64 + 1,
            event_type: EventType::StepCompleted as i32,
            occurred_at: Some(muster_runtime::time::to_timestamp(muster_runtime::time::now_millis())),
            execution_id: "memory-execution".to_owned(),
            process_name: "memory".to_owned(),
            step_id: format!("s{index}"),
            roles: Some(StepRoles { executor: "solo".to_owned(), monitors, ..Default::default() }),
            output,
            ..Default::default()
        }),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_notifier_gives_back_the_memory_of_500_subscribers_once_they_leave() {
    let Some(test) = TestCluster::start(Backend::Sqlite).await else { return };
    let pid = test.cluster().service("notifier").pid().expect("the notifier runs");
    let idle = rss_kib(pid);

    // 500 subscriptions, one agent each, over four connections.
    let clients: Vec<NotifierClient> = (0..CONNECTIONS).map(|_| test.notifier()).collect();
    let mut streams = Vec::with_capacity(SUBSCRIBERS);
    for index in 0..SUBSCRIBERS {
        let request = SubscribeRequest { agent_id: format!("subscriber-{index}"), after_cursor: 0 };
        let stream = admitted(|| {
            let (mut client, request) = (clients[index % CONNECTIONS].clone(), request.clone());
            async move { client.subscribe(request).await }
        })
        .await
        .expect("a subscription");
        streams.push(stream.into_inner());
    }

    // Every subscriber hears of 20 events, live, and reads them.
    let events: Vec<IngestEventsRequest> = (0..SUBSCRIBERS / GROUP)
        .flat_map(|group| {
            let monitors: Vec<String> =
                (group * GROUP..(group + 1) * GROUP).map(|agent| format!("subscriber-{agent}")).collect();
            (0..EVENTS_PER_GROUP).map(move |step| event(group * EVENTS_PER_GROUP + step, monitors.clone()))
        })
        .collect();
    let ingested = events.len();
    let mut acks = test
        .notifier_as(&test.service_token("execution"))
        .ingest_events(tokio_stream::iter(events))
        .await
        .expect("ingesting")
        .into_inner();
    for _ in 0..ingested {
        assert_eq!(acks.message().await.expect("an ack").expect("an ack").notifications, GROUP as u32);
    }
    for (index, stream) in streams.iter_mut().enumerate() {
        for _ in 0..EVENTS_PER_GROUP {
            let frame = tokio::time::timeout(Duration::from_secs(30), stream.message()).await;
            let frame = frame.unwrap_or_else(|_| panic!("subscriber {index} heard nothing"));
            assert!(frame.expect("a frame").expect("a frame").message.is_some(), "subscriber {index}");
        }
    }
    let loaded = rss_kib(pid);
    assert!(
        loaded > idle + SLACK_KIB,
        "the load took too little memory to show anything ({idle} KiB idle, {loaded} KiB loaded)"
    );

    // They leave; the memory comes back (polled: the bound is on memory, not time).
    drop((streams, acks, clients));
    let left = tokio::time::Instant::now();
    let mut after = rss_kib(pid);
    while after > idle + SLACK_KIB && left.elapsed() < RELEASE_DEADLINE {
        tokio::time::sleep(Duration::from_millis(200)).await;
        after = rss_kib(pid);
    }
    eprintln!(
        "notifier RSS: {idle} KiB idle, {loaded} KiB with {SUBSCRIBERS} subscribers, {after} KiB {:?} after they left",
        left.elapsed()
    );
    assert!(
        after <= idle + SLACK_KIB,
        "the notifier kept {after} KiB {RELEASE_DEADLINE:?} after its subscribers left \
         ({idle} KiB idle, {loaded} KiB with them)"
    );
    test.shutdown().await;
}
