//! The notifier in process, over real gRPC.

mod common;

use std::{collections::BTreeSet, time::Duration};

use common::{TempDirectory, TestNotifier, completed, failed, memory_lines, step_event};
use muster_proto::{
    common::v1::{EventType, ExecutionStatus, StepEvent, StepRoles},
    notifier::v1::{
        AcknowledgeNotificationsRequest, IngestEventsRequest, ListNotificationsRequest, Notification, RecipientReason,
        SubscribeRequest, subscribe_response,
    },
};
use serde_json::json;
use tokio_stream::StreamExt as _;

async fn list(notifier: &TestNotifier, agent_id: &str, after_cursor: u64) -> Vec<Notification> {
    notifier
        .client
        .clone()
        .list_notifications(ListNotificationsRequest { agent_id: agent_id.to_owned(), after_cursor, limit: 1000 })
        .await
        .expect("ListNotifications")
        .into_inner()
        .notifications
}

fn event_ids(notifications: &[Notification]) -> Vec<String> {
    notifications.iter().map(|n| n.event.as_ref().expect("event").event_id.clone()).collect()
}

fn execution_event(event_id: &str, kind: EventType) -> StepEvent {
    StepEvent {
        step_id: String::new(),
        step_name: String::new(),
        roles: None,
        execution_status: ExecutionStatus::Completed as i32,
        ..step_event(event_id, kind, "")
    }
}

#[tokio::test]
async fn each_recipient_rule_holds_and_an_agent_in_several_roles_hears_once() {
    let data = TempDirectory::new("recipients");
    let notifier = TestNotifier::start(&data.0, &[]).await;

    let mut overlapping = completed("e-overlap", "s3", "{}");
    overlapping.roles = Some(StepRoles {
        executor: "worker".to_owned(),
        monitors: vec!["watcher".to_owned()],
        informed: vec!["watcher".to_owned(), "lead".to_owned(), "learner".to_owned()],
    });
    let acks = notifier
        .ingest(vec![
            execution_event("e-exec-start", EventType::ExecutionStarted),
            step_event("e-start", EventType::StepStarted, "s1"),
            step_event("e-queued", EventType::StepQueued, "s1"),
            completed("e-done", "s1", "{\"ok\":true}"),
            failed("e-fail", "s2"),
            overlapping,
            execution_event("e-exec-end", EventType::ExecutionFinished),
        ])
        .await;
    let counts: Vec<(String, u32)> = acks.into_iter().map(|ack| (ack.event_id, ack.notifications)).collect();
    assert_eq!(
        counts,
        vec![
            ("e-exec-start".to_owned(), 1),
            ("e-start".to_owned(), 2),
            ("e-queued".to_owned(), 2),
            ("e-done".to_owned(), 3),
            ("e-fail".to_owned(), 3),
            ("e-overlap".to_owned(), 3),
            ("e-exec-end".to_owned(), 1),
        ]
    );

    // Informed: completion and failure only.
    let informed = list(&notifier, "informed", 0).await;
    assert_eq!(event_ids(&informed), vec!["e-done", "e-fail"]);
    assert!(informed.iter().all(|n| n.reason == RecipientReason::Informed as i32));
    // Monitors: every event of their step.
    let monitor = list(&notifier, "monitor", 0).await;
    assert_eq!(event_ids(&monitor), vec!["e-start", "e-queued", "e-done", "e-fail"]);
    assert!(monitor.iter().all(|n| n.reason == RecipientReason::Monitor as i32));
    // Lead: every event of the execution, including execution-level ones.
    let lead = list(&notifier, "lead", 0).await;
    assert_eq!(
        event_ids(&lead),
        vec!["e-exec-start", "e-start", "e-queued", "e-done", "e-fail", "e-overlap", "e-exec-end"]
    );
    assert!(lead.iter().all(|n| n.reason == RecipientReason::Lead as i32));
    // Several roles: one notification, the strongest reason.
    let watcher = list(&notifier, "watcher", 0).await;
    assert_eq!(event_ids(&watcher), vec!["e-overlap"]);
    assert_eq!(watcher[0].reason, RecipientReason::Monitor as i32);
    assert_eq!(list(&notifier, "learner", 0).await.len(), 1);
    // The executor is not a recipient as such.
    assert!(list(&notifier, "worker", 0).await.is_empty());
    // Cursors increase per agent.
    assert!(lead.windows(2).all(|pair| pair[0].cursor < pair[1].cursor));
    notifier.stop().await;
}

