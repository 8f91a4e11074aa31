//! Property tests: arbitrary and mutated documents never panic and are
//! answered in bounded time, by every entry point of the library.

use std::time::{Duration, Instant};

use muster_format::{
    Context, KnownAgent, KnownRole, RoleFormat, validate_permission_matrix, validate_process, validate_role_definition,
};
use proptest::prelude::*;

const SEED: &str = "\
name: content-pipeline
lead: manager-agent
triggers: {schedule: \"0 9 * * 1-5\", inbox: risk}
steps:
  - id: research
    type: agent_task
    agent: research-agent
    message: Research the topic
    inputs: &inputs {topic: rust, depth: 2}
    roles:
      executor: research-agent
      monitors: [quality-agent, manager-agent]
      informed: [learning-agent]
  - id: write
    type: agent_task
    message: Write
    depends_on: [research]
    inputs: *inputs
    delegate: {role: writer, expertise: [rust], urgency: high, deadline: \"2026-12-01T00:00:00Z\"}
  - id: approve
    type: human_approval
    title: Approval
    depends_on: [write, research]
    roles: {executor: approval-system}
";

/// YAML-ish fragments that mutations splice in.
const FRAGMENTS: &[&str] = &[
    ":",
    "- ",
    "[",
    "]",
    "{",
    "}",
    ",",
    "&a ",
    "*a",
    "!!str ",
    "\"",
    "'",
    "\n",
    "  ",
    "#",
    "|\n",
    ">\n",
    "---\n",
    "roles:",
    "executor:",
    "monitors: [x]",
    "depends_on: [research]",
    "~",
    "0",
    "true",
    "\t",
    "?",
    "%YAML 1.2\n",
    "\u{feff}",
    "é",
];

fn context() -> Context {
    Context {
        agents: Some(vec![KnownAgent { id: "research-agent".into(), role: Some("dev".into()), offline: true }]),
        roles: Some(vec![KnownRole { name: "dev".into(), permitted_tools: vec![], permitted_actions: vec![] }]),
        tools: Some(vec!["t".into()]),
    }
}

fn mutate(base: &str, edits: &[(usize, usize, usize)]) -> String {
    let mut text: Vec<char> = base.chars().collect();
    for &(position, kind, fragment) in edits {
        let at = position % (text.len() + 1);
        match kind % 3 {
            0 => {
                let end = (at + 1 + fragment % 8).min(text.len());
                text.drain(at..end);
            }
            1 => {
                let insert: Vec<char> = FRAGMENTS[fragment % FRAGMENTS.len()].chars().collect();
                text.splice(at..at, insert);
            }
            _ => {
                // Duplicate a stretch of the text (repeats keys, anchors, steps).
                let copy_end = (at + 1 + fragment % 40).min(text.len());
                let copied: Vec<char> = text[at..copy_end].to_vec();
                text.splice(at..at, copied);
            }
        }
    }
    text.into_iter().collect()
}

fn assert_bounded(source: &str) {
    let started = Instant::now();
    let report = validate_process(source, &context());
    assert_eq!(report.process.is_some(), !report.diagnostics.iter().any(|diagnostic| diagnostic.is_error()));
    for diagnostic in &report.diagnostics {
        assert!(!diagnostic.message.is_empty());
    }
    let _ = validate_role_definition(source, RoleFormat::Yaml, &context());
    let _ = validate_role_definition(source, RoleFormat::Markdown, &context());
    let _ = validate_permission_matrix(source);
    assert!(started.elapsed() < Duration::from_secs(2), "took {:?}", started.elapsed());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn mutated_processes_never_panic(edits in proptest::collection::vec((0usize..2000, 0usize..3, 0usize..64), 1..12)) {
        assert_bounded(&mutate(SEED, &edits));
    }

    #[test]
    fn arbitrary_text_never_panics(source in "\\PC{0,400}") {
        assert_bounded(&source);
    }

    #[test]
    fn arbitrary_yaml_alphabet_never_panics(source in "[-:\\[\\]{},&*!|>'\" \n#a-c0-9]{0,300}") {
        assert_bounded(&source);
    }
}
