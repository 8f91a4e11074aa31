//! Inboxes, in SQL: posting (once per idempotency key), listing, archiving,
//! noting, and the processes an inbox triggers.

use muster_runtime::db::placeholder;
use sqlx::{AssertSqlSafe, Row, any::AnyRow};

use super::SqlStore;
use crate::store::{Archived, InboxFilter};
use crate::{
    Result,
    domain::{
        inbox::{InboxMessage, MessageState},
        model::Execution,
    },
};

pub(super) async fn post_message(store: &SqlStore, message: InboxMessage) -> Result<Option<InboxMessage>> {
    let stored = || async {
        let row = sqlx::query("SELECT * FROM inbox_messages WHERE id = $1")
            .bind(message.id.clone())
            .fetch_optional(&store.database.pool)
            .await?;
        row.as_ref().map(message_from_row).transpose()
    };
    if let Some(existing) = stored().await? {
        return Ok(Some(existing));
    }
    let mut transaction = store.database.pool.begin().await?;
    if let Err(error) = insert_message(&mut transaction, &message).await {
        // The same post, retried at once, stored it meanwhile.
        drop(transaction);
        return stored().await?.map(Some).ok_or(error);
    }
    transaction.commit().await?;
    Ok(None)
}

pub(super) async fn inbox_messages<'a>(store: &'a SqlStore, filter: &'a InboxFilter) -> Result<Vec<InboxMessage>> {
    let backend = store.database.backend;
    let mut sql = format!("SELECT * FROM inbox_messages WHERE inbox = {}", placeholder(backend, 1));
    let mut parameter = 1;
    let mut next = || {
        parameter += 1;
        placeholder(backend, parameter)
    };
    match filter.state {
        Some(_) => sql.push_str(&format!(" AND state = {}", next())),
        None => sql.push_str(" AND state <> 'archived'"),
    }
    if filter.unclaimed {
        sql.push_str(" AND claimed_by = ''");
    }
    if filter.after.is_some() {
        let (first, second, third) = (next(), next(), next());
        sql.push_str(&format!(" AND (posted_at > {first} OR (posted_at = {second} AND id > {third}))"));
    }
    sql.push_str(&format!(" ORDER BY posted_at, id LIMIT {}", filter.limit));
    let mut query = sqlx::query(AssertSqlSafe(sql)).bind(filter.inbox.clone());
    if let Some(state) = filter.state {
        query = query.bind(state.as_str());
    }
    if let Some((posted_at, id)) = &filter.after {
        query = query.bind(*posted_at).bind(*posted_at).bind(id.clone());
    }
    let rows = query.fetch_all(&store.database.reads).await?;
    rows.iter().map(message_from_row).collect()
}

pub(super) async fn archive_message<'a>(store: &'a SqlStore, id: &'a str) -> Result<Archived> {
    let mut transaction = store.database.pool.begin().await?;
    sqlx::query("UPDATE inbox_messages SET state = 'archived' WHERE id = $1 AND claimed_by = ''")
        .bind(id.to_owned())
        .execute(&mut *transaction)
        .await?;
    let row = sqlx::query("SELECT * FROM inbox_messages WHERE id = $1")
        .bind(id.to_owned())
        .fetch_optional(&mut *transaction)
        .await?;
    transaction.commit().await?;
    Ok(match row.as_ref().map(message_from_row).transpose()? {
        Some(message) if message.state == MessageState::Archived => Archived::Done(message),
        Some(message) => Archived::Claimed(message),
        None => Archived::NotFound,
    })
}

pub(super) async fn note_messages<'a>(store: &'a SqlStore, ids: &'a [String], note: &'a str) -> Result<()> {
    let note = muster_runtime::status::truncate(note, 1024).into_owned();
    let mut transaction = store.database.pool.begin().await?;
    for id in ids {
        sqlx::query("UPDATE inbox_messages SET note = $1 WHERE id = $2 AND claimed_by = '' AND state = 'unprocessed'")
            .bind(note.clone())
            .bind(id.clone())
            .execute(&mut *transaction)
            .await?;
    }
    transaction.commit().await?;
    Ok(())
}

