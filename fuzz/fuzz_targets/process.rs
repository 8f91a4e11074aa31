//! The process reader and rules: any bytes give a report, never a panic,
//! and a process is returned exactly when no diagnostic is an error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use muster_format::{Context, KnownAgent, KnownRole, validate_process};

fuzz_target!(|data: &[u8]| {
    let Ok(source) = std::str::from_utf8(data) else { return };
    let context = Context {
        agents: Some(vec![KnownAgent { id: "research-agent".into(), role: Some("dev".into()), offline: true }]),
        roles: Some(vec![KnownRole { name: "dev".into(), permitted_tools: vec![], permitted_actions: vec![] }]),
        tools: Some(vec!["search".into()]),
    };
    let report = validate_process(source, &context);
    assert_eq!(report.process.is_some(), !report.diagnostics.iter().any(|diagnostic| diagnostic.is_error()));
    for diagnostic in &report.diagnostics {
        assert!(!diagnostic.message.is_empty());
    }
});