#[tokio::test]
async fn memory_lines_have_exactly_the_format_fields() {
    let data = TempDirectory::new("ndjson");
    let notifier = TestNotifier::start(&data.0, &[]).await;
    notifier
        .ingest(vec![
            step_event("e-start", EventType::StepStarted, "research"),
            completed("e-done", "research", "{\"topic\":\"rust\"}"),
            failed("e-fail", "write"),
        ])
        .await;

    let lines = memory_lines(&notifier.memory_root, "informed");
    assert_eq!(lines.len(), 2, "one line per completed or failed step: {lines:?}");
    let expected_keys: BTreeSet<&str> = [
        "event_type",
        "process_name",
        "execution_id",
        "step_id",
        "step_name",
        "output_summary",
        "timestamp",
        "metadata",
    ]
    .into_iter()
    .collect();
    for line in &lines {
        let keys: BTreeSet<&str> = line.as_object().expect("object").keys().map(String::as_str).collect();
        assert_eq!(keys, expected_keys);
    }
    assert_eq!(
        lines[0],
        json!({
            "event_type": "step_completed",
            "process_name": "content-pipeline",
            "execution_id": "x1",
            "step_id": "research",
            "step_name": "Step research",
            "output_summary": "{\"topic\":\"rust\"}",
            "timestamp": "2026-01-16T10:30:00Z",
            "metadata": {"cost": "$0.10", "duration_seconds": 45}
        })
    );
    assert_eq!(
        lines[1],
        json!({
            "event_type": "step_failed",
            "process_name": "content-pipeline",
            "execution_id": "x1",
            "step_id": "write",
            "step_name": "Step write",
            "output_summary": "Agent timeout",
            "timestamp": "2026-01-16T10:30:00Z",
            "metadata": {"error_code": "TIMEOUT", "retry_count": 3}
        })
    );
    // Monitors and the lead get a line per notification too.
    let monitor_lines = memory_lines(&notifier.memory_root, "monitor");
    let monitor_types: Vec<&str> = monitor_lines.iter().map(|line| line["event_type"].as_str().unwrap_or("")).collect();
    assert_eq!(monitor_types, vec!["step_started", "step_completed", "step_failed"]);
    assert_eq!(memory_lines(&notifier.memory_root, "lead").len(), 3);
    // The default root is <data-dir>/agents.
    assert!(data.0.join("agents/informed/events/notifications_2026-01-16.ndjson").is_file());
    notifier.stop().await;
}

#[tokio::test]
async fn a_resent_event_creates_no_second_notification_or_line() {
    let data = TempDirectory::new("dedupe");
    let notifier = TestNotifier::start(&data.0, &[]).await;
    let first = notifier.ingest(vec![completed("e1", "s1", "{}")]).await;
    assert_eq!(first[0].notifications, 3);
    // Resent on a new stream (as after a restart), and twice within one stream.
    let again = notifier.ingest(vec![completed("e1", "s1", "{}"), completed("e1", "s1", "{}")]).await;
    assert_eq!(
        again.iter().map(|ack| (ack.event_id.as_str(), ack.notifications)).collect::<Vec<_>>(),
        vec![("e1", 0), ("e1", 0)]
    );
    assert_eq!(list(&notifier, "informed", 0).await.len(), 1);
    assert_eq!(memory_lines(&notifier.memory_root, "informed").len(), 1);
    // A restart keeps the deduplication.
    notifier.stop().await;
    let notifier = TestNotifier::start(&data.0, &[]).await;
    assert_eq!(notifier.ingest(vec![completed("e1", "s1", "{}")]).await[0].notifications, 0);
    assert_eq!(memory_lines(&notifier.memory_root, "informed").len(), 1);
    notifier.stop().await;
}

