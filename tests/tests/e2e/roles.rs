//! Roles that run on their own, end to end, through real gRPC to the four
//! real processes and the `muster` command, on both databases: the TPM
//! example's Markdown roles are imported with their agents; each role with a
//! schedule or an inbox gets its process `role-<name>`; a message to the
//! delivery role's inbox runs delivery, risk and communication in turn (each
//! role posts to the next one's inbox); each run's assignment carries the
//! role, the rendered prompt with the think-first preamble and the memory;
//! the sample agents add to their role's memory, which `muster memory show`
//! prints; a role's budget limits its scheduled runs; a role that loses its
//! schedule and inbox stops running; two roles posting to each other forever
//! are stopped by the budget one of them declares.

use std::time::Duration;

use muster_proto::{
    execution::v1::{
        AppendMemoryRequest, BudgetScope, GetExecutionRequest, GetProcessRequest, InboxMessage, ListBudgetsRequest,
        ListExecutionsRequest, ListInboxMessagesRequest, ListMemoryRequest, MemoryScope, MessageState,
        PostToInboxRequest,
    },
    roster::v1::{
        GetRoleDefinitionRequest, PutRoleDefinitionRequest, RenderSystemPromptRequest, RoleBudget, RoleDefinition,
    },
};
use muster_tests::{
    Backend, ExecutionClient, TestCluster, agent,
    command::{Background, run, text},
    spawn_sample_worker,
};
use serde_json::Value;

const ROLE_FILES: [&str; 5] = [
    "examples/tpm/delivery.md",
    "examples/tpm/risk.md",
    "examples/tpm/communication.md",
    "examples/tpm/product.md",
    "examples/tpm/roster.yaml",
];

fn words(words: &[&str]) -> Vec<String> {
    words.iter().map(|word| (*word).to_owned()).collect()
}

