//! Who may call the roster: operators edit it, agents act for themselves
//! only, the services follow the credentials, and everybody else is refused
//! with a status that says why.

mod common;

use common::{Backend, TestServer};
use muster_proto::roster::v1::{
    self as pb, CredentialState, WatchCredentialsRequest, credential_service_client::CredentialServiceClient,
};
use muster_runtime::auth::{
    TokenHash,
    client::{Credentials, with_credentials},
};
use tonic::Code;
use tonic_types::StatusExt as _;

/// The `ErrorInfo` reason and domain of a refusal.
fn reason(status: &tonic::Status) -> (String, String) {
    let info = status.get_details_error_info().unwrap_or_else(|| panic!("no ErrorInfo in {status:?}"));
    (info.reason, info.domain)
}

async fn agents_act_for_themselves_only(backend: Backend) {
    let Some(mut server) = TestServer::on(backend).await else { return };
    let alice = server.agent("alice", "", "", &[], 0).await;
    let bob = server.agent("bob", "", "", &[], 0).await;
    let mut as_alice = server.client_as(&alice);

    // Rotating another agent's token: refused, naming who, its role and the action.
    let refused = as_alice.rotate_token(pb::RotateTokenRequest { agent_id: "bob".into() }).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied);
    assert!(refused.message().contains("agent 'alice' (role member)"), "{}", refused.message());
    assert!(refused.message().contains("rotate the token of another agent"), "{}", refused.message());
    assert_eq!(reason(&refused), ("NOT_THE_AGENT".to_owned(), "muster.dev".to_owned()));

    // Roster edits are for operators.
    let register = as_alice
        .register_agent(pb::RegisterAgentRequest {
            agent: Some(pb::Agent { id: "mallory".into(), ..Default::default() }),
        })
        .await
        .unwrap_err();
    assert_eq!(register.code(), Code::PermissionDenied);
    assert_eq!(reason(&register).0, "CALLER_KIND_NOT_ALLOWED");
    let update = as_alice
        .update_agent(pb::UpdateAgentRequest {
            agent: Some(pb::Agent { id: "bob".into(), role: "admin".into(), ..Default::default() }),
            update_mask: None,
        })
        .await
        .unwrap_err();
    assert_eq!(update.code(), Code::PermissionDenied);
    assert_eq!(server.get("bob").await.role, "member", "the role did not change");
    for refused in [
        as_alice
            .set_agent_status(pb::SetAgentStatusRequest { id: "bob".into(), ..Default::default() })
            .await
            .unwrap_err(),
        as_alice.revoke_token(pb::RevokeTokenRequest { agent_id: "bob".into() }).await.unwrap_err(),
        as_alice.render_system_prompt(pb::RenderSystemPromptRequest { agent_id: "bob".into() }).await.unwrap_err(),
        as_alice
            .get_organization_roster(pb::GetOrganizationRosterRequest { agent_id: "bob".into(), ..Default::default() })
            .await
            .unwrap_err(),
        as_alice.delegate(common::delegate_request("t1", "bob", &[])).await.unwrap_err(),
        as_alice
            .list_delegations(pb::ListDelegationsRequest { agent_id: "bob".into(), ..Default::default() })
            .await
            .unwrap_err(),
        // Another's token and an unknown one are refused alike.
        as_alice.authenticate(pb::AuthenticateRequest { token: bob }).await.unwrap_err(),
        as_alice.authenticate(pb::AuthenticateRequest { token: "no-such-token".into() }).await.unwrap_err(),
    ] {
        assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    }

    // For itself, an agent may: its own context, its own delegations, its own token.
    let own = as_alice.authenticate(pb::AuthenticateRequest { token: alice.clone() }).await.unwrap().into_inner();
    assert_eq!(own.agent.unwrap().id, "alice");
    as_alice
        .get_organization_roster(pb::GetOrganizationRosterRequest { agent_id: "alice".into(), ..Default::default() })
        .await
        .unwrap();
    let decision = as_alice
        .delegate(pb::DelegateRequest { task_id: "own".into(), dry_run: true, ..Default::default() })
        .await
        .unwrap();
    assert!(decision.into_inner().decision.unwrap().text.contains("DELEGATION DECISION"));
    // Without allow_delegation in its roster entry, only a dry run: no colleague's slot is reserved.
    let reserving = as_alice
        .delegate(pb::DelegateRequest { task_id: "own".into(), dry_run: false, ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(reserving.code(), Code::PermissionDenied, "{reserving:?}");
    assert_eq!(reason(&reserving).0, "DELEGATION_NOT_ALLOWED");
    let recorded = server
        .client
        .list_delegations(pb::ListDelegationsRequest { agent_id: "alice".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert!(recorded.records.is_empty(), "nothing was recorded: {recorded:?}");
    let rotated =
        as_alice.rotate_token(pb::RotateTokenRequest { agent_id: "alice".into() }).await.unwrap().into_inner().token;

    // The old token is revoked at once, and says so.
    let revoked = as_alice.list_teams(pb::ListTeamsRequest::default()).await.unwrap_err();
    assert_eq!(revoked.code(), Code::Unauthenticated);
    assert_eq!(reason(&revoked).0, "CREDENTIAL_REVOKED");
    assert!(revoked.message().contains("alice"), "{}", revoked.message());
    server.client_as(&rotated).list_teams(pb::ListTeamsRequest::default()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn agents_act_for_themselves_only_on_sqlite() {
    agents_act_for_themselves_only(Backend::Sqlite).await;
}

#[tokio::test]
async fn agents_act_for_themselves_only_on_postgres() {
    agents_act_for_themselves_only(Backend::Postgres).await;
}

#[tokio::test]
async fn missing_malformed_and_unknown_credentials_are_told_apart() {
    let server = TestServer::sqlite().await;
    let cases = [
        (Credentials::none(), "CREDENTIAL_MISSING"),
        (Credentials::bearer("hello").unwrap(), "CREDENTIAL_MALFORMED"),
        (Credentials::bearer(&format!("mst_{}", "0".repeat(64))).unwrap(), "CREDENTIAL_UNKNOWN"),
        (Credentials::bearer(&format!("mop_{}", "0".repeat(64))).unwrap(), "CREDENTIAL_UNKNOWN"),
        (Credentials::bearer(&format!("msv_execution_{}", "0".repeat(64))).unwrap(), "CREDENTIAL_UNKNOWN"),
    ];
    for (credentials, expected) in cases {
        let status = server.client_with(credentials).list_teams(pb::ListTeamsRequest::default()).await.unwrap_err();
        assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
        assert_eq!(reason(&status).0, expected, "{}", status.message());
    }
    // Health stays open.
    let mut health = tonic_health::pb::health_client::HealthClient::new(server.channel());
    health.check(tonic_health::pb::HealthCheckRequest { service: String::new() }).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn ids_that_name_folders_or_look_like_flags_are_refused() {
    let mut server = TestServer::sqlite().await;
    for id in [".", "..", "-rf"] {
        let status = server
            .client
            .register_agent(pb::RegisterAgentRequest { agent: Some(pb::Agent { id: id.into(), ..Default::default() }) })
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{id}: {status:?}");
    }
    server.stop().await;
}

#[tokio::test]
async fn only_services_follow_the_credentials_and_they_see_each_change() {
    let mut server = TestServer::sqlite().await;
    let alice = server.agent("alice", "", "", &[], 0).await;
    let as_operator = with_credentials(server.channel(), server.credentials.operator());
    let refused = CredentialServiceClient::new(as_operator)
        .watch_credentials(WatchCredentialsRequest::default())
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied);

    let as_service = with_credentials(server.channel(), server.credentials.service("notifier"));
    let mut stream = CredentialServiceClient::new(as_service)
        .watch_credentials(WatchCredentialsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let snapshot = stream.message().await.unwrap().unwrap();
    assert!(snapshot.caught_up);
    let alice_hash = TokenHash::of(&alice).0.to_vec();
    assert!(
        snapshot.changes.iter().any(|change| change.token_sha256 == alice_hash
            && change.agent_id == "alice"
            && change.state == CredentialState::Active as i32),
        "{snapshot:?}"
    );
    assert!(snapshot.changes.iter().all(|change| change.token_sha256.len() == 32), "only hashes travel");

    server.client.revoke_token(pb::RevokeTokenRequest { agent_id: "alice".into() }).await.unwrap();
    let revoked = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        loop {
            let message = stream.message().await.unwrap().unwrap();
            if let Some(change) = message.changes.into_iter().find(|change| change.token_sha256 == alice_hash) {
                return change;
            }
        }
    })
    .await
    .expect("the revocation reaches the stream within 5 s");
    assert_eq!(revoked.state, CredentialState::Revoked as i32);
    server.stop().await;
}
