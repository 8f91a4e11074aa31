//! The role reader, in both formats (YAML and Markdown with sections): any
//! bytes give a report, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use muster_format::{Context, RoleFormat, validate_role_definition};

fuzz_target!(|data: &[u8]| {
    let Ok(source) = std::str::from_utf8(data) else { return };
    for format in [RoleFormat::Markdown, RoleFormat::Yaml] {
        let report = validate_role_definition(source, format, &Context::default());
        for diagnostic in &report.diagnostics {
            assert!(!diagnostic.message.is_empty());
        }
    }
});