pub(super) async fn inbox_busy<'a>(store: &'a SqlStore, inbox: &'a str) -> Result<bool> {
    let found = sqlx::query("SELECT 1 AS found FROM inbox_messages WHERE inbox = $1 AND claimed_by <> '' LIMIT 1")
        .bind(inbox.to_owned())
        .fetch_optional(&store.database.pool)
        .await?;
    Ok(found.is_some())
}

pub(super) async fn triggered_by<'a>(store: &'a SqlStore, inbox: &'a str) -> Result<Option<String>> {
    Ok(sqlx::query_scalar::<_, String>(TRIGGERED_BY)
        .bind(inbox.to_owned())
        .bind(String::new())
        .fetch_optional(&store.database.reads)
        .await?)
}

pub(super) async fn trigger_inboxes(store: &SqlStore) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar::<_, String>(
        "SELECT DISTINCT p.trigger_inbox FROM processes p WHERE p.trigger_inbox <> '' \
         AND p.version = (SELECT MAX(q.version) FROM processes q WHERE q.name = p.name) ORDER BY 1",
    )
    .fetch_all(&store.database.reads)
    .await?)
}

/// The latest versions of processes other than `name` that `inbox` triggers.
pub(super) const TRIGGERED_BY: &str = "SELECT p.name FROM processes p WHERE p.trigger_inbox = $1 AND p.name <> $2 \
     AND p.version = (SELECT MAX(q.version) FROM processes q WHERE q.name = p.name) ORDER BY p.name LIMIT 1";

pub(super) async fn insert_message(
    transaction: &mut sqlx::Transaction<'_, sqlx::Any>,
    message: &InboxMessage,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO inbox_messages (id, inbox, sender, priority, subject, body, posted_at, state) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind(message.id.clone())
    .bind(message.inbox.clone())
    .bind(message.sender.clone())
    .bind(message.priority.as_str())
    .bind(message.subject.clone())
    .bind(message.body.clone())
    .bind(message.posted_at)
    .bind(message.state.as_str())
    .execute(&mut **transaction)
    .await?;
    Ok(())
}

/// The messages an ended execution had: processed when it completed, given
/// back for the next run, with a note, otherwise.
/// The statement that settles the inbox messages an execution that ended
/// had claimed, and its first parameter (the second is the execution's id):
/// processed by it when it completed, given back with a note otherwise.
pub(super) fn settle_messages_statement(execution: &Execution) -> (&'static str, String) {
    if execution.status == crate::domain::ExecutionStatus::Completed {
        (
            "UPDATE inbox_messages SET state = 'processed', processed_by = $1, claimed_by = '', note = '' \
             WHERE claimed_by = $2",
            execution.id.clone(),
        )
    } else {
        let note = muster_runtime::status::truncate(
            &format!("run {} {}: {}", execution.id, execution.status.as_str(), execution.reason),
            1024,
        )
        .into_owned();
        ("UPDATE inbox_messages SET claimed_by = '', note = $1 WHERE claimed_by = $2", note)
    }
}

pub(super) async fn settle_messages(
    transaction: &mut sqlx::Transaction<'_, sqlx::Any>,
    execution: &Execution,
) -> Result<()> {
    let (sql, first) = settle_messages_statement(execution);
    sqlx::query(sql).bind(first).bind(execution.id.clone()).execute(&mut **transaction).await?;
    Ok(())
}

fn message_from_row(row: &AnyRow) -> Result<InboxMessage> {
    let priority: String = row.try_get("priority")?;
    let state: String = row.try_get("state")?;
    Ok(InboxMessage {
        id: row.try_get("id")?,
        inbox: row.try_get("inbox")?,
        sender: row.try_get("sender")?,
        priority: priority.parse()?,
        subject: row.try_get("subject")?,
        body: row.try_get("body")?,
        posted_at: row.try_get("posted_at")?,
        state: state.parse()?,
        claimed_by: row.try_get("claimed_by")?,
        processed_by: row.try_get("processed_by")?,
        note: row.try_get("note")?,
    })
}