/// Reads notifications from a Subscribe stream until `count` arrived.
async fn receive(
    stream: &mut tonic::Streaming<muster_proto::notifier::v1::SubscribeResponse>,
    count: usize,
) -> Vec<Notification> {
    let mut received = Vec::new();
    while received.len() < count {
        let message = tokio::time::timeout(Duration::from_secs(20), stream.next())
            .await
            .expect("a notification within 20 s")
            .expect("stream open")
            .expect("no error");
        match message.message {
            Some(subscribe_response::Message::Notification(notification)) => received.push(notification),
            other => panic!("unexpected message {other:?}"),
        }
    }
    received
}

#[tokio::test]
async fn subscribe_replays_from_the_cursor_then_goes_live_across_reconnects() {
    let data = TempDirectory::new("subscribe");
    let notifier = TestNotifier::start(&data.0, &[]).await;
    notifier.ingest(vec![completed("e1", "s1", "{}"), completed("e2", "s2", "{}")]).await;

    let mut client = notifier.client_as("informed").await;
    let mut stream = client
        .subscribe(SubscribeRequest { agent_id: "informed".to_owned(), after_cursor: 0 })
        .await
        .expect("subscribe")
        .into_inner();
    let backlog = receive(&mut stream, 2).await;
    assert_eq!(event_ids(&backlog), vec!["e1", "e2"]);
    notifier.ingest(vec![failed("e3", "s3")]).await;
    let live = receive(&mut stream, 1).await;
    assert_eq!(event_ids(&live), vec!["e3"]);
    assert_eq!(live[0].output_summary, "Agent timeout");
    let last_cursor = live[0].cursor;
    drop(stream);

    // Away: two more arrive. Reconnecting after the last cursor replays exactly them.
    notifier.ingest(vec![completed("e4", "s4", "{}"), completed("e5", "s5", "{}")]).await;
    let mut stream = client
        .subscribe(SubscribeRequest { agent_id: "informed".to_owned(), after_cursor: last_cursor })
        .await
        .expect("resubscribe")
        .into_inner();
    let replay = receive(&mut stream, 2).await;
    assert_eq!(event_ids(&replay), vec!["e4", "e5"]);
    notifier.ingest(vec![completed("e6", "s6", "{}")]).await;
    assert_eq!(event_ids(&receive(&mut stream, 1).await), vec!["e6"]);
    // Nothing repeated at the seam.
    assert!(tokio::time::timeout(Duration::from_millis(200), stream.next()).await.is_err());

    // Acknowledgements are stored and monotonic.
    let acknowledged = client
        .acknowledge_notifications(AcknowledgeNotificationsRequest {
            agent_id: "informed".to_owned(),
            cursor: last_cursor,
        })
        .await
        .expect("ack")
        .into_inner()
        .acknowledged_cursor;
    assert_eq!(acknowledged, last_cursor);
    let lower = client
        .acknowledge_notifications(AcknowledgeNotificationsRequest { agent_id: "informed".to_owned(), cursor: 1 })
        .await
        .expect("ack")
        .into_inner()
        .acknowledged_cursor;
    assert_eq!(lower, last_cursor);
    let listed = client
        .list_notifications(ListNotificationsRequest { agent_id: "informed".to_owned(), after_cursor: 0, limit: 2 })
        .await
        .expect("list")
        .into_inner();
    assert_eq!(listed.notifications.len(), 2);
    assert_eq!(listed.acknowledged_cursor, last_cursor);
    // Never past the newest notification: the read marker cannot be pushed past everything.
    for cursor in [u64::MAX, last_cursor + 1_000] {
        let status = client
            .acknowledge_notifications(AcknowledgeNotificationsRequest { agent_id: "informed".to_owned(), cursor })
            .await
            .expect_err("past the newest");
        assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");
    }
    notifier.stop().await;
}