/// Waits until `inbox` holds a message in `state`.
async fn processed_message(client: &mut ExecutionClient, inbox: &str) -> InboxMessage {
    for _ in 0..600 {
        let request = ListInboxMessagesRequest {
            inbox: inbox.to_owned(),
            state: MessageState::Processed as i32,
            ..Default::default()
        };
        if let Some(message) = client.list_inbox_messages(request).await.unwrap().into_inner().messages.pop() {
            return message;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no processed message in inbox '{inbox}'");
}

/// The latest version of `process` once `accept` likes it.
async fn process_when(
    client: &mut ExecutionClient,
    process: &str,
    accept: impl Fn(&muster_proto::execution::v1::ProcessVersion) -> bool,
) -> muster_proto::execution::v1::ProcessVersion {
    for _ in 0..300 {
        let request = GetProcessRequest { name: process.to_owned(), version: 0 };
        if let Ok(found) = client.get_process(request).await
            && let Some(version) = found.into_inner().process
            && accept(&version)
        {
            return version;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("process '{process}' never became as expected");
}

async fn runs_of(client: &mut ExecutionClient, process: &str) -> Vec<muster_proto::execution::v1::Execution> {
    let request = ListExecutionsRequest { process_name: process.to_owned(), limit: 1000, ..Default::default() };
    client.list_executions(request).await.unwrap().into_inner().executions
}

async fn roles_run_on_their_own(backend: Backend) {
    let Some(test) = TestCluster::start(backend).await else { return };
    let environment = test.command_environment();
    let tokens_file = test.data_dir.join("tokens.json").display().to_string();
    let mut validate = words(&["validate"]);
    validate.extend(words(&ROLE_FILES));
    let valid = run(validate, environment.clone()).await;
    assert_eq!(valid.status.code(), Some(0), "{}", text(&valid));
    assert!(text(&valid).contains("5 file(s) checked: 0 error(s), 0 warning(s)"), "{}", text(&valid));
    let mut import = words(&["roster", "import"]);
    import.extend(words(&ROLE_FILES));
    import.extend(words(&["--tokens-file", &tokens_file]));
    let imported = run(import, environment.clone()).await;
    assert!(imported.status.success(), "{}", text(&imported));
    let mut agents = Background::spawn(&["agent", "--tokens-file", &tokens_file], &environment);
    agents.wait_for("connected: serving", Duration::from_secs(60)).await;
    let mut client = test.execution();

    // Each role has its process, kept from its definition.
    let delivery = process_when(&mut client, "role-delivery", |_| true).await;
    assert!(delivery.source.contains("schedule: \"0 9,17 * * 1-5\""), "{}", delivery.source);
    assert!(delivery.source.contains("inbox: tpm-delivery"), "{}", delivery.source);
    assert!(delivery.source.contains("post_to_inbox: tpm-risk"), "{}", delivery.source);
    process_when(&mut client, "role-risk", |_| true).await;
    process_when(&mut client, "role-communication", |_| true).await;
    // The product manager: weekly, and on demand through its inbox.
    let product = process_when(&mut client, "role-product", |_| true).await;
    for part in ["schedule: \"0 10 * * 1\"", "inbox: tpm-product", "post_to_inbox: tpm-delivery"] {
        assert!(product.source.contains(part), "missing {part:?} in:\n{}", product.source);
    }
    let schedules = run(words(&["schedule", "list"]), environment.clone()).await;
    assert!(text(&schedules).contains("role-communication  '*/30 * * * *' UTC  missed: skip"), "{}", text(&schedules));
    assert!(text(&schedules).contains("role-product  '0 10 * * 1' UTC  missed: skip"), "{}", text(&schedules));

    // The prompt an agent of a role gets: the role, then the think-first preamble.
    let prompt = test
        .roster()
        .render_system_prompt(RenderSystemPromptRequest { agent_id: "delivery-agent".into() })
        .await
        .unwrap()
        .into_inner()
        .system_prompt;
    for part in [
        "Your role in this project: delivery (Delivery Manager).",
        "Your mission: Keep the project delivery on-time",
        "Tools (use only these):\n- read_file\n",
        "- project/timeline.md\n",
        "User preferences: Lead with what changed",
        "Before taking any action, THINK:\n1. What has changed since the last run?",
    ] {
        assert!(prompt.contains(part), "missing {part:?} in:\n{prompt}");
    }

    // Operators add to the memories; the runs read them.
    for add in [
        words(&["memory", "add", "delivery", "--text", "The client wants status on Fridays"]),
        words(&["memory", "add", "--global", "--text", "The project ends on 2027-03-31"]),
    ] {
        let added = run(add, environment.clone()).await;
        assert!(added.status.success(), "{}", text(&added));
    }

    // One message runs the three roles in turn.
    let posted =
        run(words(&["inbox", "post", "tpm-delivery", "the auth module is 3 days late"]), environment.clone()).await;
    assert!(posted.status.success(), "{}", text(&posted));
    let to_comms = processed_message(&mut client, "tpm-comms").await;
    assert_eq!(to_comms.sender, "risk-agent");
    let to_risk = processed_message(&mut client, "tpm-risk").await;
    assert_eq!(to_risk.sender, "delivery-agent");
    assert!(to_risk.body.contains("the auth module is 3 days late"), "delivery saw the message: {}", to_risk.body);

    // The delivery run: its agent, its role, the prompt and both memories.
    let [run_of_delivery] = runs_of(&mut client, "role-delivery").await.try_into().expect("one delivery run");
    let execution = client
        .get_execution(GetExecutionRequest { id: run_of_delivery.id.clone() })
        .await
        .unwrap()
        .into_inner()
        .execution
        .expect("the execution");
    let output: Value = muster_tests::json_of(&execution.steps[0].output);
    assert_eq!(output["agent"], "delivery-agent");
    assert_eq!(output["role"], "delivery");
    assert_eq!(output["memory_entries"], 2, "the global memory and the role's: {output}");
    assert!(output["system_prompt_chars"].as_u64().unwrap() as usize >= prompt.chars().count());

    // What the runs remembered, newest first.
    let shown = run(words(&["memory", "show", "delivery"]), environment.clone()).await;
    let shown = text(&shown);
    let ran = shown.find("delivery-agent ran role-delivery").unwrap_or_else(|| panic!("{shown}"));
    let told = shown.find("The client wants status on Fridays").unwrap_or_else(|| panic!("{shown}"));
    assert!(ran < told, "newest first:\n{shown}");
    assert!(shown.contains(&format!("in {}", run_of_delivery.id)), "{shown}");
    let risk_memory = client
        .list_memory(ListMemoryRequest { scope: MemoryScope::Role as i32, role: "risk".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner()
        .entries;
    assert_eq!(risk_memory.len(), 1);
    assert!(risk_memory[0].text.starts_with("risk-agent ran role-risk"), "{:?}", risk_memory[0]);
    // 1 global entry read, and none of risk's own before its first run.
    assert!(risk_memory[0].text.ends_with("1 memory entries read"), "{:?}", risk_memory[0]);
    // An agent reads the global memory and its own role's, not another role's.
    let tokens: Value = serde_json::from_str(&std::fs::read_to_string(&tokens_file).unwrap()).unwrap();
    let mut as_risk = test.execution_as(tokens["risk-agent"].as_str().expect("risk-agent's token"));
    for (scope, role, allowed) in
        [(MemoryScope::Global, "", true), (MemoryScope::Role, "risk", true), (MemoryScope::Role, "delivery", false)]
    {
        let request = ListMemoryRequest { scope: scope as i32, role: role.into(), ..Default::default() };
        match as_risk.list_memory(request).await {
            Ok(listed) => assert!(allowed && !listed.into_inner().entries.is_empty(), "{role}"),
            Err(status) => assert!(!allowed && status.code() == tonic::Code::PermissionDenied, "{role}: {status:?}"),
        }
    }
    // An append retried with its idempotency key adds nothing: the first entry comes back.
    let append = |text: &str| AppendMemoryRequest {
        scope: MemoryScope::Global as i32,
        role: String::new(),
        text: text.into(),
        idempotency_key: "standup-note".into(),
    };
    let first = client.append_memory(append("standup moved to 10:00")).await.unwrap().into_inner().entry.unwrap();
    let again = client.append_memory(append("standup moved to 10:30")).await.unwrap().into_inner().entry.unwrap();
    assert_eq!(again, first);
    let request = ListMemoryRequest { scope: MemoryScope::Global as i32, ..Default::default() };
    let global = client.list_memory(request).await.unwrap().into_inner().entries;
    assert_eq!(global.iter().filter(|entry| entry.text.starts_with("standup moved")).count(), 1, "{global:?}");

    // A role's budget limits its scheduled runs: every second, but 3 runs an hour.
    let budget = run(
        words(&["budget", "set", "communication", "--role", "--max-runs", "3", "--period-seconds", "3600"]),
        environment.clone(),
    )
    .await;
    assert!(budget.status.success(), "{}", text(&budget));
    let mut roster = test.roster();
    let mut communication = roster
        .get_role_definition(GetRoleDefinitionRequest { name: "communication".into() })
        .await
        .unwrap()
        .into_inner()
        .role
        .unwrap();
    communication.schedule = "* * * * * *".into();
    roster.put_role_definition(PutRoleDefinitionRequest { role: Some(communication.clone()) }).await.unwrap();
    process_when(&mut client, "role-communication", |version| version.source.contains("schedule: \"* * * * * *\""))
        .await;
    for _ in 0..100 {
        if runs_of(&mut client, "role-communication").await.len() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(runs_of(&mut client, "role-communication").await.len(), 3, "the chain's run and two scheduled ones");
    let budgets = run(words(&["budget", "list"]), environment.clone()).await;
    assert!(text(&budgets).contains("role communication  (operator, per 3600 s)  runs 3 of 3"), "{}", text(&budgets));

    // A role without a schedule or an inbox no longer runs on its own.
    communication.schedule = String::new();
    communication.inbox = String::new();
    roster.put_role_definition(PutRoleDefinitionRequest { role: Some(communication) }).await.unwrap();
    let retired = process_when(&mut client, "role-communication", |version| !version.source.contains("triggers")).await;
    assert!(retired.source.contains("nothing starts this"), "{}", retired.source);
    let schedules = run(words(&["schedule", "list"]), environment.clone()).await;
    assert!(!text(&schedules).contains("role-communication"), "{}", text(&schedules));
    let posted = run(words(&["inbox", "post", "tpm-comms", "anyone?"]), environment.clone()).await;
    assert!(posted.status.success(), "{}", text(&posted));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(runs_of(&mut client, "role-communication").await.len(), 3, "the message starts nothing now");

    // The product manager on demand: a request to its inbox runs it, with its
    // role's prompt, and its scope change goes to delivery's inbox.
    let prompt = test
        .roster()
        .render_system_prompt(RenderSystemPromptRequest { agent_id: "product-agent".into() })
        .await
        .unwrap()
        .into_inner()
        .system_prompt;
    assert!(prompt.contains("Your role in this project: product (Product Manager)."), "{prompt}");
    let posted = run(
        words(&["inbox", "post", "tpm-product", "the client wants the audit export in JSON this release"]),
        environment.clone(),
    )
    .await;
    assert!(posted.status.success(), "{}", text(&posted));
    processed_message(&mut client, "tpm-product").await;
    let [run_of_product] = runs_of(&mut client, "role-product").await.try_into().expect("one product run");
    assert_eq!(run_of_product.status, muster_proto::common::v1::ExecutionStatus::Completed as i32);
    let request = ListInboxMessagesRequest { inbox: "tpm-delivery".into(), ..Default::default() };
    let to_delivery = client.list_inbox_messages(request).await.unwrap().into_inner().messages;
    let from_product = to_delivery.iter().find(|message| message.sender == "product-agent");
    let from_product = from_product.unwrap_or_else(|| panic!("product posted to delivery: {to_delivery:?}"));
    assert!(from_product.body.contains("audit export in JSON"), "product saw the request: {}", from_product.body);
    let shown = run(words(&["memory", "show", "product"]), environment.clone()).await;
    assert!(text(&shown).contains("product-agent ran role-product"), "{}", text(&shown));

    // Bad input names the field.
    let bad = RoleDefinition { name: "broken".into(), schedule: "0 0 30 2 *".into(), ..Default::default() };
    let status = roster.put_role_definition(PutRoleDefinitionRequest { role: Some(bad) }).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().starts_with("role.schedule: "), "{}", status.message());
    let bad = RoleDefinition { name: "broken".into(), inbox: "agent/inbox/../x".into(), ..Default::default() };
    let status = roster.put_role_definition(PutRoleDefinitionRequest { role: Some(bad) }).await.unwrap_err();
    assert!(status.message().starts_with("role.inbox: "), "{}", status.message());
    let absurd = RoleBudget {
        period: Some(muster_runtime::time::seconds_to_duration(60)),
        max_cost: -1.0,
        ..Default::default()
    };
    let bad = RoleDefinition { name: "broken".into(), budget: Some(absurd), ..Default::default() };
    let status = roster.put_role_definition(PutRoleDefinitionRequest { role: Some(bad) }).await.unwrap_err();
    assert!(status.message().starts_with("role.budget.max_cost: "), "{}", status.message());
    let too_long = "x".repeat(4097);
    let added = run(words(&["memory", "add", "--global", "--text", &too_long]), environment.clone()).await;
    assert!(text(&added).contains("field text is 4097 bytes; the limit is 4096 bytes"), "{}", text(&added));

    drop(agents);
    test.shutdown().await;
}

/// Two roles that post to each other's inbox forever: the budget one of
/// them declares stops the loop, and says so on the message left waiting
/// and in ListBudgets.
async fn a_role_loop_stops_at_its_declared_budget(backend: Backend) {
    let Some(test) = TestCluster::start(backend).await else { return };
    let mut roster = test.roster();
    let budget =
        RoleBudget { period: Some(muster_runtime::time::seconds_to_duration(3600)), max_runs: 3, ..Default::default() };
    for (name, inbox, post_to, budget) in [("ping", "ping", "pong", Some(budget)), ("pong", "pong", "ping", None)] {
        let role = RoleDefinition {
            name: name.into(),
            inbox: inbox.into(),
            post_to_inbox: post_to.into(),
            budget,
            ..Default::default()
        };
        roster.put_role_definition(PutRoleDefinitionRequest { role: Some(role) }).await.unwrap();
    }
    let tokens =
        test.register_agents(&[agent("ping-agent", "ping", "core"), agent("pong-agent", "pong", "core")]).await;
    let credentials = ["ping-agent", "pong-agent"]
        .iter()
        .zip(tokens)
        .map(|(agent_id, token)| muster::worker::AgentCredential { agent_id: (*agent_id).into(), token })
        .collect();
    let (stop, worker) = spawn_sample_worker(test.operator("execution"), credentials);
    let mut client = test.execution();
    process_when(&mut client, "role-ping", |version| version.source.contains("max_runs: 3")).await;
    process_when(&mut client, "role-pong", |_| true).await;
    let request = PostToInboxRequest { inbox: "ping".into(), body: "start".into(), ..Default::default() };
    client.post_to_inbox(request).await.unwrap();
    let mut note = String::new();
    for _ in 0..600 {
        let request = ListInboxMessagesRequest {
            inbox: "ping".into(),
            state: MessageState::Unprocessed as i32,
            ..Default::default()
        };
        let waiting = client.list_inbox_messages(request).await.unwrap().into_inner().messages;
        if let Some(message) = waiting.into_iter().find(|message| !message.note.is_empty()) {
            note = message.note;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(note, "held: budget of process 'role-ping' exhausted: 3 of 3 runs in the last 3600 s (declared budget)");
    assert_eq!(runs_of(&mut client, "role-ping").await.len(), 3);
    assert_eq!(runs_of(&mut client, "role-pong").await.len(), 3);
    let budgets = client.list_budgets(ListBudgetsRequest::default()).await.unwrap().into_inner().budgets;
    let ping = budgets.iter().find(|budget| budget.name == "ping").expect("the role's budget");
    assert_eq!((ping.scope, ping.used_runs, ping.max_runs), (BudgetScope::Role as i32, 3, 3));
    assert_eq!(ping.source, "declared");

    let _ = stop.send(());
    worker.await.unwrap().unwrap();
    test.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_loop_stops_at_its_declared_budget_on_sqlite() {
    a_role_loop_stops_at_its_declared_budget(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_loop_stops_at_its_declared_budget_on_postgres() {
    a_role_loop_stops_at_its_declared_budget(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_run_on_their_own_on_sqlite() {
    roles_run_on_their_own(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_run_on_their_own_on_postgres() {
    roles_run_on_their_own(Backend::Postgres).await;
}
