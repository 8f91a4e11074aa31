//! Model-driven agents end to end: `muster agent --workspace` as a real
//! process serving agents whose `llm_config` points at scripted fake model
//! servers (real HTTP on loopback, each request recorded), against the four
//! real services. What the model is told (the system prompt with the
//! role's mission and the agent's backstory, the context files' contents,
//! the tools as JSON schemas, the key as a bearer token or `x-api-key`), a
//! loop through `InvokeTool` and every workspace tool, confinement to the
//! workspace, the iteration limit, usage as the step's tokens and cost, a
//! budget stopping a loop mid-step, rate limits, a hanging endpoint, a
//! cancelled step, structured output, a delegation the model chooses, a
//! chain the model stops, a literal key refused at import, and the TPM's
//! roles run by a model that reads its context and writes its traffic light.

use std::time::Duration;

use muster_agent::testing::{FakeModel, Recorded, Reply, anthropic_text, openai_text, openai_tool_calls};
use muster_proto::{
    common::v1::{EventType, ExecutionStatus},
    execution::v1::{CancelExecutionRequest, GetExecutionRequest, ListInboxMessagesRequest, MessageState, StepStatus},
};
use muster_tests::{
    Backend, ExecutionClient, Folder, TestCluster,
    command::{Background, run, text},
    events_until_finished, json_of, publish_and_start,
};
use serde_json::{Value, json};

/// The variable the agents' `api_key_env` names, set for `muster agent` only.
const KEY_VARIABLE: &str = "MUSTER_TEST_MODEL_KEY";
const KEY: &str = "k-fake-model-key-123";

/// A cluster with a roster imported from YAML and `muster agent` serving it
/// on a workspace.
struct Team {
    test: TestCluster,
    workspace: Folder,
    _agents: Background,
    _files: Folder,
}

impl Team {
    async fn start(roster: &str, workspace_files: &[(&str, &str)]) -> Option<Self> {
        let test = TestCluster::start(Backend::Sqlite).await?;
        let files = Folder::new("agents-roster");
        let roster_file = files.0.join("roster.yaml");
        std::fs::write(&roster_file, roster).unwrap();
        let tokens_file = files.0.join("tokens.json");
        let environment = test.command_environment();
        let imported = run(
            vec![
                "roster".into(),
                "import".into(),
                roster_file.display().to_string(),
                "--tokens-file".into(),
                tokens_file.display().to_string(),
            ],
            environment.clone(),
        )
        .await;
        assert!(imported.status.success(), "{}", text(&imported));
        let workspace = Folder::new("agents-workspace");
        for (path, content) in workspace_files {
            let path = workspace.0.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, content).unwrap();
        }
        let agents = start_agents(&environment, &tokens_file, &workspace);
        Some(Self { test, workspace, _agents: agents, _files: files })
    }

    fn execution(&self) -> ExecutionClient {
        self.test.execution()
    }
}

fn start_agents(environment: &[(String, String)], tokens_file: &std::path::Path, workspace: &Folder) -> Background {
    let mut environment = environment.to_vec();
    environment.push((KEY_VARIABLE.to_owned(), KEY.to_owned()));
    let tokens = tokens_file.display().to_string();
    let workspace = workspace.0.display().to_string();
    Background::spawn(&["agent", "--tokens-file", &tokens, "--workspace", &workspace], &environment)
}

async fn wait_until_serving(team: &mut Team) {
    team._agents.wait_for("connected: serving", Duration::from_secs(60)).await;
}

/// An `llm_config` flow mapping for a fake server.
fn openai_config(server: &FakeModel, extra: &str) -> String {
    format!(
        "{{provider: openai, base_url: \"{}/v1\", model: fake-gpt, api_key_env: {KEY_VARIABLE}, \
         prices: {{input_per_million: 1000, output_per_million: 2000}}{extra}}}",
        server.url()
    )
}

async fn execution_of(client: &mut ExecutionClient, id: &str) -> muster_proto::execution::v1::Execution {
    client.get_execution(GetExecutionRequest { id: id.to_owned() }).await.unwrap().into_inner().execution.unwrap()
}

