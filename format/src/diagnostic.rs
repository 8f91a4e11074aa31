//! Diagnostics: what every rule reports, and the collector rules write into.

use std::fmt;

/// How serious a diagnostic is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Severity {
    /// The document is invalid and is refused.
    Error,
    /// The document is accepted, but something is probably wrong.
    Warning,
}

impl Severity {
    /// `error` or `warning`, as printed by the CLI and in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Error => "error",
            Self::Warning => "warning",
        }
    }
}

impl fmt::Display for Severity {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.as_str())
    }
}

/// One finding about a document, positioned at the offending node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// Error or warning.
    pub severity: Severity,
    /// A stable code such as `EMI002`, listed in `docs/diagnostics.md`.
    pub code: &'static str,
    /// A sentence for people.
    pub message: String,
    /// Where in the document, as a path such as `steps[2].roles.monitors[0]`;
    /// empty for the document as a whole.
    pub path: String,
    /// 1-based line of the offending node; 0 when unknown.
    pub line: u32,
    /// 1-based column (in characters) of the offending node; 0 when unknown.
    pub column: u32,
}

impl Diagnostic {
    /// True for [`Severity::Error`].
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

/// A line and column pair, both 1-based.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Position {
    pub(crate) line: u32,
    pub(crate) column: u32,
}

/// Collects diagnostics while rules run; sorted into source order at the end.
#[derive(Debug, Default)]
pub(crate) struct Diagnostics {
    items: Vec<Diagnostic>,
    errors: usize,
}

impl Diagnostics {
    pub(crate) fn error(&mut self, code: &'static str, path: &str, at: Position, message: impl Into<String>) {
        self.push(Severity::Error, code, path, at, message.into());
    }

    pub(crate) fn warning(&mut self, code: &'static str, path: &str, at: Position, message: impl Into<String>) {
        self.push(Severity::Warning, code, path, at, message.into());
    }

    pub(crate) fn push_diagnostic(&mut self, diagnostic: Diagnostic) {
        self.errors += usize::from(diagnostic.is_error());
        self.items.push(diagnostic);
    }

    fn push(&mut self, severity: Severity, code: &'static str, path: &str, at: Position, message: String) {
        self.errors += usize::from(severity == Severity::Error);
        self.items.push(Diagnostic {
            severity,
            code,
            message,
            path: path.to_owned(),
            line: at.line,
            column: at.column,
        });
    }

    pub(crate) fn error_count(&self) -> usize {
        self.errors
    }

    pub(crate) fn has_errors(&self) -> bool {
        self.errors > 0
    }

    /// The findings in source order (stable: findings at the same place keep
    /// the order the rules reported them in).
    pub(crate) fn into_sorted(mut self) -> Vec<Diagnostic> {
        self.items.sort_by_key(|diagnostic| (diagnostic.line, diagnostic.column));
        self.items
    }
}

/// `parent.key`, or `key` at the root.
pub(crate) fn child_path(parent: &str, key: &str) -> String {
    if parent.is_empty() { key.to_owned() } else { format!("{parent}.{key}") }
}

/// `parent[index]`.
pub(crate) fn index_path(parent: &str, index: usize) -> String {
    format!("{parent}[{index}]")
}
