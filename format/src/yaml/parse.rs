//! Parsing a document: the fast reader first and, when it declines,
//! `saphyr-parser`'s events fed to the same [`Builder`].

use saphyr_parser::{Parser, ScanError};

use super::builder::{Builder, limit};
use super::fast;
use super::{Limits, Parsed};
use crate::diagnostic::{Diagnostic, Position};

/// Parses one YAML document. Never panics; stops at the first syntax error or
/// exceeded limit with a diagnostic and no tree.
pub(crate) fn parse(source: &str, limits: &Limits) -> Parsed {
    if source.len() > limits.max_document_bytes {
        return Parsed {
            document: None,
            diagnostics: vec![limit(
                "YAML002",
                Position { line: 1, column: 1 },
                format!(
                    "the document is {} bytes, more than the limit of {} bytes",
                    source.len(),
                    limits.max_document_bytes
                ),
            )],
        };
    }
    let mut builder = Builder::new(limits, source.len());
    // Most documents are plain block YAML that the fast reader takes whole;
    // anything else it leaves to the full parser, from the start.
    if fast::read(source, &mut builder).is_ok() {
        return builder.finish();
    }
    builder.clear();
    read_events(source, builder)
}

/// Reads `source` with the full YAML parser.
pub(super) fn read_events(source: &str, mut builder: Builder<'_>) -> Parsed {
    let limits = builder.limits;
    for item in Parser::new_from_str(source) {
        let outcome = match item {
            Ok((event, span)) => builder.event(event, &span),
            Err(error) => Err(syntax_error(&error, limits)),
        };
        if let Err(diagnostic) = outcome {
            builder.diagnostics.push(diagnostic);
            return Parsed { document: None, diagnostics: builder.diagnostics };
        }
    }
    builder.finish()
}

fn syntax_error(error: &ScanError, limits: &Limits) -> Diagnostic {
    let marker = error.marker();
    let at = Position {
        line: u32::try_from(marker.line()).unwrap_or(u32::MAX),
        column: u32::try_from(marker.col().saturating_add(1)).unwrap_or(u32::MAX),
    };
    // The scanner reads ahead of the events and has its own flow-nesting
    // bound; report it as the depth limit it is.
    if error.info().contains("recursion limit") {
        return limit(
            "YAML003",
            at,
            format!("the document nests deeper than the limit of {} levels", limits.max_depth),
        );
    }
    limit("YAML001", at, format!("YAML syntax error: {}", error.info()))
}
