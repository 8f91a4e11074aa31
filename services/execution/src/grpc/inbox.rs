//! Inboxes on the wire: posting (which starts the run the inbox triggers,
//! see `engine::inbox`), listing page by page, and archiving.

use muster_proto::execution::v1 as wire;
use muster_runtime::{auth::Caller, time::to_timestamp};

use super::{
    ExecutionGrpc,
    access::denied,
    keyed_id,
    paging::{page_size, time_and_id},
};
use crate::{
    Error, Result,
    domain::inbox::{InboxMessage, MessageState, Priority},
    store::{Archived, InboxFilter},
};

/// A page of messages also ends after this many bytes.
const PAGE_BYTES: usize = 1024 * 1024;
/// Longest subject, in bytes.
const MAX_SUBJECT_BYTES: usize = 1024;

fn check_inbox_name(inbox: &str) -> Result<()> {
    if muster_format::is_identifier(inbox) {
        Ok(())
    } else {
        Err(Error::invalid(
            "inbox",
            format!(
                "inbox '{}' must match [a-z0-9][a-z0-9_-]* and be at most 64 characters",
                muster_runtime::status::truncate(inbox, 128)
            ),
        ))
    }
}

fn priority_from_wire(priority: i32) -> Result<Priority> {
    match wire::MessagePriority::try_from(priority) {
        Ok(wire::MessagePriority::Unspecified | wire::MessagePriority::Normal) => Ok(Priority::Normal),
        Ok(wire::MessagePriority::Low) => Ok(Priority::Low),
        Ok(wire::MessagePriority::High) => Ok(Priority::High),
        Err(_) => Err(Error::invalid("priority", format!("priority {priority} is not a MessagePriority"))),
    }
}

fn state_from_wire(state: i32) -> Result<Option<MessageState>> {
    match wire::MessageState::try_from(state) {
        Ok(wire::MessageState::Unspecified) => Ok(None),
        Ok(wire::MessageState::Unprocessed) => Ok(Some(MessageState::Unprocessed)),
        Ok(wire::MessageState::Processed) => Ok(Some(MessageState::Processed)),
        Ok(wire::MessageState::Archived) => Ok(Some(MessageState::Archived)),
        Err(_) => Err(Error::invalid("state", format!("state {state} is not a MessageState"))),
    }
}

pub(super) fn message_to_wire(message: &InboxMessage) -> wire::InboxMessage {
    wire::InboxMessage {
        id: message.id.clone(),
        inbox: message.inbox.clone(),
        sender: message.sender.clone(),
        priority: match message.priority {
            Priority::Low => wire::MessagePriority::Low,
            Priority::Normal => wire::MessagePriority::Normal,
            Priority::High => wire::MessagePriority::High,
        } as i32,
        body: message.body.clone(),
        posted_at: Some(to_timestamp(message.posted_at)),
        state: match message.state {
            MessageState::Unprocessed => wire::MessageState::Unprocessed,
            MessageState::Processed => wire::MessageState::Processed,
            MessageState::Archived => wire::MessageState::Archived,
        } as i32,
        processed_by_execution_id: message.processed_by.clone(),
        subject: message.subject.clone(),
        claimed_by_execution_id: message.claimed_by.clone(),
        note: message.note.clone(),
    }
}

