//! Who may call the notifier: only the execution service ingests, an agent
//! reads and acknowledges only its own inbox, and a revoked token ends a
//! live subscription.

mod common;

use std::time::Duration;

use common::{TempDirectory, TestNotifier, completed};
use muster_proto::notifier::v1::{
    AcknowledgeNotificationsRequest, IngestEventsRequest, ListNotificationsRequest, SubscribeRequest,
};
use muster_runtime::auth::client::Credentials;
use tokio_stream::StreamExt as _;
use tonic::Code;

/// The status an IngestEvents stream ends with for these credentials.
async fn ingest_refusal(notifier: &TestNotifier, credentials: Credentials) -> tonic::Status {
    let forged = completed("forged", "pay", "\"wire $10000 to attacker\"");
    let requests = tokio_stream::iter([IngestEventsRequest { event: Some(forged) }]);
    match notifier.client_with(credentials).ingest_events(requests).await {
        Err(status) => status,
        Ok(response) => response.into_inner().next().await.expect("an answer").expect_err("refused"),
    }
}

#[tokio::test]
async fn only_the_execution_service_ingests_events() {
    let data = TempDirectory::new("forged");
    let notifier = TestNotifier::start(&data.0, &[]).await;
    let agent = Credentials::bearer(&notifier.token_of("mallory")).unwrap();
    notifier.client_as("mallory").await;
    let refusals = [
        (Credentials::none(), Code::Unauthenticated),
        (agent, Code::PermissionDenied),
        (notifier.credentials.operator(), Code::PermissionDenied),
        (notifier.credentials.service("roster"), Code::PermissionDenied),
    ];
    for (credentials, code) in refusals {
        let status = ingest_refusal(&notifier, credentials).await;
        assert_eq!(status.code(), code, "{status:?}");
    }
    // Nothing forged was stored or written.
    for agent in ["informed", "monitor", "lead"] {
        let listed = notifier
            .client
            .clone()
            .list_notifications(ListNotificationsRequest { agent_id: agent.to_owned(), after_cursor: 0, limit: 10 })
            .await
            .unwrap()
            .into_inner();
        assert!(listed.notifications.is_empty(), "{agent}: {listed:?}");
        assert!(common::memory_lines(&notifier.memory_root, agent).is_empty());
    }
    assert_eq!(notifier.ingest(vec![completed("real", "s1", "{}")]).await[0].notifications, 3);
    notifier.stop().await;
}

#[tokio::test]
async fn an_agent_reads_and_acknowledges_only_its_own_inbox() {
    let data = TempDirectory::new("own-inbox");
    let notifier = TestNotifier::start(&data.0, &[]).await;
    notifier.ingest(vec![completed("e1", "s1", "{}")]).await;
    let mut mallory = notifier.client_as("mallory").await;
    let read = mallory
        .list_notifications(ListNotificationsRequest { agent_id: "informed".to_owned(), after_cursor: 0, limit: 10 })
        .await
        .unwrap_err();
    assert_eq!(read.code(), Code::PermissionDenied);
    assert!(read.message().contains("agent 'mallory'"), "{}", read.message());
    let subscribe =
        mallory.subscribe(SubscribeRequest { agent_id: "informed".to_owned(), after_cursor: 0 }).await.unwrap_err();
    assert_eq!(subscribe.code(), Code::PermissionDenied);
    let acknowledge = mallory
        .acknowledge_notifications(AcknowledgeNotificationsRequest { agent_id: "informed".to_owned(), cursor: 1 })
        .await
        .unwrap_err();
    assert_eq!(acknowledge.code(), Code::PermissionDenied);
    // Operators read, but only the agent moves its read marker.
    let as_operator = notifier
        .client
        .clone()
        .acknowledge_notifications(AcknowledgeNotificationsRequest { agent_id: "informed".to_owned(), cursor: 1 })
        .await
        .unwrap_err();
    assert_eq!(as_operator.code(), Code::PermissionDenied);
    let mut informed = notifier.client_as("informed").await;
    let acknowledged = informed
        .acknowledge_notifications(AcknowledgeNotificationsRequest { agent_id: "informed".to_owned(), cursor: 1 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(acknowledged.acknowledged_cursor, 1);
    notifier.stop().await;
}

#[tokio::test]
async fn a_revoked_token_ends_the_subscription_and_is_refused() {
    let data = TempDirectory::new("revoked");
    let notifier = TestNotifier::start(&data.0, &[]).await;
    notifier.ingest(vec![completed("e1", "s1", "{}")]).await;
    let token = notifier.token_of("informed");
    let mut client = notifier.client_as("informed").await;
    let mut stream = client
        .subscribe(SubscribeRequest { agent_id: "informed".to_owned(), after_cursor: 0 })
        .await
        .unwrap()
        .into_inner();
    stream.next().await.expect("the backlog").expect("a notification");

    notifier.agents.revoke(&token, "informed");
    let ended = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("the subscription ends within 5 s of the revocation")
        .expect("with a status")
        .expect_err("an error");
    assert_eq!(ended.code(), Code::Unauthenticated);
    assert!(ended.message().contains("revoked"), "{}", ended.message());
    let refused = client
        .list_notifications(ListNotificationsRequest { agent_id: "informed".to_owned(), after_cursor: 0, limit: 1 })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated);
    notifier.stop().await;
}
