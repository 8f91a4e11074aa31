//! Processes and what runs remember: publishing a version (checked against
//! the roster), the versions kept parsed in memory, and the memory an
//! assignment carries.

use std::{
    sync::{Arc, PoisonError},
    time::Duration,
};

use sha2::Digest as _;

use super::Engine;
use crate::{
    Error, Result,
    clients::roster::RosterFailure,
    domain::model::{Execution, Finding, ProcessVersion, Warnings},
    store::{NewProcess, Published},
};

impl Engine {
    /// Checks a process (with the roster's agents and roles as context) and
    /// stores it as a new version, unless its latest version has the same
    /// source; returns the version and whether it is new.
    pub(crate) async fn publish(&self, source: String) -> Result<(Arc<ProcessVersion>, bool)> {
        let context = self.roster.validation_context().await.map_err(|failure| match failure {
            RosterFailure::Unavailable(detail) => Error::Unavailable { service: "roster", detail },
            other => Error::precondition("ROSTER_REFUSED", "roster", format!("the roster: {}", other.message())),
        })?;
        self.publish_checked(source, context).await
    }

    /// [`Engine::publish`], checking references against `context` (an empty
    /// one checks none).
    pub(crate) async fn publish_checked(
        &self,
        source: String,
        context: muster_format::Context,
    ) -> Result<(Arc<ProcessVersion>, bool)> {
        let checked_source = source.clone();
        let report = tokio::task::spawn_blocking(move || muster_format::validate_process(&checked_source, &context))
            .await
            .map_err(|error| Error::Storage(format!("validation stopped: {error}")))?;
        let findings: Vec<Finding> = report.diagnostics.iter().map(Finding::from).collect();
        let Some(definition) = report.process else {
            return Err(Error::InvalidProcess(findings));
        };
        let published = self
            .store
            .publish_process(NewProcess {
                name: definition.name.clone(),
                content_hash: hex::encode(sha2::Sha256::digest(source.as_bytes())),
                source,
                published_at: muster_runtime::time::now_millis(),
                warnings: Warnings::keep(findings),
                definition: Arc::new(definition),
            })
            .await?;
        let (version, new) = match published {
            Published::New(version) => (version, true),
            Published::Unchanged(version) => (version, false),
        };
        Ok((self.remember(version), new))
    }

    fn remember(&self, version: ProcessVersion) -> Arc<ProcessVersion> {
        let version = Arc::new(version);
        let mut processes = self.processes.lock().unwrap_or_else(PoisonError::into_inner);
        if processes.len() >= PROCESSES_KEPT {
            processes.clear();
        }
        processes.insert((version.name.clone(), version.version), version.clone());
        version
    }

    /// What an agent of `role` (empty: none) remembers: the global memory's
    /// newest entries, then the role's, within an assignment's room, with
    /// the version of the memories they are no newer than (read first). A
    /// store that fails is asked again until it answers.
    pub(crate) async fn recall(&self, role: &str) -> (i64, Vec<crate::domain::memory::MemoryEntry>) {
        use crate::domain::memory::{ASSIGNMENT_ENTRIES, within_assignment};
        loop {
            let read = async {
                let version = self.store.memory_version(role).await?;
                let global = self.store.memory("", None, ASSIGNMENT_ENTRIES).await?;
                let own = if role.is_empty() {
                    Vec::new()
                } else {
                    self.store.memory(role, None, ASSIGNMENT_ENTRIES).await?
                };
                Ok::<_, Error>((version, within_assignment([global, own])))
            };
            match read.await {
                Ok(memory) => return memory,
                Err(error) => {
                    tracing::warn!(%error, "reading the memory for an assignment failed; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }

    /// What an agent of `role` remembers, read again only if the memories'
    /// version moved from `known`: `None` when it did not.
    pub(crate) async fn recall_if_changed(
        &self,
        role: &str,
        known: i64,
    ) -> Option<(i64, Vec<crate::domain::memory::MemoryEntry>)> {
        match self.store.memory_version(role).await {
            Ok(version) if version == known => None,
            _ => Some(self.recall(role).await),
        }
    }

    /// A published version (`None`: the latest), from memory once read.
    /// A version is never changed once published: the latest is asked for
    /// by its number alone, and each version parsed once.
    pub(crate) async fn process(&self, name: &str, version: Option<u32>) -> Result<Option<Arc<ProcessVersion>>> {
        let version = match version {
            Some(version) => version,
            None => match self.store.latest_version(name).await? {
                Some(latest) => latest,
                None => return Ok(None),
            },
        };
        if let Some(found) =
            self.processes.lock().unwrap_or_else(PoisonError::into_inner).get(&(name.to_owned(), version))
        {
            return Ok(Some(found.clone()));
        }
        Ok(self.store.process(name, version).await?.map(|version| self.remember(version)))
    }

    /// The definition an execution runs.
    pub(crate) async fn definition_of(&self, execution: &Execution) -> Result<Arc<ProcessVersion>> {
        self.process(&execution.process_name, Some(execution.process_version)).await?.ok_or_else(|| {
            Error::Storage(format!(
                "version {} of process '{}' is missing",
                execution.process_version, execution.process_name
            ))
        })
    }
}

/// Most published versions kept parsed in memory.
const PROCESSES_KEPT: usize = 256;
