//! Memory on the wire: reading a memory page by page, and the operators'
//! entries (workers add theirs with a step's result).

use muster_proto::execution::v1 as wire;
use muster_runtime::auth::Caller;

use super::{
    ExecutionGrpc, MAX_ROLE_BYTES,
    access::denied,
    is_role_name,
    paging::{page_size, time_and_id},
};
use crate::{
    Error, Result,
    domain::memory::{self, MemoryEntry},
    grpc::convert::memory_entry_to_wire,
};

/// The memory a request names: the role (empty for the global memory).
fn memory_of(scope: i32, role: &str) -> Result<String> {
    match wire::MemoryScope::try_from(scope) {
        Ok(wire::MemoryScope::Global) if role.is_empty() => Ok(String::new()),
        Ok(wire::MemoryScope::Global) => Err(Error::invalid("role", "role must be empty for MEMORY_SCOPE_GLOBAL")),
        Ok(wire::MemoryScope::Role) => {
            if is_role_name(role) {
                Ok(role.to_owned())
            } else {
                Err(Error::invalid(
                    "role",
                    format!(
                        "role '{}' is not a role name (1 to {MAX_ROLE_BYTES} letters, digits, '-', '_', '.')",
                        muster_runtime::status::truncate(role, 128)
                    ),
                ))
            }
        }
        _ => Err(Error::invalid("scope", "scope must be MEMORY_SCOPE_GLOBAL or MEMORY_SCOPE_ROLE")),
    }
}

impl ExecutionGrpc {
    pub(super) async fn list_memory(
        &self,
        caller: &Caller,
        request: wire::ListMemoryRequest,
    ) -> Result<wire::ListMemoryResponse> {
        let role = memory_of(request.scope, &request.role)?;
        // An agent reads the global memory and its own role's.
        if let Some(agent_id) = caller.agent_id()
            && !role.is_empty()
        {
            let agent = self.roster_agent(agent_id, "the caller").await?;
            if agent.role != role {
                return Err(denied(
                    caller,
                    format!("read the memory of role '{role}'"),
                    "NOT_ITS_ROLE",
                    format!("agent '{agent_id}' holds role '{}', not '{role}'", agent.role),
                    vec![("role", role)],
                ));
            }
        }
        let before = time_and_id(&request.page_token)?;
        let limit = page_size(request.page_size);
        let mut entries = self.engine.store.memory(&role, before.as_ref(), limit + 1).await?;
        let more = entries.len() > limit as usize;
        entries.truncate(limit as usize);
        let next_page_token = match entries.last() {
            Some(last) if more => format!("{}/{}", last.created_at, last.id),
            _ => String::new(),
        };
        Ok(wire::ListMemoryResponse { entries: entries.iter().map(memory_entry_to_wire).collect(), next_page_token })
    }

    pub(super) async fn append_memory(
        &self,
        caller: &Caller,
        request: wire::AppendMemoryRequest,
    ) -> Result<wire::AppendMemoryResponse> {
        let role = memory_of(request.scope, &request.role)?;
        memory::check_text(&request.text).map_err(|why| Error::invalid("text", format!("text {why}")))?;
        let author = caller.to_string();
        let mut entry = MemoryEntry::new(&role, &request.text, &author, "", muster_runtime::time::now_millis());
        if let Some(key) = Self::idempotency_key(request.idempotency_key)? {
            entry.id = super::keyed_id("memory", &author, &key);
        }
        let entry = self.engine.store.append_memory(entry).await?;
        tracing::info!(role = %role, %caller, "memory entry added");
        Ok(wire::AppendMemoryResponse { entry: Some(memory_entry_to_wire(&entry)) })
    }

    pub(super) async fn forget_memory(&self, request: wire::ForgetMemoryRequest) -> Result<wire::ForgetMemoryResponse> {
        if request.id.is_empty() || request.id.len() > 64 {
            return Err(Error::invalid("id", "id must be a memory entry's id"));
        }
        if !self.engine.store.forget_memory(&request.id).await? {
            return Err(Error::not_found(
                "muster.execution.v1.MemoryEntry",
                &request.id,
                format!("memory entry '{}' not found", request.id),
            ));
        }
        Ok(wire::ForgetMemoryResponse {})
    }
}
