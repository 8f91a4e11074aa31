//! Tests of roster import.

use super::*;

fn file(name: &str, content: &str) -> ImportFile {
    ImportFile { name: name.into(), content: content.into() }
}

#[test]
fn reads_the_roster_format() {
    let parsed = parse_files(&[file(
        "roster.yaml",
        "teams: [{name: research, description: R, lead: alice}]\nagents:\n  - {id: alice, name: Alice, role: researcher, team: research, expertise: [Research, writing], capacity: 3, prompt: hi, llm_config: {model: x}}\nroles:\n  - {name: researcher, goals: [find], actions: [analyze]}\n",
    )]);
    assert!(parsed.diagnostics.is_empty(), "{:?}", parsed.diagnostics);
    assert_eq!(parsed.agents[0].expertise, vec!["research", "writing"]);
    assert_eq!(parsed.agents[0].workload_capacity, 3);
    assert_eq!(parsed.agents[0].llm_config_json, r#"{"model":"x"}"#);
    assert_eq!(parsed.teams[0].lead_agent_id, "alice");
    assert_eq!(parsed.roles[0].permitted_actions, vec!["analyze"]);
}

#[test]
fn reports_positions() {
    let parsed = parse_files(&[file("r.yaml", "agents:\n  - id: Bad Id\n    capacity: many\n")]);
    let codes: Vec<(&str, u32, u32)> = parsed.diagnostics.iter().map(|d| (d.code, d.line, d.column)).collect();
    assert_eq!(codes, vec![("ROS003", 3, 15)]);
    let parsed = parse_files(&[file("r.yaml", "agents:\n  - id: Bad Id\n")]);
    assert_eq!(parsed.diagnostics[0].code, "ROS005");
    assert_eq!(parsed.diagnostics[0].path, "agents[0].id");
    assert_eq!((parsed.diagnostics[0].line, parsed.diagnostics[0].column), (2, 9));
    let parsed = parse_files(&[file("r.yaml", "agents: [\n")]);
    assert_eq!(parsed.diagnostics[0].code, "ROS001");
}

#[test]
fn refuses_hostile_yaml() {
    let deep = format!("agents: {}{}", "[".repeat(40), "]".repeat(40));
    let parsed = parse_files(&[file("deep.yaml", &deep)]);
    assert_eq!(
        (parsed.diagnostics[0].code, parsed.diagnostics[0].column),
        ("ROS010", 40),
        "the root mapping and 32 lists"
    );
    let deeper = format!("agents: {}{}", "[".repeat(100_000), "]".repeat(100_000));
    let parsed = parse_files(&[file("deeper.yaml", &deeper)]);
    assert!(matches!(parsed.diagnostics[0].code, "ROS010" | "ROS001"), "{:?}", parsed.diagnostics[0]);
    let block = format!("agents:\n{}x\n", "- ".repeat(50));
    let parsed = parse_files(&[file("block.yaml", &block)]);
    assert_eq!(parsed.diagnostics[0].code, "ROS010");
    let laughs = "a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\ne: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\n";
    let parsed = parse_files(&[file("laughs.yaml", laughs)]);
    assert_eq!(parsed.diagnostics[0].code, "ROS001", "{:?}", parsed.diagnostics);
    let parsed = parse_files(&[file("big.yaml", &"#".repeat(MAX_FILE_BYTES + 1))]);
    assert_eq!(parsed.diagnostics[0].code, "ROS010");
}

#[test]
fn reads_markdown_roles() {
    let parsed = parse_files(&[file(
        "roles/delivery.md",
        "# roles/delivery.md\n\n# Delivery Manager\n\n## Mission\nKeep delivery on time.\n\n## Goals\n- Track progress\n- Find blockers\n\n## Context Files\n- project/scope.md\n\n## Tools\n- read_file\n\n## Schedule\n9am and 5pm, weekdays\n\n## Inbox\nagent/inbox/delivery/\n\n## User Preferences\n(none)\n",
    )]);
    let codes: Vec<&str> = parsed.diagnostics.iter().map(|d| d.code).collect();
    assert!(codes.is_empty(), "the schedule reads as cron: {:?}", parsed.diagnostics);
    let role = &parsed.roles[0];
    assert_eq!(role.name, "delivery");
    assert_eq!(role.description, "Delivery Manager");
    assert_eq!(role.goals, vec!["Track progress", "Find blockers"]);
    assert_eq!(role.tools, vec!["read_file"]);
    assert_eq!(role.inbox, "agent/inbox/delivery/");
}

#[test]
fn finds_broken_references_and_cycles() {
    let parsed = parse_files(&[file(
        "r.yaml",
        "agents:\n  - {id: a, senior: b, team: nowhere}\n  - {id: b, senior: a}\n  - {id: c, senior: ghost}\n",
    )]);
    let diagnostics = check_references(&parsed, &Existing::default());
    let codes: Vec<&str> = diagnostics.iter().map(|d| d.code).collect();
    assert_eq!(codes, vec!["ROS007", "ROS008", "ROS008", "ROS007"]);
    assert!(diagnostics[1].message.contains("a -> b -> a"));
}

#[test]
fn markdown_roles_follow_the_validator_rules() {
    let parsed = parse_files(&[file("roles/writer.md", "# Writer\n\n## Goals\n- Drafts\n\n## Actions\n- report\n")]);
    let codes: Vec<&str> = parsed.diagnostics.iter().map(|d| d.code).collect();
    assert_eq!(
        codes,
        vec!["MD005"],
        "no Mission is an error; Actions is the roster's own section: {:?}",
        parsed.diagnostics
    );
    assert!(parsed.roles.is_empty());
    let parsed = parse_files(&[file("roles/writer.md", "## Mission\nWrite.\n")]);
    assert_eq!(parsed.diagnostics[0].code, "MD001", "a title names the role file");
}

#[test]
fn llm_config_is_checked_where_it_is_written() {
    let parsed = parse_files(&[file(
        "r.yaml",
        "agents:\n  - id: a\n    llm_config:\n      provider: azure\n      api_key: sk-abc123\n      model: sk-proj-999\n      headers:\n        authorization: Bearer xyz\n      top_p: 0.9\n",
    )]);
    let found: Vec<(Severity, &str, &str, u32, u32)> =
        parsed.diagnostics.iter().map(|d| (d.severity, d.code, d.path.as_str(), d.line, d.column)).collect();
    assert_eq!(
        found,
        vec![
            (Severity::Error, "ROS013", "agents[0].llm_config.provider", 4, 17),
            (Severity::Error, "ROS011", "agents[0].llm_config.api_key", 5, 7),
            (Severity::Error, "ROS011", "agents[0].llm_config.model", 6, 14),
            (Severity::Error, "ROS011", "agents[0].llm_config.headers.authorization", 8, 9),
            (Severity::Warning, "ROS012", "agents[0].llm_config.top_p", 9, 7),
        ]
    );
    for diagnostic in &parsed.diagnostics {
        for secret in ["sk-abc123", "sk-proj-999", "Bearer xyz", "azure"] {
            assert!(!diagnostic.message.contains(secret), "{}", diagnostic.message);
        }
    }
    assert!(parsed.diagnostics[1].message.contains("api_key_env"), "{}", parsed.diagnostics[1].message);
    assert!(parsed.agents.is_empty(), "an agent whose settings hold an error is not imported");
}

#[test]
fn llm_config_unknown_keys_are_kept_with_a_warning() {
    let parsed = parse_files(&[file(
        "r.yaml",
        "agents:\n  - id: a\n    llm_config: {provider: openai, model: gpt-4o, api_key_env: OPENAI_API_KEY, seed: 7}\n",
    )]);
    let found: Vec<(&str, u32, u32)> = parsed.diagnostics.iter().map(|d| (d.code, d.line, d.column)).collect();
    assert_eq!(found, vec![("ROS012", 3, 80)]);
    assert!(parsed.agents[0].llm_config_json.contains(r#""seed":7"#), "{}", parsed.agents[0].llm_config_json);
    let parsed = parse_files(&[file("r.yaml", "agents:\n  - id: a\n    llm_config_json: '{\"token\": \"x\"}'\n")]);
    let found: Vec<(&str, &str, u32, u32)> =
        parsed.diagnostics.iter().map(|d| (d.code, d.path.as_str(), d.line, d.column)).collect();
    assert_eq!(found, vec![("ROS011", "agents[0].llm_config_json.token", 3, 22)], "JSON text: at the text");
}

#[test]
fn roles_narrow_their_workspace_paths() {
    let parsed = parse_files(&[file(
        "r.yaml",
        "roles:\n  - name: writer\n    read_paths: [notes/, brief.md]\n    write_paths:\n      - out/\n      - /tmp/x\n",
    )]);
    let found: Vec<(&str, &str, u32, u32)> =
        parsed.diagnostics.iter().map(|d| (d.code, d.path.as_str(), d.line, d.column)).collect();
    assert_eq!(found, vec![("ROS014", "roles[0].write_paths[1]", 6, 9)]);
    assert!(parsed.roles.is_empty());
    let parsed = parse_files(&[file(
        "r.yaml",
        "roles:\n  - {name: writer, read_paths: [notes/], write_paths: [out/, report.md]}\n",
    )]);
    assert!(parsed.diagnostics.is_empty(), "{:?}", parsed.diagnostics);
    assert_eq!(parsed.roles[0].read_paths, vec!["notes/"]);
    assert_eq!(parsed.roles[0].write_paths, vec!["out/", "report.md"]);

    let parsed = parse_files(&[file(
        "roles/writer.md",
        "# Writer\n\n## Mission\nWrite.\n\n## Read Paths\n- notes/\n\n## Write Paths\n- `out/`\n- ../escape\n",
    )]);
    let found: Vec<(&str, u32, u32)> = parsed.diagnostics.iter().map(|d| (d.code, d.line, d.column)).collect();
    assert_eq!(found, vec![("ROL015", 11, 3)]);
    let parsed = parse_files(&[file(
        "roles/writer.md",
        "# Writer\n\n## Mission\nWrite.\n\n## Read Paths\n- notes/\n\n## Write Paths\n- `out/`\n",
    )]);
    assert!(parsed.diagnostics.is_empty(), "{:?}", parsed.diagnostics);
    assert_eq!(
        (parsed.roles[0].read_paths.clone(), parsed.roles[0].write_paths.clone()),
        (vec!["notes/".to_owned()], vec!["out/".to_owned()])
    );
}

#[test]
fn the_model_refuses_paths_that_leave_the_workspace() {
    let role = |read_paths: Vec<String>| RoleDefinition { name: "r".into(), read_paths, ..RoleDefinition::default() };
    let error = role(vec!["ok/".into(), " ../x ".into()]).normalize().unwrap_err();
    assert_eq!(error.field, "role.read_paths[1]");
    assert_eq!(role(vec![" notes/ ".into()]).normalize().unwrap().read_paths, vec!["notes/"]);
    assert_eq!(role(vec!["x".into(); 65]).normalize().unwrap_err().field, "role.read_paths");
}