/// The text of every request a server received.
fn all_text(server: &FakeModel) -> String {
    server.requests().iter().map(|request| request.text.clone()).collect::<Vec<_>>().join("\n")
}

fn one_step(name: &str, agent: &str, message: &str) -> String {
    format!(
        "name: {name}\nsteps:\n  - id: work\n    type: agent_task\n    agent: {agent}\n    message: {message}\n    \
         roles:\n      executor: {agent}\n"
    )
}

/// The tool results the model was sent in its last request, as JSON.
fn tool_results(request: &Recorded) -> Vec<Value> {
    request.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|message| message["role"] == "tool")
        .map(|message| serde_json::from_str(message["content"].as_str().unwrap()).unwrap())
        .collect()
}

#[tokio::test]
async fn a_model_driven_agent_works_through_its_tools_and_workspace_and_nothing_outside_it() {
    let secret = Folder::new("agents-outside");
    std::fs::write(secret.0.join("secret.txt"), "TOP SECRET OUTSIDE THE WORKSPACE").unwrap();
    let outside = secret.0.join("secret.txt").display().to_string();
    let server = FakeModel::start(move |request| match request.tool_results() {
        0 => openai_tool_calls(
            &[
                ("word_count", json!({"text": "three little words"})),
                ("read_file", json!({"path": "../secret.txt"})),
                ("read_file", json!({"path": outside.clone()})),
                ("read_file", json!({"path": "escape/secret.txt"})),
                ("read_file", json!({"path": "link-out"})),
            ],
            100,
            10,
        ),
        5 => openai_tool_calls(
            &[
                ("write_file", json!({"path": "out/draft.md", "content": "draft"})),
                ("append_file", json!({"path": "out/draft.md", "content": " and more"})),
                ("list_files", json!({"path": "out"})),
                ("move_file", json!({"from": "out/draft.md", "to": "final/draft.md"})),
                ("read_file", json!({"path": "final/draft.md"})),
            ],
            200,
            20,
        ),
        _ => openai_text("{\"done\": true, \"summary\": \"drafted\"}", 300, 30),
    })
    .await;
    let roster = format!(
        "teams: [{{name: content}}]\n\
         roles:\n  - name: drafter\n    mission: Write clear drafts for the client\n    \
         tools: [word_count, read_file, write_file, append_file, list_files, move_file]\n    \
         context_files: [brief.md, notes/, missing.md]\n\
         agents:\n  - id: wren\n    role: drafter\n    team: content\n    \
         backstory: Ten years of technical writing and a dislike of jargon\n    \
         llm_config: {}\n",
        openai_config(&server, "")
    );
    let Some(mut team) = Team::start(
        &roster,
        &[("brief.md", "THE BRIEF: three paragraphs for the portal"), ("notes/a.md", "NOTE A CONTENT")],
    )
    .await
    else {
        return;
    };
    // Links that lead out of the workspace, directly and through a folder.
    std::os::unix::fs::symlink(secret.0.join("secret.txt"), team.workspace.0.join("link-out")).unwrap();
    std::os::unix::fs::symlink(&secret.0, team.workspace.0.join("escape")).unwrap();
    wait_until_serving(&mut team).await;
    let mut client = team.execution();
    let id = publish_and_start(&mut client, &one_step("drafting", "wren", "Draft the portal note")).await;
    let events = events_until_finished(&team.test.operator("execution"), &id).await;
    let execution = execution_of(&mut client, &id).await;
    assert_eq!(execution.status, ExecutionStatus::Completed as i32, "{execution:?}");
    let step = &execution.steps[0];
    assert_eq!(json_of(&step.output), json!({"done": true, "summary": "drafted"}));
    // Usage is the step's tokens, and its cost at the agent's prices.
    assert_eq!(step.tokens_used, 660);
    assert!((step.cost - (600.0 * 1000.0 + 60.0 * 2000.0) / 1e6).abs() < 1e-9, "{}", step.cost);
    // Each model call is recorded on the step.
    let calls: Vec<_> = events.iter().filter(|event| event.event_type == EventType::StepProgress as i32).collect();
    assert_eq!(calls.len(), 3, "{events:?}");
    assert!(calls[0].detail.contains("110") || calls[0].detail.contains("100"), "{}", calls[0].detail);

    let requests = server.requests();
    assert_eq!(requests.len(), 3);
    let first = &requests[0];
    assert_eq!(first.path, "/v1/chat/completions");
    assert_eq!(first.headers["authorization"], format!("Bearer {KEY}"));
    let system = first.body["messages"][0]["content"].as_str().unwrap();
    assert!(system.contains("Write clear drafts for the client"), "{system}");
    assert!(system.contains("Ten years of technical writing"), "{system}");
    let task = first.body["messages"][1]["content"].as_str().unwrap();
    for part in ["Draft the portal note", "THE BRIEF: three paragraphs", "NOTE A CONTENT", "missing.md\n(not read"] {
        assert!(task.contains(part), "missing {part:?} in:\n{task}");
    }
    let tools: Vec<&str> =
        first.body["tools"].as_array().unwrap().iter().map(|tool| tool["function"]["name"].as_str().unwrap()).collect();
    for tool in ["word_count", "read_file", "move_file", "get_organization_roster", "delegate_task", "skip_triggers"] {
        assert!(tools.contains(&tool), "{tool} not offered: {tools:?}");
    }
    let word_count =
        first.body["tools"].as_array().unwrap().iter().find(|tool| tool["function"]["name"] == "word_count");
    assert_eq!(word_count.unwrap()["function"]["parameters"]["required"], json!(["text"]));

    // The provider's tool, through InvokeTool; the ways out, each refused.
    let results = tool_results(&requests[1]);
    assert_eq!(results[0], json!({"words": 3}));
    for (index, says) in [(1, "climbs out"), (2, "absolute"), (3, "leads out"), (4, "leads out")] {
        let message = results[index]["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "result {index}: {}", results[index]);
    }
    assert!(!all_text(&server).contains("TOP SECRET"), "a file outside the workspace reached the model");
    // The workspace tools did their work, on disk.
    let results = tool_results(&requests[2]);
    assert_eq!(results[7]["entries"][0]["name"], "draft.md", "{:?}", results[7]);
    assert_eq!(results[9]["content"], "draft and more");
    assert_eq!(std::fs::read_to_string(team.workspace.0.join("final/draft.md")).unwrap(), "draft and more");
    assert!(!team.workspace.0.join("out/draft.md").exists());
    team.test.shutdown().await;
}

#[tokio::test]
async fn a_model_loop_is_bounded_corrected_retried_and_keyed_per_provider() {
    let looping = FakeModel::start(|_| openai_tool_calls(&[("list_files", json!({"path": ""}))], 10, 1)).await;
    let structured = FakeModel::start(|request| {
        if request.index == 0 {
            openai_text("{\"light\": 3}", 10, 1)
        } else {
            openai_text("{\"light\": \"amber\"}", 10, 1)
        }
    })
    .await;
    let limited = FakeModel::start(|request| {
        if request.index == 0 {
            Reply::Status {
                status: 429,
                headers: vec![("retry-after".into(), "1".into())],
                body: "rate limited".into(),
            }
        } else {
            anthropic_text("fine after waiting", 5, 2)
        }
    })
    .await;
    let roster = format!(
        "teams: [{{name: ops}}]\n\
         roles:\n  - name: looper\n    tools: [list_files]\n  \
         - name: reporter\n    output_schema: {{type: object, required: [light], properties: {{light: {{enum: [green, amber, red]}}}}}}\n\
         agents:\n  \
         - {{id: loop-agent, role: looper, team: ops, max_iterations: 3, llm_config: {}}}\n  \
         - {{id: report-agent, role: reporter, team: ops, llm_config: {}}}\n  \
         - {{id: claude-agent, team: ops, llm_config: {{provider: anthropic, base_url: \"{}\", model: fake-claude, api_key_env: {KEY_VARIABLE}}}}}\n",
        openai_config(&looping, ""),
        openai_config(&structured, ""),
        limited.url()
    );
    let Some(mut team) = Team::start(&roster, &[]).await else { return };
    wait_until_serving(&mut team).await;
    let mut client = team.execution();

    let looped = publish_and_start(&mut client, &one_step("looping", "loop-agent", "Loop forever")).await;
    let reported = publish_and_start(&mut client, &one_step("reporting", "report-agent", "Give the light")).await;
    let waited = publish_and_start(&mut client, &one_step("waiting", "claude-agent", "Answer")).await;
    for id in [&looped, &reported, &waited] {
        events_until_finished(&team.test.operator("execution"), id).await;
    }

    let execution = execution_of(&mut client, &looped).await;
    let step = &execution.steps[0];
    assert_eq!(step.status, StepStatus::Failed as i32);
    let error = step.error.as_ref().unwrap();
    assert_eq!(error.code, "ITERATION_LIMIT", "{error:?}");
    assert!(error.message.contains("max_iterations"), "{error:?}");
    assert_eq!(looping.requests().len(), 3, "the loop stops at max_iterations");

    let execution = execution_of(&mut client, &reported).await;
    assert_eq!(execution.status, ExecutionStatus::Completed as i32, "{execution:?}");
    assert_eq!(json_of(&execution.steps[0].output), json!({"light": "amber"}));
    let requests = structured.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].body["response_format"]["type"], "json_schema");
    let correction = requests[1].last_message();
    assert!(correction.contains("does not match the required output schema"), "{correction}");

    let execution = execution_of(&mut client, &waited).await;
    assert_eq!(execution.status, ExecutionStatus::Completed as i32, "{execution:?}");
    assert_eq!(json_of(&execution.steps[0].output), json!("fine after waiting"));
    let requests = limited.requests();
    assert_eq!(requests.len(), 2, "one retry after the 429");
    assert_eq!(requests[1].headers["x-api-key"], KEY);
    assert_eq!(requests[1].path, "/v1/messages");

    // A literal key in a roster is refused where it is written, and not repeated.
    let bad = Folder::new("agents-bad-roster");
    let file = bad.0.join("bad.yaml");
    std::fs::write(&file, "agents:\n  - id: leaky\n    llm_config:\n      provider: openai\n      model: m\n      api_key: sk-live-abcdef\n").unwrap();
    let refused =
        run(vec!["roster".into(), "import".into(), file.display().to_string()], team.test.command_environment()).await;
    let output = text(&refused);
    assert!(!refused.status.success(), "{output}");
    assert!(output.contains(":6:"), "the finding names line 6: {output}");
    assert!(!output.contains("sk-live-abcdef"), "the key was repeated: {output}");
    team.test.shutdown().await;
}

