use super::found;
use crate::{BudgetAction, Context, KnownAgent, KnownRole, Severity, validate_process};

fn check(source: &str) -> Vec<(&'static str, u32, u32)> {
    found(&validate_process(source, &Context::default()).diagnostics)
}

fn check_with(source: &str, context: &Context) -> Vec<(&'static str, u32, u32)> {
    found(&validate_process(source, context).diagnostics)
}

/// A process whose steps are the given YAML, indented under `steps:`.
fn process(steps: &str) -> String {
    format!("name: demo\nsteps:\n{steps}")
}

const FULL: &str = "\
name: content-pipeline
description: Research and write
lead: manager-agent
max_parallel: 4
triggers: {schedule: \"0 9 * * 1-5\", inbox: risk}
steps:
  - id: research
    name: Research Topic
    type: agent_task
    agent: research-agent
    message: Research the topic
    action: analyze
    inputs: {topic: rust, depth: 2, tags: [a, b], nested: {ok: true}}
    timeout_seconds: 60
    retries: 2
    roles:
      executor: research-agent
      monitors: [quality-agent]
      informed: [learning-agent]
  - id: write
    type: agent_task
    message: Write the draft
    depends_on: [research]
    delegate: {role: writer, expertise: [rust], team: core, urgency: high, deadline: \"2026-12-01T00:00:00Z\"}
  - id: approval
    type: human_approval
    title: Manager Approval
    depends_on: [write]
    continue_on_failure: true
    roles:
      executor: approval-system
      monitors: [manager-agent]
  - id: lint
    type: tool_call
    tool: code_linter
    depends_on: [approval]
";

#[test]
fn a_full_process_is_valid_and_typed() {
    let report = validate_process(FULL, &Context::default());
    assert_eq!(report.diagnostics, vec![]);
    let process = report.process.expect("a valid process is typed");
    assert_eq!(process.name, "content-pipeline");
    assert_eq!(process.lead.as_deref(), Some("manager-agent"));
    assert_eq!(process.max_parallel, Some(4));
    assert_eq!(process.steps.len(), 4);
    let research = &process.steps[0];
    assert_eq!(research.name, "Research Topic");
    assert_eq!(research.executor(), Some("research-agent"));
    assert_eq!(research.retries, 2);
    assert_eq!(research.timeout_seconds, Some(60));
    assert_eq!(research.action.as_deref(), Some("analyze"));
    let inputs: serde_json::Value = serde_json::from_str(&research.inputs_json).expect("inputs are JSON");
    assert_eq!(inputs, serde_json::json!({"topic": "rust", "depth": 2, "tags": ["a", "b"], "nested": {"ok": true}}));
    let roles = research.roles.as_ref().expect("roles");
    assert_eq!(roles.monitors, vec!["quality-agent"]);
    assert_eq!(roles.informed, vec!["learning-agent"]);
    let write = &process.steps[1];
    assert_eq!(write.name, "write");
    assert_eq!(write.executor(), None);
    assert_eq!(write.inputs_json, "{}");
    let delegate = write.delegate.as_ref().expect("delegate");
    assert_eq!(delegate.role.as_deref(), Some("writer"));
    assert_eq!(delegate.urgency.as_deref(), Some("high"));
    assert_eq!(process.steps[2].name, "Manager Approval");
    assert!(process.steps[2].continue_on_failure);
    assert_eq!(process.steps[3].tool.as_deref(), Some("code_linter"));
    let triggers = report.triggers.expect("triggers");
    assert_eq!(triggers.schedule.as_deref(), Some("0 9 * * 1-5"));
    assert_eq!(triggers.inbox.as_deref(), Some("risk"));
}

#[test]
fn schedules_have_a_time_zone_and_a_missed_runs_policy() {
    let base = "steps:\n  - {id: a, type: human_approval}\n";
    let report = validate_process(
        &format!(
            "name: d\ntriggers: {{schedule: '*/30 9 * * 1-5', time_zone: Europe/Paris, missed: run_once}}\n{base}"
        ),
        &Context::default(),
    );
    assert_eq!(report.diagnostics, vec![]);
    let triggers = report.triggers.expect("triggers");
    assert_eq!((triggers.time_zone.as_str(), triggers.missed), ("Europe/Paris", crate::MissedRuns::RunOnce));
    let found =
        check(&format!("name: d\ntriggers: {{schedule: '0 0 30 2 *', time_zone: Mars/Base, missed: twice}}\n{base}"));
    assert_eq!(found, vec![("TRG002", 2, 22), ("TRG005", 2, 47), ("TRG006", 2, 66)]);
    assert_eq!(check(&format!("name: d\ntriggers: {{missed: skip}}\n{base}")), vec![("TRG007", 2, 11)]);
}

// --- EMI: the step roles (`roles`), rule by rule -------------------------

#[test]
fn roles_must_be_an_object() {
    let source = process("  - id: a\n    type: agent_task\n    agent: x\n    message: m\n    roles: [x]\n");
    assert_eq!(check(&source), vec![("EMI001", 7, 12)]);
    let report = validate_process(&source, &Context::default());
    assert_eq!(report.diagnostics[0].message, "Field 'roles' must be an object");
    assert_eq!(report.diagnostics[0].path, "steps[0].roles");
    assert!(report.process.is_none());
}

#[test]
fn roles_null_is_not_an_object() {
    let source = process("  - id: a\n    type: agent_task\n    agent: x\n    message: m\n    roles:\n");
    assert_eq!(check(&source), vec![("EMI001", 7, 10)]);
}

#[test]
fn roles_without_executor_is_an_error_at_the_roles_key() {
    let source =
        process("  - id: a\n    type: agent_task\n    agent: x\n    message: m\n    roles:\n      monitors: [y]\n");
    let report = validate_process(&source, &Context::default());
    assert_eq!(found(&report.diagnostics), vec![("EMI002", 7, 5)]);
    assert_eq!(report.diagnostics[0].message, "Roles must include an 'executor' agent");
    assert_eq!(report.diagnostics[0].path, "steps[0].roles");
}

#[test]
fn an_empty_or_false_executor_counts_as_missing() {
    // An executor that is not truthy is missing: "", null, 0 and false.
    for value in ["\"\"", "~", "0", "false"] {
        let source = process(&format!("  - id: a\n    type: human_approval\n    roles:\n      executor: {value}\n"));
        assert_eq!(check(&source), vec![("EMI002", 6, 17)], "executor: {value}");
    }
}

#[test]
fn executor_must_be_a_string() {
    let source = process("  - id: a\n    type: human_approval\n    roles:\n      executor: [x]\n");
    let report = validate_process(&source, &Context::default());
    assert_eq!(found(&report.diagnostics), vec![("EMI003", 6, 17)]);
    assert_eq!(report.diagnostics[0].message, "Field 'executor' must be a string");
    assert_eq!(report.diagnostics[0].path, "steps[0].roles.executor");
}

#[test]
fn monitors_and_informed_must_be_lists_of_strings() {
    let source = process(
        "  - id: a\n    type: human_approval\n    roles:\n      executor: x\n      monitors: y\n      informed: z\n",
    );
    let report = validate_process(&source, &Context::default());
    assert_eq!(found(&report.diagnostics), vec![("EMI004", 7, 17), ("EMI006", 8, 17)]);
    assert_eq!(report.diagnostics[0].message, "Field 'monitors' must be a list");
    assert_eq!(report.diagnostics[1].message, "Field 'informed' must be a list");

    let source = process(
        "  - id: a\n    type: human_approval\n    roles:\n      executor: x\n      monitors: [ok, 5]\n      informed: [{a: b}]\n",
    );
    let report = validate_process(&source, &Context::default());
    assert_eq!(found(&report.diagnostics), vec![("EMI005", 7, 22), ("EMI007", 8, 18)]);
    assert_eq!(report.diagnostics[0].message, "Monitor must be a string (agent name)");
    assert_eq!(report.diagnostics[0].path, "steps[0].roles.monitors[1]");
    assert_eq!(report.diagnostics[1].message, "Informed agent must be a string");
}

#[test]
fn the_same_agent_in_two_roles_is_a_warning() {
    let source = process(
        "  - id: a\n    type: agent_task\n    agent: x\n    message: m\n    roles:\n      executor: x\n      monitors:\n        - x\n        - m\n      informed: [x, m, i]\n",
    );
    let report = validate_process(&source, &Context::default());
    assert_eq!(found(&report.diagnostics), vec![("EMI101", 10, 11), ("EMI102", 12, 18), ("EMI103", 12, 21)]);
    assert!(report.diagnostics.iter().all(|diagnostic| diagnostic.severity == Severity::Warning));
    assert_eq!(report.diagnostics[0].message, "Agent 'x' is both executor and monitor (redundant)");
    assert_eq!(report.diagnostics[0].path, "steps[0].roles.monitors[0]");
    assert_eq!(report.diagnostics[1].message, "Agent 'x' is both executor and informed (redundant)");
    assert_eq!(report.diagnostics[2].message, "Agent 'm' is in both monitors and informed");
    assert!(report.process.is_some(), "warnings do not refuse the process");
}

#[test]
fn executor_differing_from_agent_is_a_warning_for_agent_tasks_only() {
    let source = process(
        "  - id: a\n    type: agent_task\n    agent: x\n    message: m\n    roles: {executor: y}\n  - id: b\n    type: tool_call\n    tool: t\n    agent: x\n    roles: {executor: y}\n",
    );
    let report = validate_process(&source, &Context::default());
    assert_eq!(found(&report.diagnostics), vec![("EMI104", 7, 23)]);
    assert_eq!(report.diagnostics[0].message, "Role executor 'y' differs from step agent 'x'");
}

#[test]
fn unknown_role_fields_suggest_the_right_one() {
    let source = process("  - id: a\n    type: human_approval\n    roles: {executor: x, monitor: [y]}\n");
    let report = validate_process(&source, &Context::default());
    assert_eq!(found(&report.diagnostics), vec![("EMI008", 5, 26)]);
    assert!(report.diagnostics[0].message.contains("did you mean 'monitors'"));
}

// --- schema ----------------------------------------------------------------

#[test]
fn the_document_must_be_a_mapping_with_name_and_steps() {
    assert_eq!(check("- a\n- b\n"), vec![("PRC001", 1, 1)]);
    assert_eq!(check("description: x\n"), vec![("PRC002", 1, 1), ("PRC002", 1, 1)]);
    assert_eq!(check("name: Bad Name\nsteps: []\n"), vec![("PRC004", 1, 7), ("PRC006", 2, 8)]);
    assert_eq!(check("name: [x]\nsteps: {}\n"), vec![("PRC003", 1, 7), ("PRC003", 2, 8)]);
    assert_eq!(check("name: ok\nmax_parallel: 0\nsteps: []\n")[0], ("PRC008", 2, 15));
}

#[test]
fn unknown_process_fields_are_warned_with_a_suggestion() {
    let source = "name: demo\ndescripton: x\nsteps:\n  - {id: a, type: human_approval}\n";
    let report = validate_process(source, &Context::default());
    assert_eq!(found(&report.diagnostics), vec![("PRC005", 2, 1)]);
    assert!(report.diagnostics[0].message.contains("did you mean 'description'"), "{}", report.diagnostics[0].message);
    assert!(report.process.is_some());
}

#[test]
fn step_shape_and_ids() {
    let source = process(
        "  - just text\n  - type: human_approval\n  - {id: Bad_Id, type: human_approval}\n  - {id: x, type: human_approval}\n  - {id: x, type: human_approval}\n",
    );
    assert_eq!(check(&source), vec![("STP001", 3, 5), ("STP002", 4, 5), ("STP003", 5, 10), ("STP004", 7, 10)]);
    let report = validate_process(&source, &Context::default());
    assert_eq!(report.diagnostics[3].message, "step id 'x' is already used by steps[3]");
    assert_eq!(report.diagnostics[3].path, "steps[4].id");
}

#[test]
fn step_types_and_required_fields() {
    let source = process(
        "  - {id: a}\n  - {id: b, type: agent_tsk}\n  - {id: c, type: agent_task, agent: x}\n  - {id: d, type: agent_task, message: m}\n  - {id: e, type: tool_call}\n",
    );
    let report = validate_process(&source, &Context::default());
    assert_eq!(
        found(&report.diagnostics),
        vec![("STP005", 3, 5), ("STP006", 4, 19), ("STP007", 5, 5), ("STP007", 6, 5), ("STP007", 7, 5)]
    );
    assert!(report.diagnostics[1].message.contains("did you mean 'agent_task'"));
    assert!(report.diagnostics[2].message.contains("needs a 'message'"));
    assert!(report.diagnostics[3].message.contains("needs an executor"));
    assert!(report.diagnostics[4].message.contains("needs a 'tool'"));
}

#[test]
fn step_field_types_and_ranges() {
    let source = process(
        "  - id: a\n    type: human_approval\n    agent: 5\n    timeout_seconds: 0\n    retries: 11\n    continue_on_failure: maybe\n    inputs: [x]\n    depends_on: b\n    action: Code!\n    post_to_inbox: ../x\n",
    );
    assert_eq!(
        check(&source),
        vec![
            ("STP009", 5, 12),
            ("STP010", 6, 22),
            ("STP011", 7, 14),
            ("STP009", 8, 26),
            ("STP009", 9, 13),
            ("STP009", 10, 17),
            ("STP014", 11, 13),
            ("STP015", 12, 20),
        ]
    );
}

#[test]
fn unknown_step_fields_and_misplaced_tools_are_warnings() {
    let source = process("  - id: a\n    type: agent_task\n    agent: x\n    mesage: m\n    message: m\n    tool: t\n");
    let report = validate_process(&source, &Context::default());
    assert_eq!(found(&report.diagnostics), vec![("STP008", 6, 5), ("STP012", 8, 11)]);
    assert!(report.diagnostics[0].message.contains("did you mean 'message'"));
}

#[test]
fn duplicate_dependencies_are_warned() {
    let source = process("  - {id: a, type: human_approval}\n  - {id: b, type: human_approval, depends_on: [a, a]}\n");
    assert_eq!(check(&source), vec![("STP013", 4, 51)]);
}

#[test]
fn delegation_requests_are_well_formed() {
    let source = process(
        "  - id: a\n    type: agent_task\n    message: m\n    delegate:\n      expertise: [rust, \"\"]\n      urgency: urgent\n      deadline: tomorrow\n      teem: core\n",
    );
    assert_eq!(check(&source), vec![("DLG006", 7, 25), ("DLG003", 8, 16), ("DLG004", 9, 17), ("DLG005", 10, 7)]);
    let source = process("  - {id: a, type: agent_task, message: m, delegate: {team: core}}\n");
    assert_eq!(check(&source), vec![("DLG002", 3, 53)]);
    let source = process("  - {id: a, type: agent_task, message: m, delegate: expert}\n");
    assert_eq!(check(&source), vec![("DLG001", 3, 53)]);
    let source = process("  - {id: a, type: agent_task, message: m, agent: x, delegate: {role: r}}\n");
    let report = validate_process(&source, &Context::default());
    assert_eq!(found(&report.diagnostics), vec![("DLG007", 3, 53)]);
    assert_eq!(report.diagnostics[0].severity, Severity::Warning);
}

#[test]
fn triggers_are_checked() {
    let base = "steps:\n  - {id: a, type: human_approval}\n";
    assert_eq!(check(&format!("name: d\ntriggers: daily\n{base}")), vec![("TRG001", 2, 11)]);
    let report = validate_process(
        &format!("name: d\ntriggers:\n  schedule: \"0 25 * * *\"\n  inbox: Risk Box\n  cron: x\n{base}"),
        &Context::default(),
    );
    assert_eq!(found(&report.diagnostics), vec![("TRG002", 3, 13), ("TRG003", 4, 10), ("TRG004", 5, 3)]);
    assert!(report.diagnostics[0].message.contains("cron field hour '25'"), "{}", report.diagnostics[0].message);
}

// --- dependencies ------------------------------------------------------------

#[test]
fn unknown_and_self_dependencies() {
    let source = process(
        "  - {id: build, type: human_approval}\n  - {id: test, type: human_approval, depends_on: [biuld, test]}\n",
    );
    let report = validate_process(&source, &Context::default());
    assert_eq!(found(&report.diagnostics), vec![("DEP001", 4, 51), ("DEP004", 4, 58)]);
    assert!(report.diagnostics[0].message.contains("did you mean 'build'"));
    assert_eq!(report.diagnostics[0].path, "steps[1].depends_on[0]");
}

#[test]
fn cycles_are_named_in_full_and_their_dependants_never_run() {
    let source = process(
        "  - {id: a, type: human_approval, depends_on: [c]}\n  - {id: b, type: human_approval, depends_on: [a]}\n  - {id: c, type: human_approval, depends_on: [b]}\n  - {id: d, type: human_approval, depends_on: [c]}\n  - {id: e, type: human_approval}\n",
    );
    let report = validate_process(&source, &Context::default());
    assert_eq!(found(&report.diagnostics), vec![("DEP002", 3, 5), ("DEP003", 6, 5)]);
    assert_eq!(report.diagnostics[0].message, "dependency cycle: a -> c -> b -> a (each step depends on the next)");
    assert_eq!(report.diagnostics[1].severity, Severity::Warning);
}

// --- context -------------------------------------------------------------------

fn context() -> Context {
    Context {
        agents: Some(vec![
            KnownAgent { id: "dev".to_owned(), role: Some("developer".to_owned()), offline: false },
            KnownAgent { id: "sleepy".to_owned(), role: Some("developer".to_owned()), offline: true },
            KnownAgent { id: "boss".to_owned(), role: Some("lead".to_owned()), offline: false },
        ]),
        roles: Some(vec![
            KnownRole {
                name: "developer".to_owned(),
                permitted_tools: vec!["code_linter".to_owned()],
                permitted_actions: vec!["code".to_owned(), "test".to_owned()],
            },
            KnownRole {
                name: "lead".to_owned(),
                permitted_tools: vec![],
                permitted_actions: vec!["assign_role".to_owned()],
            },
        ]),
        tools: Some(vec!["code_linter".to_owned(), "web_search".to_owned()]),
    }
}

#[test]
fn context_agents() {
    let source = "name: d\nlead: bos\nsteps:\n  - {id: a, type: agent_task, message: m, agent: sleepy}\n  - id: b\n    type: human_approval\n    roles: {executor: approval-system, monitors: [dve]}\n";
    let report = validate_process(source, &context());
    assert_eq!(found(&report.diagnostics), vec![("CTX001", 2, 7), ("CTX002", 4, 50), ("CTX001", 7, 51)]);
    assert!(report.diagnostics[0].message.contains("did you mean 'boss'"));
    assert_eq!(report.diagnostics[2].path, "steps[1].roles.monitors[0]");
}

#[test]
fn approvers_are_roster_agents_and_decide_approvals() {
    let source = "name: d\nsteps:\n  - id: gate\n    type: human_approval\n    roles: {executor: approval-system, monitors: [dev]}\n    approvers: [boss, bsos]\n";
    let report = validate_process(source, &context());
    assert_eq!(found(&report.diagnostics), vec![("CTX001", 6, 23)]);
    assert_eq!(report.diagnostics[0].path, "steps[0].approvers[1]");
    let valid = validate_process(&source.replace(", bsos", ""), &context()).process.unwrap();
    assert_eq!(valid.steps[0].approvers(), ["boss"], "the approvers, not the executor and monitors");
    let unlisted = validate_process(&source.replace("    approvers: [boss, bsos]\n", ""), &context()).process.unwrap();
    assert_eq!(unlisted.steps[0].approvers(), ["approval-system", "dev"]);
}

#[test]
fn schedule_to_start_is_a_positive_number_of_seconds() {
    let step = |value: &str| {
        process(&format!("  - {{id: a, type: agent_task, agent: x, message: m, schedule_to_start_seconds: {value}}}\n"))
    };
    let report = validate_process(&step("90"), &Context::default());
    assert_eq!(report.process.unwrap().steps[0].schedule_to_start_seconds, Some(90));
    assert_eq!(check(&step("0")), vec![("STP010", 3, 80)]);
    assert_eq!(check(&step("soon")), vec![("STP009", 3, 80)]);
}

#[test]
fn the_checked_model_round_trips_through_json() {
    let process = validate_process(FULL, &Context::default()).process.unwrap();
    let stored = serde_json::to_string(&process).unwrap();
    let read: crate::ProcessDefinition = serde_json::from_str(&stored).unwrap();
    assert_eq!(read, process);
    assert_eq!(read.triggers.unwrap().inbox.as_deref(), Some("risk"));
}

#[test]
fn context_roles_actions_and_tools() {
    let source = "name: d\nsteps:\n  - {id: a, type: agent_task, message: m, agent: dev, action: review}\n  - {id: b, type: tool_call, agent: boss, tool: code_linter}\n  - {id: c, type: tool_call, agent: dev, tool: linter}\n  - {id: e, type: agent_task, message: m, delegate: {role: reviewer}}\n  - {id: f, type: agent_task, message: m, delegate: {role: lead}, action: code}\n";
    let report = validate_process(source, &context());
    assert_eq!(
        found(&report.diagnostics),
        vec![
            ("CTX004", 3, 63),
            ("CTX005", 4, 49),
            ("CTX006", 5, 48),
            ("CTX005", 5, 48),
            ("CTX003", 6, 60),
            ("CTX004", 7, 75),
        ]
    );
    assert!(report.diagnostics[0].message.contains("agent 'dev' has role 'developer'"));
    assert!(report.diagnostics[5].message.contains("delegates to role 'lead'"));
}

#[test]
fn rules_without_context_lists_are_skipped() {
    let source = "name: d\nsteps:\n  - {id: a, type: tool_call, agent: nobody, tool: nothing, action: code}\n";
    assert_eq!(check(source), vec![]);
    let only_tools = Context { tools: Some(vec![]), ..Context::default() };
    assert_eq!(check_with(source, &only_tools), vec![("CTX006", 3, 51)]);
}

#[test]
fn a_tool_call_step_cannot_call_a_built_in_workspace_tool() {
    let source = "name: d\nsteps:\n  - {id: a, type: tool_call, agent: dev, tool: read_file}\n";
    let report = validate_process(source, &Context { tools: Some(vec![]), ..Context::default() });
    assert_eq!(found(&report.diagnostics), vec![("CTX006", 3, 48)]);
    assert!(report.diagnostics[0].message.contains("built-in workspace tool"), "{}", report.diagnostics[0].message);
}

#[test]
fn findings_come_in_source_order_and_one_bad_step_hides_nothing() {
    let source = process(
        "  - {id: a, type: agent_task}\n  - {id: b, type: human_approval, roles: {}}\n  - {id: c, type: nope}\n  - {id: d, type: tool_call}\n",
    );
    let lines: Vec<u32> = check(&source).iter().map(|(_, line, _)| *line).collect();
    assert_eq!(lines, vec![3, 3, 4, 5, 6]);
}

#[test]
fn yaml_syntax_errors_and_duplicate_keys_have_positions() {
    let report = validate_process("name: d\nsteps:\n  - id: a\n   type: x\n", &Context::default());
    assert_eq!(report.diagnostics.len(), 1);
    assert_eq!(report.diagnostics[0].code, "YAML001");
    assert!(report.diagnostics[0].line >= 3);
    assert!(report.diagnostics[0].column >= 1);
    let source = "name: d\nname: e\nsteps:\n  - {id: a, type: human_approval}\n";
    assert_eq!(check(source), vec![("YAML009", 2, 1)]);
}

#[test]
fn merge_keys_reuse_step_fields() {
    let source = "name: d\nsteps:\n  - &base {id: a, type: agent_task, agent: x, message: m, inputs: {k: 1, j: 2}, roles: {executor: x}}\n  - <<: *base\n    id: b\n    inputs: {<<: {k: 3, z: 0}, j: 5}\n    depends_on: [a]\n  - {<<: 5, id: c, type: human_approval}\n";
    let report = validate_process(source, &Context::default());
    assert_eq!(found(&report.diagnostics), vec![("STP009", 8, 10)]);
    let source = source.replace("  - {<<: 5, id: c, type: human_approval}\n", "");
    let report = validate_process(&source, &Context::default());
    assert_eq!(report.diagnostics, vec![]);
    let process = report.process.expect("valid");
    let merged = &process.steps[1];
    assert_eq!(merged.id, "b");
    assert_eq!(merged.executor(), Some("x"));
    assert_eq!(merged.message, "m");
    assert_eq!(merged.depends_on, vec!["a"]);
    let inputs: serde_json::Value = serde_json::from_str(&merged.inputs_json).expect("JSON");
    assert_eq!(inputs, serde_json::json!({"k": 3, "z": 0, "j": 5}));
}

#[test]
fn throttles_are_checked() {
    let base = "steps:\n  - {id: a, type: human_approval}\n";
    let report = validate_process(
        &format!("name: d\nthrottle: {{min_interval_seconds: 60, max_concurrent: 2}}\n{base}"),
        &Context::default(),
    );
    assert_eq!(report.diagnostics, vec![]);
    let throttle = report.process.expect("valid").throttle.expect("throttle");
    assert_eq!((throttle.min_interval_seconds, throttle.max_concurrent), (60, 2));
    assert_eq!(check(&format!("name: d\nthrottle: 5\n{base}")), vec![("THR001", 2, 11)]);
    assert_eq!(
        check(&format!("name: d\nthrottle: {{min_interval_seconds: -1, max_concurrent: x, burst: 2}}\n{base}")),
        vec![("THR002", 2, 34), ("THR001", 2, 54), ("THR003", 2, 57)]
    );
}

#[test]
fn budgets_are_checked() {
    let base = "steps:\n  - {id: a, type: human_approval}\n";
    let report = validate_process(
        &format!("name: d\nbudget: {{period_seconds: 86400, max_cost: 2.5, max_tokens: 100000, max_runs: 20}}\n{base}"),
        &Context::default(),
    );
    assert_eq!(report.diagnostics, vec![]);
    let budget = report.budget.expect("budget");
    assert_eq!(
        (budget.period_seconds, budget.max_cost, budget.max_tokens, budget.max_runs),
        (86_400, 2.5, 100_000, 20)
    );
    assert_eq!(check(&format!("name: d\nbudget: 5\n{base}")), vec![("BDG001", 2, 9)]);
    assert_eq!(check(&format!("name: d\nbudget: {{max_runs: 3}}\n{base}")), vec![("BDG002", 2, 9)]);
    assert_eq!(
        check(&format!("name: d\nbudget: {{period_seconds: 0, max_cost: -1, max_tokens: x, max_run: 2}}\n{base}")),
        vec![("BDG002", 2, 26), ("BDG003", 2, 39), ("BDG001", 2, 55), ("BDG004", 2, 58)]
    );
    // Limits of one run need no period; what happens past one is declared.
    let report = validate_process(
        &format!("name: d\nbudget: {{run_max_tokens: 5000, run_max_cost: 1, on_exceed: pause}}\n{base}"),
        &Context::default(),
    );
    assert_eq!(report.diagnostics, vec![]);
    let budget = report.budget.expect("budget");
    assert_eq!(
        (budget.period_seconds, budget.run_max_tokens, budget.run_max_cost, budget.on_exceed),
        (0, 5000, 1.0, BudgetAction::Pause)
    );
    assert_eq!(
        check(&format!("name: d\nbudget: {{run_max_cost: .nan, on_exceed: halt}}\n{base}")),
        vec![("BDG003", 2, 24), ("BDG005", 2, 41)]
    );
}
