//! What the model-driven agent itself costs, apart from the model: per
//! model call, the agent's request (building the body, the HTTP call with
//! its retry bookkeeping, reading the reply) against the same POST made
//! bare with `reqwest`, both against a fake model server on loopback; per
//! tool call, a workspace tool (arguments checked against its schema, the
//! path resolved beneath the workspace) and the prompt of a typical
//! assignment. Prints microseconds (median and mean of each).
//!
//! `cargo bench -p muster-agent --bench overhead [-- CALLS]`

use std::time::{Duration, Instant};

use muster_agent::{
    catalogue::{Tool as _, WorkspaceTool},
    config::LlmConfig,
    provider::{Conversation, Model, Request, ToolDefinition, Turn},
    testing::{FakeModel, openai_text},
    workspace::{Access, Workspace},
};
use serde_json::json;

fn main() {
    let calls: usize = std::env::args().skip(1).find_map(|argument| argument.parse().ok()).unwrap_or(2000);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a runtime");
    runtime.block_on(model_calls(calls));
    tool_calls(calls * 5);
}

async fn model_calls(calls: usize) {
    let server = FakeModel::start(|_| openai_text("{\"done\": true}", 1200, 80)).await;
    let config = LlmConfig::from_json(&json!({"provider": "openai", "model": "m", "base_url": server.url()}))
        .expect("settings")
        .expect("a provider");
    let http = muster_agent::http_client().unwrap();
    let model = Model::new(config, http.clone());
    let conversation =
        Conversation { system: "You are an agent. ".repeat(200), turns: vec![Turn::User("Do the step. ".repeat(300))] };
    let tools: Vec<ToolDefinition> = WorkspaceTool::ALL.iter().map(|tool| tool.definition()).collect();
    let request = Request { conversation: &conversation, tools: &tools, output_schema: None };
    let (_, exchange) = model.complete(request).await;
    let body = exchange.request.to_string();
    let url = format!("{}/chat/completions", server.url());

    let mut bare = Vec::with_capacity(calls);
    let mut agent = Vec::with_capacity(calls);
    for round in 0..calls * 2 {
        // Taking turns, so both see the same machine.
        let started = Instant::now();
        if round % 2 == 0 {
            let response = http.post(&url).header("content-type", "application/json").body(body.clone()).send().await;
            let answer: serde_json::Value = response.expect("an answer").json().await.expect("JSON");
            assert!(answer.get("choices").is_some());
            bare.push(started.elapsed());
        } else {
            let (reply, _) = model.complete(request).await;
            assert_eq!(reply.expect("a reply").usage.input_tokens, 1200);
            agent.push(started.elapsed());
        }
    }
    let (bare_median, bare_mean) = figures(&mut bare);
    let (agent_median, agent_mean) = figures(&mut agent);
    println!("model call, {calls} calls of a {} KiB request, loopback fake server:", body.len() / 1024);
    println!("  bare reqwest POST + JSON read   median {bare_median:>7.1} µs  mean {bare_mean:>7.1} µs");
    println!("  agent Model::complete           median {agent_median:>7.1} µs  mean {agent_mean:>7.1} µs");
    println!(
        "  the agent's own overhead        median {:>7.1} µs  mean {:>7.1} µs",
        agent_median - bare_median,
        agent_mean - bare_mean
    );
}

fn tool_calls(calls: usize) {
    let folder = std::env::temp_dir().join(format!("muster-agent-bench-{}", std::process::id()));
    let workspace = Workspace::open(&folder).expect("a workspace");
    let all = Access::default();
    workspace.write_file("project/notes.md", &"a line of notes\n".repeat(100), false, all).expect("a file");
    let read = json!({"path": "project/notes.md"});
    let write = json!({"path": "project/out.md", "content": "a short report"});
    let list = json!({"path": "project"});
    let mut measured = Vec::new();
    for (name, tool, arguments) in [
        ("read_file (1.6 KB)", WorkspaceTool::ReadFile, &read),
        ("write_file", WorkspaceTool::WriteFile, &write),
        ("list_files", WorkspaceTool::ListFiles, &list),
    ] {
        let mut times = Vec::with_capacity(calls);
        for _ in 0..calls {
            let started = Instant::now();
            tool.check(arguments).expect("valid arguments");
            let path = arguments["path"].as_str().unwrap_or_default();
            let result = match tool {
                WorkspaceTool::ReadFile => workspace.read_file(path, all),
                WorkspaceTool::WriteFile => workspace.write_file(path, "a short report", false, all),
                _ => workspace.list_files(path, all),
            };
            let text = result.expect("the tool works").to_string();
            assert!(!text.is_empty());
            times.push(started.elapsed());
        }
        measured.push((name, figures(&mut times)));
    }
    println!(
        "tool call, {calls} calls each (arguments checked, path resolved beneath the workspace, result as JSON text):"
    );
    for (name, (median, mean)) in measured {
        println!("  {name:<30}  median {median:>7.1} µs  mean {mean:>7.1} µs");
    }
    let _ = std::fs::remove_dir_all(&folder);
}

/// Median and mean, in microseconds.
fn figures(times: &mut [Duration]) -> (f64, f64) {
    times.sort_unstable();
    let median = times[times.len() / 2].as_secs_f64() * 1e6;
    let mean = times.iter().map(Duration::as_secs_f64).sum::<f64>() / times.len() as f64 * 1e6;
    (median, mean)
}
