//! Process versions: publishing one (validated, idempotent on its content)
//! and listing them.

use muster_proto::execution::v1 as wire;

use super::convert::{Shown, process_to_wire};
use super::{
    ExecutionGrpc,
    paging::{key_token, page_size},
};
use crate::{Error, Result};

impl ExecutionGrpc {
    pub(super) async fn publish(&self, request: wire::PublishProcessRequest) -> Result<wire::PublishProcessResponse> {
        if request.source.trim().is_empty() {
            return Err(Error::invalid("source", "source is empty: send the process YAML"));
        }
        if request.source.len() > MAX_SOURCE_BYTES {
            return Err(Error::invalid(
                "source",
                format!("source has {} bytes; at most {MAX_SOURCE_BYTES} are accepted", request.source.len()),
            ));
        }
        let (process, new) = self.engine.publish(request.source).await?;
        if new {
            tracing::info!(process = %process.name, version = process.version, "process published");
        }
        let process = process_to_wire(&process, Shown::Warnings);
        Ok(wire::PublishProcessResponse {
            diagnostics: process.warnings.clone(),
            process: Some(process),
            unchanged: !new,
        })
    }

    pub(super) async fn list_processes(
        &self,
        request: wire::ListProcessesRequest,
    ) -> Result<wire::ListProcessesResponse> {
        key_token(&request.page_token)?;
        let limit = page_size(request.page_size);
        let mut processes = self.engine.store.list_processes(&request.page_token, limit + 1).await?;
        let next_page_token = if processes.len() > limit as usize {
            processes.truncate(limit as usize);
            processes.last().map(|last| last.name.clone()).unwrap_or_default()
        } else {
            String::new()
        };
        Ok(wire::ListProcessesResponse {
            processes: processes.iter().map(|process| process_to_wire(process, Shown::Count)).collect(),
            next_page_token,
        })
    }
}

/// Longest source of a process accepted for publishing, in bytes: 64 KiB
/// under the default message limit leaves room, in GetProcess's answer,
/// for the version's kept warnings beside its source.
pub(super) const MAX_SOURCE_BYTES: usize = 4 * 1024 * 1024 - 64 * 1024;
