//! The store conformance suite, run on SQLite and on PostgreSQL.

mod common;

use sqlx::Connection as _;

use muster_notifier::{
    domain::Reason,
    store::{IngestOutcome, MemoryProgress, MemoryState, NewEvent, NewRecipient, SqlStore, Store},
};

fn recipient(agent_id: &str, reason: Reason, memory: MemoryState) -> NewRecipient {
    let memory_path =
        (memory == MemoryState::Pending).then(|| format!("{agent_id}/events/notifications_2026-01-16.ndjson"));
    NewRecipient { agent_id: agent_id.to_owned(), reason, memory, memory_path }
}

fn new_event(event_id: &str, recipients: Vec<NewRecipient>) -> NewEvent {
    NewEvent {
        event_id: event_id.to_owned(),
        encoded: event_id.as_bytes().to_vec().into(),
        output_summary: format!("summary of {event_id}"),
        received_at: 1_000,
        recipients,
    }
}

async fn conformance<S: Store>(store: &S) {
    // Ingest: cursors follow the recipients in order, across events.
    let outcomes = store
        .ingest(
            &[
                new_event(
                    "e1",
                    vec![
                        recipient("alice", Reason::Informed, MemoryState::Pending),
                        recipient("bob", Reason::Lead, MemoryState::Pending),
                    ],
                ),
                new_event("e2", vec![recipient("alice", Reason::Monitor, MemoryState::Refused)]),
                // Repeated inside the batch: a duplicate.
                new_event("e1", vec![recipient("alice", Reason::Informed, MemoryState::Pending)]),
            ],
            &[("alice/events/notifications_2026-01-16.ndjson".to_owned(), Some(0))],
        )
        .await
        .expect("ingest");
    assert_eq!(
        outcomes,
        vec![
            IngestOutcome::Stored { first_cursor: 1 },
            IngestOutcome::Stored { first_cursor: 3 },
            IngestOutcome::Duplicate
        ]
    );

    // Resent in a later batch: a duplicate; a new event continues the cursors.
    let outcomes = store
        .ingest(
            &[
                new_event("e2", vec![recipient("alice", Reason::Monitor, MemoryState::Pending)]),
                new_event("e3", vec![recipient("alice", Reason::Lead, MemoryState::Disabled)]),
                new_event("e4", vec![]),
            ],
            &[],
        )
        .await
        .expect("second ingest");
    assert_eq!(
        outcomes,
        vec![
            IngestOutcome::Duplicate,
            IngestOutcome::Stored { first_cursor: 4 },
            IngestOutcome::Stored { first_cursor: 5 }
        ]
    );

    // Listing: per agent, after a cursor, limited, with the stored event.
    let alice = store.list("alice", 0, 100).await.expect("list");
    assert_eq!(alice.iter().map(|n| n.cursor).collect::<Vec<_>>(), vec![1, 3, 4]);
    assert_eq!(alice[0].reason, Reason::Informed);
    assert_eq!(alice[0].event_id, "e1");
    assert_eq!(alice[0].encoded, &b"e1"[..]);
    assert_eq!(alice[0].output_summary, "summary of e1");
    assert_eq!(alice[0].created_at, 1_000);
    assert_eq!(alice[1].memory, MemoryState::Refused);
    assert_eq!(alice[2].reason, Reason::Lead);
    assert_eq!(store.list("alice", 1, 1).await.expect("list").iter().map(|n| n.cursor).collect::<Vec<_>>(), vec![3]);
    assert_eq!(store.list("bob", 0, 100).await.expect("list").len(), 1);
    assert!(store.list("carol", 0, 100).await.expect("list").is_empty());
    // Every agent's, in cursor order.
    let all = store.list_all(1, 100).await.expect("list all");
    assert_eq!(
        all.iter().map(|n| (n.cursor, n.agent_id.as_str())).collect::<Vec<_>>(),
        [(2, "bob"), (3, "alice"), (4, "alice")]
    );
    assert_eq!(store.list_all(0, 1).await.expect("list all").len(), 1);
    assert_eq!(store.newest_cursor_of_all().await.expect("newest"), 4);

    // Acknowledgements are monotonic.
    assert_eq!(store.acknowledged_cursor("alice").await.expect("ack"), 0);
    assert_eq!(store.acknowledge("alice", 3).await.expect("ack"), 3);
    assert_eq!(store.acknowledge("alice", 1).await.expect("ack"), 3);
    assert_eq!(store.acknowledged_cursor("alice").await.expect("ack"), 3);
    assert_eq!(store.acknowledge("alice", 4).await.expect("ack"), 4);
    assert_eq!(store.acknowledged_cursor("bob").await.expect("ack"), 0);

    // Memory bookkeeping: pending lines above the mark, and failed ones.
    assert_eq!(
        store.memory_file_length("alice/events/notifications_2026-01-16.ndjson").await.expect("length"),
        Some(0)
    );
    assert_eq!(store.memory_file_length("nobody").await.expect("length"), None);
    let unwritten = store.unwritten_memory(0, 100).await.expect("unwritten");
    assert_eq!(unwritten.iter().map(|n| n.cursor).collect::<Vec<_>>(), vec![1, 2]);
    store
        .record_memory_progress(&MemoryProgress {
            written_through: 2,
            failed: vec![2],
            recovered: vec![],
            ..MemoryProgress::default()
        })
        .await
        .expect("progress");
    let unwritten = store.unwritten_memory(0, 100).await.expect("unwritten");
    assert_eq!(unwritten.iter().map(|n| (n.cursor, n.memory)).collect::<Vec<_>>(), vec![(2, MemoryState::Failed)]);
    store
        .record_memory_progress(&MemoryProgress {
            written_through: 1,
            failed: vec![],
            recovered: vec![2],
            ..MemoryProgress::default()
        })
        .await
        .expect("progress");
    assert!(store.unwritten_memory(0, 100).await.expect("unwritten").is_empty());
    // The mark never goes back.
    store
        .ingest(&[new_event("e5", vec![recipient("bob", Reason::Informed, MemoryState::Pending)])], &[])
        .await
        .expect("ingest");
    assert_eq!(store.unwritten_memory(0, 100).await.expect("unwritten").len(), 1);

    // A large batch: one transaction, multi-statement chunks, contiguous cursors.
    let many: Vec<NewEvent> = (0..1200)
        .map(|index| {
            new_event(
                &format!("bulk-{index}"),
                vec![
                    recipient("bulk-a", Reason::Informed, MemoryState::Disabled),
                    recipient("bulk-b", Reason::Monitor, MemoryState::Disabled),
                ],
            )
        })
        .collect();
    let outcomes = store.ingest(&many, &[]).await.expect("bulk ingest");
    assert_eq!(outcomes.first(), Some(&IngestOutcome::Stored { first_cursor: 6 }));
    assert_eq!(outcomes.last(), Some(&IngestOutcome::Stored { first_cursor: 6 + 2 * 1199 }));
    let page = store.list("bulk-b", 0, 1000).await.expect("list");
    assert_eq!(page.len(), 1000);
    assert!(page.windows(2).all(|pair| pair[0].cursor + 2 == pair[1].cursor));

    // A memory file's recorded length: an ingest records the length it is
    // given and forgets one given as unknown; one it is not given stays (the
    // length before an earlier batch's append still under way); a progress
    // records the lengths after an append.
    let carol = "carol/events/notifications_2026-01-16.ndjson";
    let to_carol =
        |event_id: &str| new_event(event_id, vec![recipient("carol", Reason::Informed, MemoryState::Pending)]);
    store.ingest(&[to_carol("c1")], &[(carol.to_owned(), Some(7))]).await.expect("ingest");
    assert_eq!(store.memory_file_length(carol).await.expect("length"), Some(7));
    store.ingest(&[to_carol("c2")], &[]).await.expect("ingest");
    assert_eq!(store.memory_file_length(carol).await.expect("length"), Some(7), "kept");
    store
        .record_memory_progress(&MemoryProgress { lengths: vec![(carol.to_owned(), 19)], ..MemoryProgress::default() })
        .await
        .expect("progress");
    assert_eq!(store.memory_file_length(carol).await.expect("length"), Some(19), "the length after");
    store.ingest(&[to_carol("c3")], &[(carol.to_owned(), None)]).await.expect("ingest");
    assert_eq!(store.memory_file_length(carol).await.expect("length"), None, "forgotten");
}

