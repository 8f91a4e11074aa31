//! Full transcripts of model calls, when asked for (`muster agent
//! --transcripts DIR`): one NDJSON file per step attempt,
//! `DIR/<execution>/<step>.<attempt>.ndjson`, a line per model call with the
//! request and the answer as the endpoint gave them. Keys travel in headers,
//! which are never written. Folders are made 0700 and files 0600.

use std::{
    fs::File,
    io::Write as _,
    os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _},
    path::Path,
};

use muster_proto::execution::v1::Assignment;
use serde_json::json;

use crate::provider::Exchange;

/// Where one attempt's exchanges go; nothing when transcripts are off or
/// the file cannot be made (which is logged once).
pub(crate) struct Transcript(Option<File>);

impl Transcript {
    pub(crate) fn open(folder: Option<&Path>, assignment: &Assignment) -> Self {
        let Some(folder) = folder else { return Self(None) };
        let folder = folder.join(safe(&assignment.execution_id));
        let path = folder.join(format!("{}.{}.ndjson", safe(&assignment.step_id), assignment.attempt));
        let opened = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&folder)
            .and_then(|()| std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(&path));
        match opened {
            Ok(file) => Self(Some(file)),
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "the transcript cannot be written");
                Self(None)
            }
        }
    }

    pub(crate) fn record(&mut self, iteration: u32, exchange: &Exchange) {
        let Some(file) = &mut self.0 else { return };
        let line = json!({
            "iteration": iteration,
            "attempts": exchange.attempts,
            "latency_ms": exchange.latency.as_millis() as u64,
            "request": exchange.request,
            "response": exchange.response,
        });
        if let Err(error) = writeln!(file, "{line}") {
            tracing::warn!(%error, "writing the transcript failed");
            self.0 = None;
        }
    }
}

/// A name that stays one path segment.
fn safe(name: &str) -> String {
    let name: String = name
        .chars()
        .map(|character| if character.is_ascii_alphanumeric() || "-_.".contains(character) { character } else { '_' })
        .collect();
    if name.is_empty() || name.starts_with('.') { format!("_{name}") } else { name }
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_stay_one_segment() {
        assert_eq!(super::safe("../x/y"), "_.._x_y");
        assert_eq!(super::safe("step-1"), "step-1");
        assert_eq!(super::safe(""), "_");
    }
}
