//! Every list pages, and no page token or page size can hurt it: on each
//! List RPC of the four services, a page size far past the maximum is
//! capped (the answer is an ordinary page), and a malformed or tampered
//! page token is refused with INVALID_ARGUMENT naming `page_token`.

use muster_proto::{
    execution::v1::{
        BudgetScope, ListBudgetsRequest, ListExecutionsRequest, ListInboxMessagesRequest, ListMemoryRequest,
        ListPermissionMatrixVersionsRequest, ListProcessesRequest, ListSchedulesRequest, ListToolsRequest,
        ListWorkersRequest, MemoryScope,
    },
    roster::v1::{ListAgentsRequest, ListDelegationsRequest, ListRoleDefinitionsRequest, ListTeamsRequest},
};
use muster_tests::{Backend, TestCluster};
use tonic_types::StatusExt as _;

/// Tokens no service gives: the wrong shape, hostile text, far too long.
const MALFORMED: [&str; 4] = ["not a token", "'; DROP TABLE agents; --", "%00%ff", "\u{7f}\u{1}"];

#[tokio::test]
async fn page_sizes_are_capped_and_malformed_page_tokens_refused_by_name() {
    let Some(test) = TestCluster::start(Backend::Sqlite).await else { return };
    let (mut execution, mut roster) = (test.execution(), test.roster());
    let long = "x".repeat(10_000);
    let mut tokens: Vec<&str> = MALFORMED.to_vec();
    tokens.push(&long);
    for token in tokens {
        let token = token.to_owned();
        let answers: Vec<(&str, Result<(), tonic::Status>)> = vec![
            (
                "ListProcesses",
                execution
                    .list_processes(ListProcessesRequest { page_size: u32::MAX, page_token: token.clone() })
                    .await
                    .map(drop),
            ),
            (
                "ListExecutions",
                execution
                    .list_executions(ListExecutionsRequest {
                        limit: u32::MAX,
                        page_token: token.clone(),
                        ..Default::default()
                    })
                    .await
                    .map(drop),
            ),
            (
                "ListWorkers",
                execution
                    .list_workers(ListWorkersRequest { page_size: u32::MAX, page_token: token.clone() })
                    .await
                    .map(drop),
            ),
            (
                "ListTools",
                execution
                    .list_tools(ListToolsRequest { page_size: u32::MAX, page_token: token.clone() })
                    .await
                    .map(drop),
            ),
            (
                "ListPermissionMatrixVersions",
                execution
                    .list_permission_matrix_versions(ListPermissionMatrixVersionsRequest {
                        page_size: u32::MAX,
                        page_token: token.clone(),
                    })
                    .await
                    .map(drop),
            ),
            (
                "ListInboxMessages",
                execution
                    .list_inbox_messages(ListInboxMessagesRequest {
                        inbox: "risk".into(),
                        page_size: u32::MAX,
                        page_token: token.clone(),
                        ..Default::default()
                    })
                    .await
                    .map(drop),
            ),
            (
                "ListBudgets",
                execution
                    .list_budgets(ListBudgetsRequest {
                        page_size: u32::MAX,
                        page_token: token.clone(),
                        scope: BudgetScope::Process as i32,
                    })
                    .await
                    .map(drop),
            ),
            (
                "ListBudgets (agents)",
                execution
                    .list_budgets(ListBudgetsRequest {
                        page_size: u32::MAX,
                        page_token: token.clone(),
                        scope: BudgetScope::Agent as i32,
                    })
                    .await
                    .map(drop),
            ),
            (
                "ListSchedules",
                execution
                    .list_schedules(ListSchedulesRequest { page_size: u32::MAX, page_token: token.clone() })
                    .await
                    .map(drop),
            ),
            (
                "ListMemory",
                execution
                    .list_memory(ListMemoryRequest {
                        scope: MemoryScope::Global as i32,
                        page_size: u32::MAX,
                        page_token: token.clone(),
                        ..Default::default()
                    })
                    .await
                    .map(drop),
            ),
            (
                "ListAgents",
                roster
                    .list_agents(ListAgentsRequest {
                        page_size: u32::MAX,
                        page_token: token.clone(),
                        ..Default::default()
                    })
                    .await
                    .map(drop),
            ),
            (
                "ListTeams",
                roster.list_teams(ListTeamsRequest { page_size: u32::MAX, page_token: token.clone() }).await.map(drop),
            ),
            (
                "ListRoleDefinitions",
                roster
                    .list_role_definitions(ListRoleDefinitionsRequest {
                        page_size: u32::MAX,
                        page_token: token.clone(),
                    })
                    .await
                    .map(drop),
            ),
            (
                "ListDelegations",
                roster
                    .list_delegations(ListDelegationsRequest {
                        limit: u32::MAX,
                        page_token: token.clone(),
                        ..Default::default()
                    })
                    .await
                    .map(drop),
            ),
        ];
        for (method, answer) in answers {
            let status = answer.expect_err(&format!("{method} accepted the page token {token:?}"));
            assert_eq!(status.code(), tonic::Code::InvalidArgument, "{method} with {token:?}: {status:?}");
            let named = status.get_details_bad_request().is_some_and(|bad| {
                bad.field_violations.iter().any(|violation| violation.field.ends_with("page_token"))
            });
            assert!(named, "{method} with {token:?} does not name page_token: {status:?}");
        }
    }
    // Without a token, the same huge page sizes are capped, not refused.
    execution.list_processes(ListProcessesRequest { page_size: u32::MAX, page_token: String::new() }).await.unwrap();
    execution.list_executions(ListExecutionsRequest { limit: u32::MAX, ..Default::default() }).await.unwrap();
    roster.list_agents(ListAgentsRequest { page_size: u32::MAX, ..Default::default() }).await.unwrap();
    roster.list_delegations(ListDelegationsRequest { limit: u32::MAX, ..Default::default() }).await.unwrap();
    test.shutdown().await;
}