impl ExecutionGrpc {
    pub(super) async fn post(
        &self,
        caller: &Caller,
        request: wire::PostToInboxRequest,
    ) -> Result<wire::PostToInboxResponse> {
        check_inbox_name(&request.inbox)?;
        if request.body.trim().is_empty() {
            return Err(Error::invalid("body", "body is empty: a message needs one"));
        }
        if request.subject.len() > MAX_SUBJECT_BYTES {
            return Err(Error::invalid(
                "subject",
                format!("subject has {} bytes; at most {MAX_SUBJECT_BYTES} are accepted", request.subject.len()),
            ));
        }
        let sender = match caller {
            Caller::Agent { id, .. } if request.sender.is_empty() || request.sender == **id => id.to_string(),
            Caller::Agent { id, .. } => {
                return Err(denied(
                    caller,
                    format!("post to inbox '{}' as '{}'", request.inbox, request.sender),
                    "NOT_THE_SENDER",
                    format!("an agent posts as itself ('{id}')"),
                    vec![("inbox", request.inbox.clone())],
                ));
            }
            _ if !request.sender.is_empty() => request.sender,
            Caller::Operator { name } | Caller::Service { name } => name.to_string(),
        };
        let key = Self::idempotency_key(request.idempotency_key)?;
        let message = InboxMessage {
            id: match &key {
                Some(key) => keyed_id("inbox", &sender, key),
                None => uuid::Uuid::now_v7().to_string(),
            },
            inbox: request.inbox,
            sender,
            priority: priority_from_wire(request.priority)?,
            subject: request.subject,
            body: request.body,
            posted_at: muster_runtime::time::now_millis(),
            state: MessageState::Unprocessed,
            claimed_by: String::new(),
            processed_by: String::new(),
            note: String::new(),
        };
        let (message, triggered_execution_ids) = self.engine.post_message(message).await?;
        let mut answer = message_to_wire(&message);
        if let Some(execution_id) = triggered_execution_ids.first() {
            answer.claimed_by_execution_id = execution_id.clone();
        }
        Ok(wire::PostToInboxResponse { message: Some(answer), triggered_execution_ids })
    }

    pub(super) async fn list_inbox(
        &self,
        caller: &Caller,
        request: wire::ListInboxMessagesRequest,
    ) -> Result<wire::ListInboxMessagesResponse> {
        check_inbox_name(&request.inbox)?;
        if let Some(agent_id) = caller.agent_id() {
            self.require_inbox_reader(caller, agent_id, &request.inbox).await?;
        }
        let after = time_and_id(&request.page_token)?;
        let limit = page_size(request.page_size);
        let filter = InboxFilter {
            inbox: request.inbox,
            state: state_from_wire(request.state)?,
            unclaimed: false,
            after,
            limit: limit + 1,
        };
        let mut found = self.engine.store.inbox_messages(&filter).await?;
        let more = found.len() > limit as usize;
        found.truncate(limit as usize);
        let mut messages = Vec::with_capacity(found.len());
        let mut bytes = 0;
        for message in &found {
            let wire = message_to_wire(message);
            bytes += prost::Message::encoded_len(&wire);
            messages.push(wire);
            if bytes >= PAGE_BYTES {
                break;
            }
        }
        let next_page_token = match found.get(messages.len().saturating_sub(1)) {
            Some(last) if more || messages.len() < found.len() => format!("{}/{}", last.posted_at, last.id),
            _ => String::new(),
        };
        Ok(wire::ListInboxMessagesResponse { messages, next_page_token })
    }

    /// An agent reads an inbox when the process it triggers names the agent.
    async fn require_inbox_reader(&self, caller: &Caller, agent_id: &str, inbox: &str) -> Result<()> {
        if let Some(name) = self.engine.store.triggered_by(inbox).await?
            && let Some(process) = self.engine.process(&name, None).await?
            && (process.definition.lead.as_deref() == Some(agent_id) || process.names(agent_id))
        {
            return Ok(());
        }
        Err(denied(
            caller,
            format!("read inbox '{inbox}'"),
            "NOT_A_PARTICIPANT",
            "the process the inbox triggers does not name it".to_owned(),
            vec![("inbox", inbox.to_owned())],
        ))
    }

    pub(super) async fn archive(
        &self,
        request: wire::ArchiveInboxMessageRequest,
    ) -> Result<wire::ArchiveInboxMessageResponse> {
        match self.engine.store.archive_message(&request.id).await? {
            Archived::Done(message) => {
                Ok(wire::ArchiveInboxMessageResponse { message: Some(message_to_wire(&message)) })
            }
            Archived::Claimed(message) => Err(Error::precondition(
                "MESSAGE_CLAIMED",
                format!("message/{}", message.id),
                format!(
                    "message '{}' is being processed by execution '{}'; archive it when the run ends",
                    message.id, message.claimed_by
                ),
            )),
            Archived::NotFound => Err(Error::not_found(
                "muster.execution.v1.InboxMessage",
                &request.id,
                format!("inbox message '{}' not found", request.id),
            )),
        }
    }
}
