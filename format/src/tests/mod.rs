//! Unit tests of the rules: each asserts its code, line and column.

mod hostile;
mod matrix;
mod plain_schedule;
mod process;
mod roles;

use super::diagnostic::Diagnostic;

/// `(code, line, column)` of every diagnostic, in order.
pub(super) fn found(diagnostics: &[Diagnostic]) -> Vec<(&'static str, u32, u32)> {
    diagnostics.iter().map(|diagnostic| (diagnostic.code, diagnostic.line, diagnostic.column)).collect()
}
