//! The agent a step is handed to hears of it: a worker's onward delegation
//! makes a STEP_DELEGATED event that reaches the delegate's inbox, on both
//! databases, as the roster's document asks ("the receiving agent").

use std::time::Duration;

use muster::worker::AgentCredential;
use muster_proto::{
    common::v1::EventType,
    notifier::v1::{ListNotificationsRequest, RecipientReason},
};
use muster_tests::{Backend, TestCluster, agent, events_until_finished, publish_and_start, spawn_sample_worker};

async fn the_delegate_hears_of_the_delegation(backend: Backend) {
    let Some(test) = TestCluster::start(backend).await else { return };
    let ids = ["writer-agent", "seo-agent", "lead-agent"];
    let agents: Vec<_> = ids
        .iter()
        .map(|id| muster_proto::roster::v1::Agent { allow_delegation: true, ..agent(id, "", "content") })
        .collect();
    let tokens = test.register_agents(&agents).await;
    let credentials =
        ids.iter().zip(tokens).map(|(id, token)| AgentCredential { agent_id: (*id).to_owned(), token }).collect();
    let (_stop, _worker) = spawn_sample_worker(test.operator("execution"), credentials);
    let source = "name: handing-on\nlead: lead-agent\nsteps:\n  - id: draft\n    type: agent_task\n    agent: writer-agent\n    \
                  message: Draft it\n    inputs: {delegate: {writer-agent: seo-agent}}\n    roles:\n      executor: writer-agent\n";
    let id = publish_and_start(&mut test.execution(), source).await;
    let events = events_until_finished(&test.operator("execution"), &id).await;
    let delegated =
        events.iter().find(|event| event.event_type == EventType::StepDelegated as i32).expect("a delegation");
    assert_eq!(delegated.agent_id, "seo-agent");

    let mut notifier = test.notifier();
    let mut heard = Vec::new();
    for _ in 0..200 {
        let request = ListNotificationsRequest { agent_id: "seo-agent".to_owned(), ..Default::default() };
        heard = notifier.list_notifications(request).await.unwrap().into_inner().notifications;
        if !heard.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let notice = heard
        .iter()
        .find(|notification| notification.event.as_ref().is_some_and(|event| event.event_id == delegated.event_id))
        .unwrap_or_else(|| panic!("seo-agent did not hear of the delegation: {heard:?}"));
    assert_eq!(notice.reason, RecipientReason::Participant as i32);
    test.shutdown().await;
}

#[tokio::test]
async fn the_delegate_hears_of_the_delegation_on_sqlite() {
    the_delegate_hears_of_the_delegation(Backend::Sqlite).await;
}

#[tokio::test]
async fn the_delegate_hears_of_the_delegation_on_postgres() {
    the_delegate_hears_of_the_delegation(Backend::Postgres).await;
}
