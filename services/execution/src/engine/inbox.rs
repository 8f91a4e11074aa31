//! Runs started by inbox messages. Posting a message starts a run of the
//! process the inbox triggers, with every unprocessed message no run has
//! (as its inputs `inbox` and `inbox_messages`), unless a run of it is
//! underway: then the message waits, and the run that ends starts the next
//! one. A run that fails gives its messages back with a note and starts
//! nothing by itself — only a new message (or a restart of the service)
//! does — so a process that keeps failing on a message does not loop. A run
//! its process's budget or throttle refuses leaves the messages waiting,
//! held, with a note saying which limit and how far it is reached (cleared
//! when a run takes them, rewritten when another is refused). A run its
//! throttle holds back is coalesced: the run starts when the throttle
//! allows (after the interval, or when a run underway ends) with every
//! message posted meanwhile. Held messages are tried again when a run of
//! the process ends; messages a run failed on are not.

use std::{
    sync::{Arc, PoisonError},
    time::Duration,
};

use super::{Engine, StartRequest};
use crate::{
    Error, Result,
    domain::inbox::{self, InboxMessage, MessageState},
    store::InboxFilter,
};

/// What starts a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cause {
    /// A message was posted: its process runs if no run of it is underway.
    Posted,
    /// A run ended (or the service started): the next run starts only for
    /// messages no run has tried yet.
    Settled,
}

impl Engine {
    /// Stores a posted message and starts the run it triggers; the ids of
    /// the executions started.
    /// Posts a message and starts the run its inbox triggers, if any: the
    /// message as stored and the runs started. A message posted before (a
    /// retry with the same id) is returned as it is now, with the run that
    /// has or had it.
    pub(crate) async fn post_message(self: &Arc<Self>, message: InboxMessage) -> Result<(InboxMessage, Vec<String>)> {
        let inbox = message.inbox.clone();
        if let Some(existing) = self.store.post_message(message.clone()).await? {
            let run = if existing.claimed_by.is_empty() { &existing.processed_by } else { &existing.claimed_by };
            let runs = if run.is_empty() { Vec::new() } else { vec![run.clone()] };
            return Ok((existing, runs));
        }
        Ok((message, self.trigger_inbox(&inbox, Cause::Posted).await?))
    }

    /// Starts a run of the process `inbox` triggers, if there is one, no run
    /// of it is underway and messages wait (for [`Cause::Settled`], messages
    /// no run has tried).
    pub(crate) async fn trigger_inbox(self: &Arc<Self>, inbox: &str, cause: Cause) -> Result<Vec<String>> {
        let _gate = self.inbox_gate.lock().await;
        let Some(process_name) = self.store.triggered_by(inbox).await? else { return Ok(Vec::new()) };
        if self.store.inbox_busy(inbox).await? {
            return Ok(Vec::new());
        }
        let waiting = self
            .store
            .inbox_messages(&InboxFilter {
                inbox: inbox.to_owned(),
                state: Some(MessageState::Unprocessed),
                unclaimed: true,
                after: None,
                limit: inbox::MESSAGES_PER_RUN as u32,
            })
            .await?;
        if cause == Cause::Settled && waiting.iter().all(|message| inbox::failed_in_a_run(&message.note)) {
            return Ok(Vec::new());
        }
        let messages = inbox::take_for_run(waiting);
        if messages.is_empty() {
            return Ok(Vec::new());
        }
        let Some(process) = self.process(&process_name, None).await? else { return Ok(Vec::new()) };
        let ids: Vec<String> = messages.iter().map(|message| message.id.clone()).collect();
        let started = self
            .start(StartRequest {
                inputs_json: inbox::run_inputs(inbox, &messages),
                lead_agent_id: process.definition.lead.clone().unwrap_or_default(),
                process,
                idempotency_key: None,
                session: None,
                claimed_messages: ids.clone(),
                fired_schedule: None,
            })
            .await;
        let execution = match started {
            Ok(execution) => execution,
            Err(refusal @ Error::BudgetExhausted { .. }) => {
                // The messages wait, saying why; the next message, or the
                // end of a run of the process, tries again.
                tracing::warn!(inbox, process = %process_name, %refusal, "inbox run refused");
                self.store.note_messages(&ids, &inbox::held_note(&refusal)).await?;
                return Ok(Vec::new());
            }
            // A run of another replica took the messages first (the
            // in-process gate above does not hold across replicas): theirs
            // is the run; what is left waits for its end.
            Err(Error::Superseded(reason)) => {
                tracing::debug!(inbox, process = %process_name, %reason, "inbox run superseded");
                return Ok(Vec::new());
            }
            Err(refusal @ Error::Throttled { .. }) => {
                tracing::debug!(inbox, process = %process_name, %refusal, "inbox run throttled");
                self.store.note_messages(&ids, &inbox::held_note(&refusal)).await?;
                if let Error::Throttled { retry_after: Some(delay), .. } = refusal {
                    self.trigger_later(inbox, delay);
                }
                return Ok(Vec::new());
            }
            Err(error) => return Err(error),
        };
        tracing::info!(inbox, execution_id = %execution.id, process = %process_name, "inbox run started");
        Ok(vec![execution.id])
    }

    /// After a restart: every inbox whose messages wait starts its run.
    pub(crate) async fn trigger_waiting_inboxes(self: &Arc<Self>) -> Result<()> {
        for inbox in self.store.trigger_inboxes().await? {
            self.trigger_inbox(&inbox, Cause::Settled).await?;
        }
        Ok(())
    }

    /// [`Engine::trigger_inbox`] after `delay`, once per inbox however many
    /// messages ask for it meanwhile.
    fn trigger_later(self: &Arc<Self>, inbox: &str, delay: Duration) {
        if !self.delayed_triggers.lock().unwrap_or_else(PoisonError::into_inner).insert(inbox.to_owned()) {
            return;
        }
        let (engine, inbox) = (self.clone(), inbox.to_owned());
        self.spawn(async move {
            tokio::time::sleep(delay).await;
            engine.delayed_triggers.lock().unwrap_or_else(PoisonError::into_inner).remove(&inbox);
            if let Err(error) = engine.trigger_inbox(&inbox, Cause::Posted).await {
                tracing::warn!(inbox, %error, "could not start the inbox's throttled run");
            }
        });
    }

    /// [`Engine::trigger_inbox`] in the background: after a run of the
    /// inbox's process ended, or a step posted to it.
    pub(crate) fn spawn_trigger(self: &Arc<Self>, inbox: String, cause: Cause) {
        let engine = self.clone();
        self.spawn(async move {
            if let Err(error) = engine.trigger_inbox(&inbox, cause).await {
                tracing::warn!(inbox, %error, "could not start the inbox's next run");
            }
        });
    }
}