#[tokio::test]
async fn agent_ids_that_would_escape_the_memory_root_get_no_file() {
    let data = TempDirectory::new("escape");
    let notifier = TestNotifier::start(&data.0, &[]).await;
    let mut event = completed("e1", "s1", "{}");
    event.roles = Some(StepRoles {
        executor: "worker".to_owned(),
        monitors: vec![],
        informed: vec![
            "../escaped".to_owned(),
            "a/b".to_owned(),
            "..".to_owned(),
            "nul\0agent".to_owned(),
            "safe".to_owned(),
        ],
    });
    let acks = notifier.ingest(vec![event]).await;
    assert_eq!(acks[0].notifications, 6, "four refused, safe and the lead");
    // The notifications are stored all the same.
    assert_eq!(list(&notifier, "../escaped", 0).await.len(), 1);
    assert_eq!(list(&notifier, "a/b", 0).await.len(), 1);
    // Only the safe agents have memory directories, and nothing is outside the root.
    let mut directories: Vec<String> = std::fs::read_dir(&notifier.memory_root)
        .expect("memory root")
        .map(|entry| entry.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    directories.sort();
    assert_eq!(directories, vec!["lead", "safe"]);
    assert!(!data.0.join("escaped").exists());
    assert!(!data.0.join("agents").join("a").exists());
    assert_eq!(memory_lines(&notifier.memory_root, "safe").len(), 1);
    notifier.stop().await;
}

#[tokio::test]
async fn summaries_are_truncated_at_a_character_boundary_with_a_marker() {
    let data = TempDirectory::new("truncate");
    let notifier = TestNotifier::start(&data.0, &["--output-summary-chars", "5"]).await;
    notifier.ingest(vec![completed("e1", "s1", "\"日本語のテキスト\"")]).await;
    let expected = "\"日本語の…[truncated]";
    assert_eq!(memory_lines(&notifier.memory_root, "informed")[0]["output_summary"], expected);
    assert_eq!(list(&notifier, "informed", 0).await[0].output_summary, expected);
    notifier.stop().await;
}

#[tokio::test]
async fn invalid_events_are_refused_with_a_precise_message() {
    let data = TempDirectory::new("invalid");
    let notifier = TestNotifier::start(&data.0, &[]).await;
    let (sender, receiver) = tokio::sync::mpsc::channel(4);
    sender.send(IngestEventsRequest { event: Some(completed("ok", "s1", "{}")) }).await.expect("send");
    sender
        .send(IngestEventsRequest { event: Some(StepEvent { event_id: String::new(), ..completed("", "s1", "{}") }) })
        .await
        .expect("send");
    let mut responses = notifier
        .ingester
        .clone()
        .ingest_events(tokio_stream::wrappers::ReceiverStream::new(receiver))
        .await
        .expect("open")
        .into_inner();
    let ack = responses.next().await.expect("ack").expect("ok");
    assert_eq!(ack.event_id, "ok");
    let status = responses.next().await.expect("status").expect_err("refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("event_id is required"), "{}", status.message());
    let status = notifier
        .client
        .clone()
        .list_notifications(ListNotificationsRequest::default())
        .await
        .expect_err("agent required");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    notifier.stop().await;
}

#[tokio::test]
async fn a_stuck_subscriber_does_not_stop_another_from_receiving_everything() {
    const EVENTS: usize = 8000;
    let data = TempDirectory::new("stuck");
    let notifier = TestNotifier::start(&data.0, &["--subscriber-buffer", "2048", "--memory-files", "false"]).await;
    let mut client = notifier.client.clone();
    // Subscribes and never reads.
    let mut stuck = client
        .subscribe(SubscribeRequest { agent_id: "lead".to_owned(), after_cursor: 0 })
        .await
        .expect("subscribe")
        .into_inner();

    // The reader resubscribes after its cursor if it is ever told it lagged.
    let reader_client = notifier.client.clone();
    let reader = tokio::spawn(async move {
        let mut client = reader_client;
        let mut cursors = Vec::with_capacity(EVENTS);
        let mut after = 0;
        'subscribe: loop {
            let mut stream = client
                .subscribe(SubscribeRequest { agent_id: "lead".to_owned(), after_cursor: after })
                .await
                .expect("subscribe")
                .into_inner();
            while let Some(message) = stream.next().await {
                match message.expect("no error").message {
                    Some(subscribe_response::Message::Notification(notification)) => {
                        assert!(notification.cursor > after, "cursors increase with no repeat");
                        after = notification.cursor;
                        cursors.push(notification.cursor);
                        if cursors.len() == EVENTS {
                            return cursors;
                        }
                    }
                    Some(subscribe_response::Message::LaggedAfterCursor(cursor)) => {
                        after = cursor;
                        continue 'subscribe;
                    }
                    None => panic!("empty message"),
                }
            }
            panic!("stream ended after {} notifications", cursors.len());
        }
    });

    let events: Vec<StepEvent> = (0..EVENTS)
        // Large enough that the stuck stream's HTTP/2 window and send buffer fill up.
        .map(|index| StepEvent {
            detail: "x".repeat(2000),
            ..step_event(&format!("e{index}"), EventType::StepStarted, &format!("s{index}"))
        })
        .collect();
    let started = std::time::Instant::now();
    for chunk in events.chunks(1000) {
        notifier.ingest(chunk.to_vec()).await;
    }
    let cursors =
        tokio::time::timeout(Duration::from_secs(60), reader).await.expect("reader finished").expect("reader");
    assert_eq!(cursors.len(), EVENTS);
    let stored: Vec<u64> = {
        let mut all = Vec::new();
        let mut after = 0;
        loop {
            let page = list(&notifier, "lead", after).await;
            let Some(last) = page.last() else { break };
            after = last.cursor;
            all.extend(page.iter().map(|n| n.cursor));
        }
        all
    };
    assert_eq!(cursors, stored, "the reader got every notification, in order");
    eprintln!("ingested and delivered {EVENTS} events in {:?}", started.elapsed());

    // The stuck subscriber was cut off: buffered notifications, then the lag notice, then the end.
    let mut seen = 0;
    let mut lagged = None;
    while let Some(message) =
        tokio::time::timeout(Duration::from_secs(20), stuck.next()).await.expect("stuck stream ends")
    {
        match message.expect("no error").message {
            Some(subscribe_response::Message::Notification(_)) => seen += 1,
            Some(subscribe_response::Message::LaggedAfterCursor(cursor)) => lagged = Some(cursor),
            None => panic!("empty message"),
        }
    }
    assert!(seen < EVENTS, "the stuck subscriber did not get everything ({seen})");
    assert_eq!(lagged, Some(cursors[seen - 1]), "told to resume after the last notification it got");
    notifier.stop().await;
}

#[tokio::test]
async fn the_service_runs_on_postgresql_too() {
    let Some(database) = muster_runtime::testing::TestDatabase::create().await else { return };
    let data = TempDirectory::new("postgres");
    let arguments = [
        "muster-notifier".to_owned(),
        "--database-url".to_owned(),
        database.url.clone(),
        "--data-dir".to_owned(),
        data.0.display().to_string(),
    ];
    let notifier = TestNotifier::start_with(<muster_notifier::Config as clap::Parser>::parse_from(arguments)).await;
    let acks =
        notifier.ingest(vec![completed("e1", "s1", "{}"), failed("e2", "s2"), completed("e1", "s1", "{}")]).await;
    assert_eq!(acks.iter().map(|ack| ack.notifications).collect::<Vec<_>>(), vec![3, 3, 0]);
    assert_eq!(event_ids(&list(&notifier, "informed", 0).await), vec!["e1", "e2"]);
    assert_eq!(memory_lines(&notifier.memory_root, "informed").len(), 2);
    let mut stream = notifier
        .client
        .clone()
        .subscribe(SubscribeRequest { agent_id: "lead".to_owned(), after_cursor: 0 })
        .await
        .expect("subscribe")
        .into_inner();
    assert_eq!(event_ids(&receive(&mut stream, 2).await), vec!["e1", "e2"]);
    notifier.ingest(vec![completed("e3", "s3", "{}")]).await;
    assert_eq!(event_ids(&receive(&mut stream, 1).await), vec!["e3"]);
    drop(stream);
    notifier.stop().await;
}

#[tokio::test]
async fn subscribing_during_ingestion_sees_every_notification_once_in_order() {
    const EVENTS: usize = 3000;
    let data = TempDirectory::new("seam");
    let notifier = TestNotifier::start(&data.0, &["--memory-files", "false"]).await;
    let client = notifier.ingester.clone();
    let producer = tokio::spawn(async move {
        for chunk in 0..(EVENTS / 500) {
            let events = (chunk * 500..(chunk + 1) * 500)
                .map(|index| step_event(&format!("e{index}"), EventType::StepStarted, &format!("s{index}")))
                .collect();
            common::ingest(client.clone(), events).await;
        }
    });
    // Wait until ingestion is under way, then subscribe from the start.
    while list(&notifier, "lead", 0).await.is_empty() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut stream = notifier
        .client
        .clone()
        .subscribe(SubscribeRequest { agent_id: "lead".to_owned(), after_cursor: 0 })
        .await
        .expect("subscribe")
        .into_inner();
    let received = receive(&mut stream, EVENTS).await;
    producer.await.expect("producer");
    let expected: Vec<String> = (0..EVENTS).map(|index| format!("e{index}")).collect();
    assert_eq!(event_ids(&received), expected, "no gap, no repeat at the seam");
    assert!(tokio::time::timeout(Duration::from_millis(200), stream.next()).await.is_err(), "nothing more");
    notifier.stop().await;
}

/// Events sent 30 ms apart, within one linger of 400 ms, are stored in one
/// batch: their notifications carry the batch's one creation time. (With no
/// linger each would be a batch of its own, 30 ms apart.)
#[tokio::test]
async fn events_that_trickle_in_within_the_linger_are_written_together() {
    let data = TempDirectory::new("linger");
    let notifier = TestNotifier::start(&data.0, &["--ingest-linger-ms", "400"]).await;
    let (sender, receiver) = tokio::sync::mpsc::channel(8);
    let mut acks = notifier
        .ingester
        .clone()
        .ingest_events(tokio_stream::wrappers::ReceiverStream::new(receiver))
        .await
        .expect("opening IngestEvents")
        .into_inner();
    for index in 0..4 {
        let event = step_event(&format!("trickle-{index}"), EventType::StepStarted, &format!("s{index}"));
        sender.send(IngestEventsRequest { event: Some(event) }).await.expect("sending");
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    for _ in 0..4 {
        acks.next().await.expect("an ack").expect("stored");
    }
    let notifications = list(&notifier, "lead", 0).await;
    assert_eq!(event_ids(&notifications), ["trickle-0", "trickle-1", "trickle-2", "trickle-3"]);
    let created: BTreeSet<(i64, i32)> = notifications
        .iter()
        .map(|notification| notification.created_at.map(|at| (at.seconds, at.nanos)).expect("created_at"))
        .collect();
    assert_eq!(created.len(), 1, "one batch, one creation time: {created:?}");
}
