use super::found;
use crate::{Context, RoleFormat, Severity, validate_role_definition};

fn yaml(source: &str) -> Vec<(&'static str, u32, u32)> {
    found(&validate_role_definition(source, RoleFormat::Yaml, &Context::default()).diagnostics)
}

fn markdown(source: &str) -> Vec<(&'static str, u32, u32)> {
    found(&validate_role_definition(source, RoleFormat::Markdown, &Context::default()).diagnostics)
}

/// A YAML role list with the core `RoleDefinition` fields.
const YAML_ROLES: &str = "\
- name: PythonDeveloper
  description: Writes, tests, and debugs Python code.
  goals: [\"Implement features as per specification\", \"Ensure code quality\"]
  responsibilities: [\"Write Python functions/classes\", \"Write unit tests\", \"Debug code\"]
  tools: [\"file_write\", \"python_interpreter\", \"code_linter\"]
";

/// A Markdown role file with every section (and a leading file-name line).
const MARKDOWN_ROLE: &str = "\
# roles/delivery.md

# Delivery Manager

## Mission
Keep the project delivery on-time and aligned with client priorities.
Enable the team to deliver by the planned finish date or earlier.

## Goals
- Track progress against timeline and milestones
- Identify blockers that threaten delivery dates
- Recommend adjustments when delivery is at risk

## Context Files
- project/scope.md
- project/timeline.md
- project/team.md
- project/blockers/
- project/traffic-lights/
- memory.md

## Tools
- read_file
- write_file
- append_file
- list_files
- move_file

## Schedule
9am and 5pm, weekdays

## Inbox
agent/inbox/delivery/

## User Preferences
(Configured by the User — how this role should behave)
";

#[test]
fn the_yaml_role_list_is_valid() {
    let report = validate_role_definition(YAML_ROLES, RoleFormat::Yaml, &Context::default());
    assert_eq!(report.diagnostics, vec![]);
    assert_eq!(report.roles.len(), 1);
    assert_eq!(report.roles[0].name, "PythonDeveloper");
    assert_eq!(report.roles[0].tools, vec!["file_write", "python_interpreter", "code_linter"]);
}

#[test]
fn the_markdown_role_is_read_with_its_plain_english_schedule() {
    let report = validate_role_definition(MARKDOWN_ROLE, RoleFormat::Markdown, &Context::default());
    assert_eq!(report.diagnostics, vec![]);
    let role = &report.roles[0];
    assert_eq!(role.schedule, "9am and 5pm, weekdays");
    assert_eq!(role.name, "Delivery Manager");
    assert!(role.mission.starts_with("Keep the project delivery"));
    assert_eq!(role.goals.len(), 3);
    assert_eq!(role.context_files.len(), 6);
    assert_eq!(role.tools, vec!["read_file", "write_file", "append_file", "list_files", "move_file"]);
    assert_eq!(role.inbox, "agent/inbox/delivery/");
    assert!(role.user_preferences.contains("Configured by the User"));
}

#[test]
fn yaml_role_rules() {
    assert_eq!(yaml("- just a name\n"), vec![("ROL001", 1, 3)]);
    assert_eq!(yaml("description: x\n"), vec![("ROL002", 1, 1)]);
    assert_eq!(yaml("name: [x]\n"), vec![("ROL003", 1, 7)]);
    assert_eq!(yaml("name: a\ntols: [x]\n"), vec![("ROL004", 2, 1)]);
    assert_eq!(yaml("- name: a\n- name: a\n"), vec![("ROL005", 2, 3)]);
    assert_eq!(yaml("name: a\nschedule: \"0 9 * * 8\"\n"), vec![("ROL006", 2, 11)]);
    assert_eq!(yaml("name: a\ninbox: /etc/inbox\n"), vec![("ROL007", 2, 8)]);
    assert_eq!(yaml("name: a\ninput_schema: {type: objekt}\n"), vec![("ROL008", 2, 22)]);
    assert_eq!(yaml("name: a\noutput_schema: text\n"), vec![("ROL008", 2, 16)]);
    assert_eq!(yaml("name: a\ntools: [x, x]\n"), vec![("ROL009", 2, 12)]);
    assert_eq!(yaml("name: \"  \"\n"), vec![("ROL010", 1, 7)]);
    assert_eq!(yaml("name: a\nschedule: every day\n"), vec![("ROL011", 2, 11)]);
    assert_eq!(yaml("name: a\ncontext_files: [../secrets]\n"), vec![("ROL012", 2, 17)]);
    assert_eq!(yaml("name: a\npermitted_actions: [code, Review]\n"), vec![("ROL013", 2, 27)]);
    assert_eq!(yaml("name: a\npost_to_inbox: risk/x\n"), vec![("ROL014", 2, 16)]);
    assert_eq!(yaml("name: a\ninbox: agent/inbox/Risk.Team/\n"), vec![("ROL007", 2, 8)]);
    assert_eq!(yaml("name: a\nschedule: \"@daily\"\ninput_schema: {type: object}\n"), vec![]);
}

#[test]
fn tools_are_checked_against_the_context() {
    let context =
        Context { tools: Some(vec!["file_write".to_owned(), "code_linter".to_owned()]), ..Context::default() };
    let report = validate_role_definition(YAML_ROLES, RoleFormat::Yaml, &context);
    assert_eq!(found(&report.diagnostics), vec![("CTX006", 5, 25)]);
    assert_eq!(report.diagnostics[0].path, "[0].tools[1]");

    let report =
        validate_role_definition("# R\n## Mission\nm\n## Tools\n- file_writ\n", RoleFormat::Markdown, &context);
    assert_eq!(found(&report.diagnostics), vec![("CTX006", 5, 3)]);
    assert!(report.diagnostics[0].message.contains("did you mean 'file_write'"));
}

#[test]
fn built_in_workspace_tools_need_no_registration() {
    let context = Context { tools: Some(vec!["web_search".to_owned()]), ..Context::default() };
    let report = validate_role_definition("name: a\ntools: [read_file, move_file]\n", RoleFormat::Yaml, &context);
    assert_eq!(found(&report.diagnostics), vec![]);
    for tool in crate::BUILTIN_TOOLS {
        let source = format!("# R\n## Mission\nm\n## Tools\n- {tool}\n");
        let report = validate_role_definition(&source, RoleFormat::Markdown, &context);
        assert_eq!(found(&report.diagnostics), vec![], "{tool}");
    }
    let report = validate_role_definition("name: a\ntools: [reed_file]\n", RoleFormat::Yaml, &context);
    assert_eq!(found(&report.diagnostics), vec![("CTX006", 2, 9)]);
    assert!(report.diagnostics[0].message.contains("did you mean 'read_file'"), "{}", report.diagnostics[0].message);
}

#[test]
fn markdown_role_rules() {
    assert_eq!(markdown("## Mission\nm\n"), vec![("MD001", 1, 1)]);
    assert_eq!(markdown("# A\n# B\n## Mission\nm\n"), vec![("MD002", 2, 3)]);
    assert_eq!(markdown("# A\n## Mission\nm\n## Goal\n- g\n"), vec![("MD003", 4, 4)]);
    assert_eq!(markdown("# A\n## Mission\nm\n## Mission\nn\n"), vec![("MD004", 4, 4)]);
    assert_eq!(markdown("# A\n## Goals\n- g\n"), vec![("MD005", 1, 3)]);
    assert_eq!(markdown("# A\n## Mission\nm\n## Tools\n\n"), vec![("MD006", 4, 4)]);
    assert_eq!(markdown("# A\n## Mission\nm\n## Goals\nbe good\n"), vec![("MD007", 5, 1)]);
    assert_eq!(markdown("# A\n## Mission\nm\n## Schedule\n`0 9,17 * * 1-5` (twice a day)\n"), vec![]);
    assert_eq!(markdown("# A\n## Mission\nm\n## Schedule\n0 9 * * 1-8\n"), vec![("ROL006", 5, 1)]);
    assert_eq!(markdown("# A\n## Mission\nm\n## Inbox\n../x\n"), vec![("ROL007", 5, 1)]);
    assert_eq!(markdown("# A\n## Mission\nm\n## Post To Inbox\nrisk\n"), vec![]);
    assert_eq!(markdown("# A\n## Mission\nm\n## Budget\nperiod_seconds: 60\nmax_runs: -1\n"), vec![("BDG003", 6, 11)]);
    assert_eq!(markdown("# A\n## Mission\nm\n## Throttle\nmax_concurrent: lots\n"), vec![("THR001", 5, 17)]);
    assert_eq!(yaml("name: a\nbudget: {max_runs: 3}\n"), vec![("BDG002", 2, 9)]);
    assert_eq!(markdown("# A\n## Mission\nm\n## Post To Inbox\nthe risk role\n"), vec![("ROL014", 5, 1)]);
    assert_eq!(markdown("# A\n## Mission\nm\n## Context Files\n  - /etc/passwd\n"), vec![("ROL012", 5, 5)]);
    // Headings inside code fences are text.
    assert_eq!(markdown("# A\n## Mission\n```\n## Not a section\n```\n"), vec![]);
}

#[test]
fn a_role_names_its_inbox_and_its_cron() {
    assert_eq!(crate::role_inbox_name("agent/inbox/Risk/").as_deref(), Some("risk"));
    assert_eq!(crate::role_inbox_name("risk").as_deref(), Some("risk"));
    assert_eq!(crate::role_inbox_name("agent/inbox/../risk"), None);
    assert_eq!(crate::role_inbox_name("/risk"), None);
    let cron = |text: &str| crate::role_schedule(text).ok().flatten().map(|schedule| schedule.cron);
    assert_eq!(cron("9am and 5pm: `0 9,17 * * 1-5`").as_deref(), Some("0 9,17 * * 1-5"));
    assert_eq!(cron("*/30 * * * *").as_deref(), Some("*/30 * * * *"));
    assert_eq!(cron("9am and 5pm, weekdays").as_deref(), Some("0 9,17 * * 1-5"));
    assert_eq!(cron("twice a day"), None);
}

#[test]
fn a_schedule_that_cannot_be_read_is_a_warning_at_the_phrase() {
    // The phrase's own line and column, in Markdown (after the time zone
    // line and a blank one) and in YAML.
    let source = "# A\n## Mission\nm\n## Schedule\ntime_zone: Europe/Paris\n\n9am and 5pm, weekdys\n";
    let report = validate_role_definition(source, RoleFormat::Markdown, &Context::default());
    assert_eq!(found(&report.diagnostics), vec![("ROL011", 7, 14)]);
    assert_eq!(report.diagnostics[0].severity, Severity::Warning);
    assert!(report.diagnostics[0].message.contains("cannot read 'weekdys'"), "{}", report.diagnostics[0].message);
    assert_eq!(yaml("name: a\nschedule: every 45 minutes\n"), vec![("ROL011", 2, 11)]);
    assert_eq!(yaml("name: a\nschedule: 9am twice\n"), vec![("ROL011", 2, 15)]);
    // A time zone is checked as a process's is.
    assert_eq!(markdown("# A\n## Mission\nm\n## Schedule\nhourly\ntime_zone: Mars/Olympus\n"), vec![("ROL006", 5, 1)]);
    assert_eq!(markdown("# A\n## Mission\nm\n## Schedule\nhourly\ntime_zone: Asia/Tokyo\n"), vec![]);
}

#[test]
fn a_role_declares_the_budget_and_throttle_of_its_runs() {
    let source = "# Risk\n## Mission\nm\n## Budget\nperiod_seconds: 3600\nmax_runs: 5\non_exceed: pause\n\
                  ## Throttle\nmin_interval_seconds: 60\n";
    let report = validate_role_definition(source, RoleFormat::Markdown, &Context::default());
    assert!(report.diagnostics.is_empty(), "{:?}", report.diagnostics);
    let role = &report.roles[0];
    let budget = role.budget.as_ref().expect("a budget");
    assert_eq!((budget.period_seconds, budget.max_runs, budget.on_exceed.as_str()), (3600, 5, "pause"));
    assert_eq!(role.throttle.map(|throttle| throttle.min_interval_seconds), Some(60));
    let yaml_role = "name: risk\nbudget: {period_seconds: 60, max_cost: 2.5}\nthrottle: {max_concurrent: 1}\n";
    let report = validate_role_definition(yaml_role, RoleFormat::Yaml, &Context::default());
    assert_eq!(report.roles[0].budget.as_ref().map(|budget| budget.max_cost), Some(2.5));
    assert_eq!(report.roles[0].throttle.map(|throttle| throttle.max_concurrent), Some(1));
}

#[test]
fn read_and_write_paths_narrow_the_workspace() {
    let source = "name: a\nread_paths: [notes/, brief.md]\nwrite_paths:\n  - out/\n";
    let report = validate_role_definition(source, RoleFormat::Yaml, &Context::default());
    assert_eq!(found(&report.diagnostics), vec![]);
    assert_eq!(report.roles[0].read_paths, vec!["notes/", "brief.md"]);
    assert_eq!(report.roles[0].write_paths, vec!["out/"]);

    let source = "name: a\nread_paths: [notes/, /etc/passwd]\nwrite_paths:\n  - out/../../x\n  - \"\"\n";
    let report = validate_role_definition(source, RoleFormat::Yaml, &Context::default());
    assert_eq!(found(&report.diagnostics), vec![("ROL015", 2, 22), ("ROL015", 4, 5), ("ROL015", 5, 5)]);
    assert_eq!(report.diagnostics[0].path, "read_paths[1]");
    assert!(report.diagnostics[0].message.contains("absolute"), "{}", report.diagnostics[0].message);
    assert!(report.diagnostics[1].message.contains(".."), "{}", report.diagnostics[1].message);
    let long = format!("name: a\nread_paths: [{}]\n", "a".repeat(257));
    assert_eq!(yaml(&long), vec![("ROL015", 2, 14)]);
    let many = format!("name: a\nwrite_paths: [{}]\n", vec!["x"; 65].join(", "));
    assert_eq!(yaml(&many), vec![("ROL015", 2, 14)]);
    assert_eq!(yaml("name: a\nread_paths: notes/\n"), vec![("ROL003", 2, 13)]);

    let markdown_role = "# A\n## Mission\nm\n## Read Paths\n- notes/\n- ../up\n## Write Paths\n- out/\n";
    let report = validate_role_definition(markdown_role, RoleFormat::Markdown, &Context::default());
    assert_eq!(found(&report.diagnostics), vec![("ROL015", 6, 3)]);
    assert_eq!(report.diagnostics[0].path, "Read Paths[1]");
    let report = validate_role_definition(
        "# A\n## Mission\nm\n## Read Paths\n- notes/\n## Write Paths\n- out/\n",
        RoleFormat::Markdown,
        &Context::default(),
    );
    assert_eq!(found(&report.diagnostics), vec![]);
    assert_eq!(
        (report.roles[0].read_paths.clone(), report.roles[0].write_paths.clone()),
        (vec!["notes/".to_owned()], vec!["out/".to_owned()])
    );
}
