//! Process versions, in SQL: publishing (a version's number, its trigger
//! inbox's single owner, the agents it names), reading and listing.

use std::sync::Arc;

use muster_proto::common::v1 as common;
use prost::Message as _;
use sqlx::{Row, any::AnyRow};

use super::inboxes::TRIGGERED_BY;
use super::{SqlStore, participants};
use crate::store::{NewProcess, Published};
use crate::{
    Error, Result,
    domain::model::{Finding, ProcessVersion, Warnings},
    grpc::convert,
};

pub(super) async fn publish_process(store: &SqlStore, process: NewProcess) -> Result<Published> {
    let mut transaction = store.database.pool.begin().await?;
    let latest = sqlx::query("SELECT * FROM processes WHERE name = $1 ORDER BY version DESC LIMIT 1")
        .bind(process.name.clone())
        .fetch_optional(&mut *transaction)
        .await?;
    let latest = latest.as_ref().map(process_from_row).transpose()?;
    if let Some(latest) = latest.filter(|latest| latest.content_hash == process.content_hash) {
        return Ok(Published::Unchanged(latest));
    }
    let version: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(version), 0) + 1 FROM processes WHERE name = $1")
        .bind(process.name.clone())
        .fetch_one(&mut *transaction)
        .await?;
    let inbox = process.definition.triggers.as_ref().and_then(|triggers| triggers.inbox.clone());
    if let Some(inbox) = &inbox
        && let Some(other) = sqlx::query_scalar::<_, String>(TRIGGERED_BY)
            .bind(inbox.clone())
            .bind(process.name.clone())
            .fetch_optional(&mut *transaction)
            .await?
    {
        return Err(Error::precondition(
            "INBOX_TAKEN",
            format!("inbox/{inbox}"),
            format!("inbox '{inbox}' already triggers process '{other}': an inbox triggers one process"),
        ));
    }
    let definition = serde_json::to_string(&*process.definition)
        .map_err(|error| Error::Storage(format!("encoding the definition: {error}")))?;
    sqlx::query(
        "INSERT INTO processes (name, version, source, published_at, step_count, warnings, definition, \
         content_hash, trigger_inbox, agents_listed) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 1)",
    )
    .bind(process.name.clone())
    .bind(version)
    .bind(process.source.clone())
    .bind(process.published_at)
    .bind(process.definition.steps.len() as i64)
    .bind(encode_warnings(&process.warnings))
    .bind(definition)
    .bind(process.content_hash.clone())
    .bind(inbox.unwrap_or_default())
    .execute(&mut *transaction)
    .await?;
    participants::keep_named_agents(&mut transaction, &process.name, version, &process.definition).await?;
    // The schedule follows the latest version; an unchanged cron and
    // time zone keep their due time.
    match process.schedule() {
        Some(schedule) => {
            sqlx::query(
                "INSERT INTO schedules (process_name, cron, time_zone, missed, next_fire_at, last_fired_at, \
                 last_execution_id) VALUES ($1, $2, $3, $4, $5, NULL, '') \
                 ON CONFLICT (process_name) DO UPDATE SET missed = excluded.missed, \
                 next_fire_at = CASE WHEN schedules.cron = excluded.cron \
                 AND schedules.time_zone = excluded.time_zone THEN schedules.next_fire_at \
                 ELSE excluded.next_fire_at END, cron = excluded.cron, time_zone = excluded.time_zone",
            )
            .bind(schedule.process_name)
            .bind(schedule.cron)
            .bind(schedule.time_zone)
            .bind(schedule.missed.as_str())
            .bind(schedule.next_fire_at)
            .execute(&mut *transaction)
            .await?;
        }
        None => {
            sqlx::query("DELETE FROM schedules WHERE process_name = $1")
                .bind(process.name.clone())
                .execute(&mut *transaction)
                .await?;
        }
    }
    transaction.commit().await?;
    Ok(Published::New(ProcessVersion {
        step_count: process.definition.steps.len() as u32,
        name: process.name,
        version: version as u32,
        source: process.source,
        content_hash: process.content_hash,
        published_at: process.published_at,
        warnings: process.warnings,
        definition: process.definition,
    }))
}

