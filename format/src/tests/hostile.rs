//! Hostile documents: each limit is answered with its diagnostic, quickly.

use std::time::{Duration, Instant};

use super::found;
use crate::{Context, Limits, validate_process, validate_process_with_limits};

fn assert_quick(started: Instant) {
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
}

#[test]
fn billion_laughs_is_refused_by_the_expansion_budget() {
    let mut source = String::from("a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n");
    let names = ["b", "c", "d", "e", "f", "g", "h", "i"];
    let mut previous = "a";
    for name in names {
        let aliases = vec![format!("*{previous}"); 9].join(",");
        source.push_str(&format!("{name}: &{name} [{aliases}]\n"));
        previous = name;
    }
    let started = Instant::now();
    let report = validate_process(&source, &Context::default());
    assert_quick(started);
    assert_eq!(report.diagnostics.len(), 1);
    let diagnostic = &report.diagnostics[0];
    assert_eq!(diagnostic.code, "YAML004");
    assert!(diagnostic.message.contains("billion laughs"));
    // `g` expands to 5,380,840 nodes: refused on its line, the first past 4,000,000.
    assert_eq!(diagnostic.line, 7);
}

#[test]
fn aliases_within_budget_are_followed() {
    let source = "name: d\nsteps:\n  - &step {id: a, type: human_approval, inputs: &in {x: 1}}\n  - {id: b, type: tool_call, tool: t, inputs: *in}\n";
    let report = validate_process(source, &Context::default());
    assert_eq!(report.diagnostics, vec![]);
    let process = report.process.expect("valid");
    assert_eq!(process.steps[1].inputs_json, "{\"x\":1}");
}

#[test]
fn recursive_aliases_are_refused() {
    let report = validate_process("a: &a [*a]\n", &Context::default());
    let codes = found(&report.diagnostics);
    assert_eq!(codes.len(), 1);
    assert_eq!(codes[0].0, "YAML004");
}

#[test]
fn deep_nesting_is_refused() {
    let source = format!("name: d\nsteps: {}{}\n", "[".repeat(100_000), "]".repeat(100_000));
    let started = Instant::now();
    let report = validate_process(&source, &Context::default());
    assert_quick(started);
    assert_eq!(found(&report.diagnostics)[0].0, "YAML003");

    // Block nesting is counted by the tree builder: the 65th level is refused.
    let mut source = String::from("name: d\nsteps:\n");
    for depth in 0..200 {
        source.push_str(&" ".repeat(depth * 2));
        source.push_str("- \n");
    }
    let report = validate_process(&source, &Context::default());
    let codes = found(&report.diagnostics);
    assert_eq!(codes.len(), 1);
    assert_eq!(codes[0].0, "YAML003");
}

#[test]
fn huge_documents_are_refused_before_parsing() {
    let limits = Limits { max_document_bytes: 1024, ..Limits::default() };
    let source = format!("name: d\ndescription: {}\nsteps: []\n", "x".repeat(2048));
    let report = validate_process_with_limits(&source, &Context::default(), &limits);
    assert_eq!(found(&report.diagnostics), vec![("YAML002", 1, 1)]);
}

#[test]
fn long_strings_are_refused() {
    let limits = Limits { max_string_bytes: 100, ..Limits::default() };
    let source = format!("name: d\ndescription: {}\nsteps: []\n", "x".repeat(101));
    let report = validate_process_with_limits(&source, &Context::default(), &limits);
    assert_eq!(found(&report.diagnostics), vec![("YAML005", 2, 14)]);
}

#[test]
fn node_and_step_counts_are_bounded() {
    let limits = Limits { max_nodes: 50, ..Limits::default() };
    let source = format!("name: d\nsteps: [{}]\n", vec!["x"; 100].join(","));
    let report = validate_process_with_limits(&source, &Context::default(), &limits);
    assert_eq!(report.diagnostics[0].code, "YAML006");

    let limits = Limits { max_steps: 3, ..Limits::default() };
    let steps: String = (0..4).map(|index| format!("  - {{id: s{index}, type: human_approval}}\n")).collect();
    let report = validate_process_with_limits(&format!("name: d\nsteps:\n{steps}"), &Context::default(), &limits);
    assert_eq!(found(&report.diagnostics), vec![("PRC007", 3, 3)]);
}

#[test]
fn many_unknown_references_stay_fast() {
    let mut source = String::from("name: d\nsteps:\n");
    for index in 0..5_000 {
        source.push_str(&format!("  - {{id: step-{index}, type: human_approval, depends_on: [missing-{index}]}}\n"));
    }
    let started = Instant::now();
    let report = validate_process(&source, &Context::default());
    assert_quick(started);
    assert_eq!(report.diagnostics.len(), 5_000);
    assert!(report.diagnostics.iter().all(|diagnostic| diagnostic.code == "DEP001"));
}

#[test]
fn a_huge_mapping_of_duplicate_keys_stays_linear() {
    let mut source = String::from("name: d\nsteps: []\nx:\n");
    for index in 0..50_000 {
        source.push_str(&format!("  k{}: 1\n", index % 25_000));
    }
    let started = Instant::now();
    let report = validate_process(&source, &Context::default());
    assert_quick(started);
    assert_eq!(report.diagnostics.iter().filter(|diagnostic| diagnostic.code == "YAML009").count(), 25_000);
}

#[test]
fn several_documents_and_empty_documents_are_refused() {
    assert_eq!(
        found(&validate_process("name: a\n---\nname: b\n", &Context::default()).diagnostics),
        vec![("YAML008", 2, 1)]
    );
    assert_eq!(found(&validate_process("", &Context::default()).diagnostics), vec![("YAML007", 1, 1)]);
    assert_eq!(
        found(&validate_process("# only a comment\n", &Context::default()).diagnostics),
        vec![("YAML007", 1, 1)]
    );
}