#[tokio::test]
async fn sqlite_store_conforms() {
    let directory = common::TempDirectory::new("store");
    let url = format!("sqlite://{}", directory.0.join("store.db").display());
    let store = SqlStore::connect_lazy(&url, 1).expect("store");
    store.migrate().await.expect("migrate");
    conformance(&store).await;
    assert!(!store.shared(), "one process writes a SQLite file");
    let turn = store.writer_turn().await.expect("no turn to wait for");
    store.writer_turn().await.expect("nor twice").end().await.unwrap();
    turn.end().await.unwrap();

    // A batch refused part-way through its inserts leaves nothing behind:
    // neither its events nor the notifications written before the refusal.
    let mut other = sqlx::AnyConnection::connect(&url).await.expect("a second connection");
    sqlx::query(
        "CREATE TRIGGER refuse_poison BEFORE INSERT ON notifications WHEN NEW.agent_id = 'poison' \
         BEGIN SELECT RAISE(FAIL, 'poison refused'); END",
    )
    .execute(&mut other)
    .await
    .expect("trigger");
    let newest = store.newest_cursor_of_all().await.expect("newest");
    let batch = [
        new_event("before-poison", vec![recipient("healthy", Reason::Informed, MemoryState::Disabled)]),
        new_event(
            "poisoned",
            vec![
                recipient("healthy", Reason::Monitor, MemoryState::Disabled),
                recipient("poison", Reason::Informed, MemoryState::Disabled),
            ],
        ),
    ];
    let refused = store.ingest(&batch, &[]).await;
    assert!(matches!(&refused, Err(error) if error.to_string().contains("poison refused")), "{refused:?}");
    assert_eq!(store.newest_cursor_of_all().await.expect("newest"), newest);
    assert!(store.list("healthy", 0, 10).await.expect("list").is_empty());
    sqlx::query("DROP TRIGGER refuse_poison").execute(&mut other).await.expect("drop trigger");
    let outcomes = store.ingest(&batch, &[]).await.expect("ingest once allowed");
    assert!(outcomes.iter().all(|outcome| matches!(outcome, IngestOutcome::Stored { .. })), "{outcomes:?}");
    assert_eq!(store.list("healthy", 0, 10).await.expect("list").len(), 2);
    other.close().await.expect("close");
}

#[tokio::test]
async fn postgres_store_conforms() {
    let Some(database) = muster_runtime::testing::TestDatabase::create().await else { return };
    let store = SqlStore::connect_lazy(&database.url, 4).expect("store");
    store.migrate().await.expect("migrate");
    conformance(&store).await;

    // Replicas take turns: a second waits until the first ends, or dies.
    assert!(store.shared());
    let other = SqlStore::connect_lazy(&database.url, 2).expect("store");
    let turn = store.writer_turn().await.expect("turn");
    let waiting = tokio::spawn(async move { other.writer_turn().await.map(|turn| (turn, other)) });
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(!waiting.is_finished(), "the other replica waits for its turn");
    turn.end().await.expect("end");
    let (turn, _other) = tokio::time::timeout(std::time::Duration::from_secs(10), waiting)
        .await
        .expect("its turn comes")
        .unwrap()
        .expect("turn");
    let waiting = tokio::spawn({
        let store = store.clone();
        async move { store.writer_turn().await.map(drop) }
    });
    drop(turn);
    tokio::time::timeout(std::time::Duration::from_secs(10), waiting)
        .await
        .expect("a dropped turn ends too")
        .unwrap()
        .expect("turn");
}