pub(super) async fn process(store: &SqlStore, name: &str, version: u32) -> Result<Option<ProcessVersion>> {
    let row = sqlx::query("SELECT * FROM processes WHERE name = $1 AND version = $2")
        .bind(name.to_owned())
        .bind(i64::from(version))
        .fetch_optional(&store.database.reads)
        .await?;
    row.as_ref().map(process_from_row).transpose()
}

pub(super) async fn latest_version(store: &SqlStore, name: &str) -> Result<Option<u32>> {
    let latest: Option<i64> = sqlx::query_scalar("SELECT MAX(version) FROM processes WHERE name = $1")
        .bind(name.to_owned())
        .fetch_one(&store.database.reads)
        .await?;
    Ok(latest.map(|version| version as u32))
}

pub(super) async fn list_processes<'a>(
    store: &'a SqlStore,
    after_name: &'a str,
    limit: u32,
) -> Result<Vec<ProcessVersion>> {
    let rows = sqlx::query(
        "SELECT p.* FROM processes p JOIN (SELECT name, MAX(version) AS version FROM processes \
         WHERE name > $1 GROUP BY name) l ON p.name = l.name AND p.version = l.version \
         ORDER BY p.name LIMIT CAST($2 AS BIGINT)",
    )
    .bind(after_name.to_owned())
    .bind(i64::from(limit))
    .fetch_all(&store.database.reads)
    .await?;
    rows.iter().map(process_from_row).collect()
}

/// A version's warnings are stored as one encoded message of wire
/// diagnostics, with their count (absent, before warnings were counted:
/// all of them are stored).
#[derive(Clone, PartialEq, prost::Message)]
struct StoredDiagnostics {
    #[prost(message, repeated, tag = "1")]
    diagnostics: Vec<common::Diagnostic>,
    #[prost(uint32, tag = "2")]
    count: u32,
}

fn encode_warnings(warnings: &Warnings) -> Vec<u8> {
    StoredDiagnostics {
        diagnostics: warnings.kept.iter().map(convert::finding_to_wire).collect(),
        count: warnings.count,
    }
    .encode_to_vec()
}

fn decode_warnings(bytes: &[u8]) -> Result<Warnings> {
    let stored = StoredDiagnostics::decode(bytes)
        .map_err(|error| Error::Storage(format!("corrupt stored diagnostics: {error}")))?;
    let kept: Vec<Finding> = stored.diagnostics.into_iter().map(convert::finding_from_wire).collect();
    // Versions stored before the count kept every warning.
    Ok(if stored.count == 0 { Warnings::keep(kept) } else { Warnings { kept, count: stored.count } })
}

pub(super) fn process_from_row(row: &AnyRow) -> Result<ProcessVersion> {
    let name: String = row.try_get("name")?;
    let version = row.try_get::<i64, _>("version")? as u32;
    let source: String = row.try_get("source")?;
    let warnings: Vec<u8> = row.try_get("warnings")?;
    let stored: Option<String> = row.try_get("definition")?;
    let definition = match stored {
        Some(json) => serde_json::from_str(&json).map_err(|error| {
            Error::Storage(format!("process {name} version {version}: corrupt definition: {error}"))
        })?,
        // Published before definitions were stored: checked once more, here.
        None => muster_format::validate_process(&source, &muster_format::Context::default())
            .process
            .ok_or_else(|| Error::Storage(format!("process {name} version {version} no longer parses")))?,
    };
    Ok(ProcessVersion {
        content_hash: row.try_get("content_hash")?,
        published_at: row.try_get("published_at")?,
        step_count: row.try_get::<i64, _>("step_count")? as u32,
        warnings: decode_warnings(&warnings)?,
        definition: Arc::new(definition),
        name,
        version,
        source,
    })
}