#[tokio::test]
async fn a_budget_a_cancel_and_a_hanging_endpoint_each_stop_a_model_loop_mid_step() {
    let spender = FakeModel::start(|_| openai_tool_calls(&[("get_my_role", json!({}))], 500, 100)).await;
    let hanging = FakeModel::start(|_| Reply::Hang).await;
    let roster = format!(
        "teams: [{{name: ops}}]\n\
         agents:\n  \
         - {{id: spender, team: ops, max_iterations: 50, llm_config: {}}}\n  \
         - {{id: waiter, team: ops, llm_config: {}}}\n  \
         - {{id: impatient, team: ops, llm_config: {}}}\n",
        openai_config(&spender, ""),
        openai_config(&hanging, ""),
        openai_config(&hanging, ", timeout_seconds: 0.3"),
    );
    let Some(mut team) = Team::start(&roster, &[]).await else { return };
    wait_until_serving(&mut team).await;
    let mut client = team.execution();

    // A budget of 1,500 tokens a run: the third call (1,800) goes over it.
    let budgeted =
        format!("{}budget:\n  run_max_tokens: 1500\n  on_exceed: stop\n", one_step("spending", "spender", "Spend"));
    let id = publish_and_start(&mut client, &budgeted).await;
    let events = events_until_finished(&team.test.operator("execution"), &id).await;
    let execution = execution_of(&mut client, &id).await;
    assert_eq!(execution.status, ExecutionStatus::Cancelled as i32, "{execution:?}");
    assert!(execution.reason.contains("budget"), "{}", execution.reason);
    assert_ne!(execution.steps[0].status, StepStatus::Completed as i32);
    assert!(events.iter().any(|event| event.event_type == EventType::BudgetExceeded as i32));
    assert!(spender.requests().len() < 10, "the loop went on after the budget: {}", spender.requests().len());

    // Cancelled while the model is thinking: the call in flight is aborted.
    let id = publish_and_start(&mut client, &one_step("waiting", "waiter", "Think")).await;
    for _ in 0..300 {
        if !hanging.requests().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(hanging.requests().len(), 1);
    client.cancel_execution(CancelExecutionRequest { id: id.clone(), reason: "enough".into() }).await.unwrap();
    for _ in 0..200 {
        if hanging.abandoned() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(hanging.abandoned(), 1, "the model call went on after the step was withdrawn");

    // An endpoint that never answers: three attempts, each timed out.
    let id = publish_and_start(&mut client, &one_step("impatient", "impatient", "Answer quickly")).await;
    events_until_finished(&team.test.operator("execution"), &id).await;
    let step = execution_of(&mut client, &id).await.steps.remove(0);
    let error = step.error.unwrap();
    assert_eq!(error.code, "MODEL_TIMEOUT", "{error:?}");
    team.test.shutdown().await;
}

#[tokio::test]
async fn a_model_delegates_through_the_roster_and_stops_the_chain_it_need_not_start() {
    let delegating = FakeModel::start(|request| match request.tool_results() {
        0 => openai_tool_calls(
            &[("get_organization_roster", json!({"filter": "by_expertise", "expertise": "editing"}))],
            10,
            1,
        ),
        _ => openai_tool_calls(
            &[("delegate_task", json!({"expertise": ["editing"], "reason": "an editor should do this"}))],
            10,
            1,
        ),
    })
    .await;
    let skipping = FakeModel::start(|request| {
        let skip = request.text.contains("nothing new");
        match request.tool_results() {
            0 if skip => openai_tool_calls(&[("skip_triggers", json!({"reason": "nothing changed"}))], 10, 1),
            _ => openai_text("{\"status\": \"checked\"}", 10, 1),
        }
    })
    .await;
    let roster = format!(
        "teams: [{{name: content}}]\n\
         agents:\n  \
         - {{id: chief, team: content, allow_delegation: true, llm_config: {}}}\n  \
         - {{id: editor-agent, team: content, expertise: [editing]}}\n  \
         - {{id: checker, team: content, llm_config: {}}}\n",
        openai_config(&delegating, ""),
        openai_config(&skipping, ""),
    );
    let Some(mut team) = Team::start(&roster, &[]).await else { return };
    wait_until_serving(&mut team).await;
    let mut client = team.execution();

    let id = publish_and_start(&mut client, &one_step("handing-on", "chief", "Edit the draft")).await;
    events_until_finished(&team.test.operator("execution"), &id).await;
    let execution = execution_of(&mut client, &id).await;
    assert_eq!(execution.status, ExecutionStatus::Completed as i32, "{execution:?}");
    let step = &execution.steps[0];
    assert_eq!(step.executor, "editor-agent", "{step:?}");
    assert_eq!(step.delegation_chain.first().map(String::as_str), Some("chief"), "{step:?}");
    assert_eq!(json_of(&step.output)["agent"], "editor-agent");
    let roster_answer = tool_results(&delegating.requests()[1]).remove(0);
    assert_eq!(roster_answer["colleagues"][0]["id"], "editor-agent", "{roster_answer}");

    // The same step posting to an inbox: posted when the model says
    // nothing, not when it skips the triggers.
    let chained = format!("{}    post_to_inbox: after-check\n", one_step("checking", "checker", "Check"));
    let mut publish = client.clone();
    publish
        .publish_process(muster_proto::execution::v1::PublishProcessRequest {
            source: chained,
            file_name: "checking.yaml".into(),
        })
        .await
        .unwrap();
    for (note, posts) in [("something new", 1), ("nothing new", 1)] {
        let start = muster_proto::execution::v1::StartExecutionRequest {
            process_name: "checking".into(),
            inputs: muster_tests::object(&json!({"note": note}).to_string()),
            ..Default::default()
        };
        let id = client.start_execution(start).await.unwrap().into_inner().execution.unwrap().id;
        events_until_finished(&team.test.operator("execution"), &id).await;
        let messages = client
            .list_inbox_messages(ListInboxMessagesRequest {
                inbox: "after-check".into(),
                state: MessageState::Unspecified as i32,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .messages;
        assert_eq!(messages.len(), posts, "after {note:?}: {messages:?}");
    }
    team.test.shutdown().await;
}

/// The TPM's roles, each run by a model that reads its context, writes its
/// traffic light, and passes on: delivery posts to risk's inbox itself (and
/// skips its own automatic post), risk's run posts to communication's.
#[tokio::test]
async fn the_tpm_roles_run_on_a_model_that_reads_its_context_and_writes_its_traffic_light() {
    let server = FakeModel::start(|request| {
        let system = request.body["messages"][0]["content"].as_str().unwrap_or_default().to_owned();
        let task = request.body["messages"][1]["content"].as_str().unwrap_or_default().to_owned();
        let role = ["Delivery Manager", "Risk Manager", "Communication Manager"]
            .into_iter()
            .find(|role| system.contains(role))
            .unwrap_or("unknown");
        // It read the project's timeline in its context (not communication's).
        let late = task.contains("3 days late");
        match (role, request.tool_results()) {
            ("Delivery Manager", 0) => openai_tool_calls(
                &[
                    (
                        "write_file",
                        json!({"path": "project/traffic-lights/delivery.md",
                                          "content": if late { "AMBER: SSO is 3 days late" } else { "GREEN" }}),
                    ),
                    ("post_to_inbox", json!({"inbox": "tpm-risk", "body": "SSO is 3 days late; release at risk"})),
                    ("skip_triggers", json!({"reason": "posted to risk myself"})),
                ],
                50,
                5,
            ),
            ("Risk Manager", 0) => openai_tool_calls(
                &[(
                    "write_file",
                    json!({"path": "project/traffic-lights/risk.md",
                                        "content": if late { "RED: identity provider sandbox down" } else { "GREEN" }}),
                )],
                50,
                5,
            ),
            ("Communication Manager", 0) => openai_tool_calls(
                &[(
                    "write_file",
                    json!({"path": "agent/drafts/status.md", "content": "Amber: SSO late, mitigation underway."}),
                )],
                50,
                5,
            ),
            (role, _) => openai_text(&format!("{{\"role\": \"{role}\", \"done\": true}}"), 50, 5),
        }
    })
    .await;
    let Some(test) = TestCluster::start(Backend::Sqlite).await else { return };
    let environment = test.command_environment();
    let tokens_file = test.data_dir.join("tpm-tokens.json").display().to_string();
    let mut import = vec!["roster".to_owned(), "import".to_owned()];
    import.extend(
        [
            "examples/tpm/delivery.md",
            "examples/tpm/risk.md",
            "examples/tpm/communication.md",
            "examples/tpm/roster.yaml",
        ]
        .map(String::from),
    );
    import.extend(["--tokens-file".to_owned(), tokens_file.clone()]);
    let imported = run(import, environment.clone()).await;
    assert!(imported.status.success(), "{}", text(&imported));
    // The TPM's agents become model-driven.
    let mut roster = test.roster();
    let config = muster_tests::object(
        &json!({"provider": "openai", "base_url": format!("{}/v1", server.url()), "model": "fake-gpt"}).to_string(),
    );
    for agent_id in ["delivery-agent", "risk-agent", "comms-agent"] {
        let agent =
            muster_proto::roster::v1::Agent { id: agent_id.into(), llm_config: config.clone(), ..Default::default() };
        roster
            .update_agent(muster_proto::roster::v1::UpdateAgentRequest {
                agent: Some(agent),
                update_mask: Some(prost_types::FieldMask { paths: vec!["llm_config".into()] }),
            })
            .await
            .unwrap();
    }
    let workspace = Folder::new("tpm-workspace");
    copy_folder(&muster_tests::command::repository().join("examples/tpm/workspace"), &workspace.0);
    let mut agents = start_agents(&environment, std::path::Path::new(&tokens_file), &workspace);
    agents.wait_for("connected: serving", Duration::from_secs(60)).await;

    let posted = run(
        vec!["inbox".into(), "post".into(), "tpm-delivery".into(), "the auth module is 3 days late".into()],
        environment.clone(),
    )
    .await;
    assert!(posted.status.success(), "{}", text(&posted));
    let draft = workspace.0.join("agent/drafts/status.md");
    for _ in 0..600 {
        if draft.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(std::fs::read_to_string(&draft).unwrap(), "Amber: SSO late, mitigation underway.");
    let light =
        |role: &str| std::fs::read_to_string(workspace.0.join(format!("project/traffic-lights/{role}.md"))).unwrap();
    assert_eq!(light("delivery"), "AMBER: SSO is 3 days late");
    assert_eq!(light("risk"), "RED: identity provider sandbox down");
    // Risk heard from delivery's own post, once (its automatic post was skipped).
    let mut client = test.execution();
    let risk_inbox = client
        .list_inbox_messages(ListInboxMessagesRequest { inbox: "tpm-risk".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner()
        .messages;
    assert_eq!(risk_inbox.len(), 1, "{risk_inbox:?}");
    assert!(risk_inbox[0].body.contains("release at risk"), "{:?}", risk_inbox[0]);
    let requests = server.requests();
    let risk_task = requests
        .iter()
        .find(|request| request.text.contains("Risk Manager"))
        .map(|request| request.body["messages"][1]["content"].as_str().unwrap_or_default().to_owned())
        .unwrap();
    for part in ["identity provider sandbox has been down", "SSO slips past the release", "release at risk"] {
        assert!(risk_task.contains(part), "risk's run was not told {part:?}:\n{risk_task}");
    }
    drop(agents);
    test.shutdown().await;
}

fn copy_folder(from: &std::path::Path, to: &std::path::Path) {
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            std::fs::create_dir_all(&target).unwrap();
            copy_folder(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// `muster demo` with a model endpoint: the sample roster's agents become
/// model-driven and the sample process runs on the model.
#[tokio::test]
async fn the_demo_runs_the_sample_process_on_a_model() {
    muster_tests::build_service_binaries();
    let server = FakeModel::start(|_| openai_text("done by the model", 20, 5)).await;
    let data = Folder::new("agents-demo");
    let data_dir = data.0.join("data").display().to_string();
    let mut arguments: Vec<String> = ["demo", "--data-dir", &data_dir].map(String::from).to_vec();
    for port in ["--execution-port", "--roster-port", "--validator-port", "--notifier-port", "--console-port"] {
        arguments.extend([port.to_owned(), "0".to_owned()]);
    }
    arguments.extend([
        "--model-url".to_owned(),
        format!("{}/v1", server.url()),
        "--model".to_owned(),
        "fake-gpt".to_owned(),
    ]);
    let demo = run(arguments, Vec::new()).await;
    let output = text(&demo);
    assert!(demo.status.success(), "{output}");
    assert!(output.contains("the sample agents are model-driven"), "{output}");
    let requests = server.requests();
    assert!(!requests.is_empty(), "no step reached the model:\n{output}");
    assert!(requests.iter().all(|request| request.body["model"] == "fake-gpt"));
    // A later step's prompt holds what earlier steps beyond its own
    // dependencies produced: the assignment's shared memory, as the worker
    // decoded it.
    let later = requests.iter().map(|request| request.body.to_string()).find(|body| {
        body.contains("## Earlier steps this one builds on\\n### research") && body.contains("done by the model")
    });
    assert!(later.is_some(), "no prompt held the earlier steps' outputs:\n{requests:#?}");
}
