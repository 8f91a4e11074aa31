//! Role-based runs: a role of the roster whose definition has a schedule or
//! an inbox runs on its own, as the one-step process `role-<name>` whose
//! step the role's agents take (the roster's `Delegate` chooses one). Every
//! replica of the service follows the roster's role changes and keeps each
//! role's process in step with its definition: publishing an unchanged
//! process stores nothing, so replicas agree. A role that loses its schedule
//! and inbox, or is removed, gets a version that nothing starts. The
//! assignment of a role's run carries the role's definition and the system
//! prompt the roster renders from it (mission, goals, tools, context files,
//! user preferences, the think-first preamble), and the role's memory.

use std::{collections::HashSet, sync::Arc, time::Duration};

use super::Engine;
use crate::{
    Result,
    clients::roster::{RosterChange, RosterClient},
    domain::model::RoleDefinition,
};

/// The prefix of the processes that run roles.
pub(crate) const PREFIX: &str = "role-";
/// How the description of a role's process starts: the service owns the
/// processes whose description starts so, and leaves any other alone.
const MARKER: &str = "Runs of the role";
/// A full comparison with the roster, in case a change was missed.
const RESYNC: Duration = Duration::from_secs(60);

/// The name of the process that runs `role`: `role-` and the role's name
/// in lowercase, with `.` as `-`, cut to 64 characters.
pub(crate) fn process_name(role: &str) -> String {
    let slug: String = role
        .chars()
        .map(|character| match character.to_ascii_lowercase() {
            lower @ ('a'..='z' | '0'..='9' | '_' | '-') => lower,
            _ => '-',
        })
        .collect();
    let mut name = format!("{PREFIX}{slug}");
    name.truncate(64);
    name
}

fn description(role: &str) -> String {
    format!("{MARKER} '{role}', started by its schedule and its inbox; muster keeps it in step with the role")
}

/// The process source of a role's runs; `None` when nothing starts the role
/// (no cron schedule, no inbox).
pub(crate) fn source(role: &RoleDefinition) -> Option<String> {
    // A schedule that cannot be read fires nothing (the validator says so).
    let schedule = muster_format::role_schedule(&role.schedule).ok().flatten();
    let inbox = muster_format::role_inbox_name(&role.inbox).filter(|_| !role.inbox.trim().is_empty());
    if schedule.is_none() && inbox.is_none() {
        return None;
    }
    let mut source = format!(
        "# Kept in step with the role '{name}' of the roster: edit the role, not this.\n\
         name: {process}\ndescription: {description}\ntriggers:\n",
        name = role.name,
        process = process_name(&role.name),
        description = quoted(&description(&role.name)),
    );
    if let Some(schedule) = schedule {
        source.push_str(&format!("  schedule: {}\n", quoted(&schedule.cron)));
        if !schedule.time_zone.is_empty() {
            source.push_str(&format!("  time_zone: {}\n", quoted(&schedule.time_zone)));
        }
    }
    if let Some(inbox) = inbox {
        source.push_str(&format!("  inbox: {inbox}\n"));
    }
    if let Some(budget) = &role.budget {
        let fields = [
            ("period_seconds", budget.period_seconds.to_string(), budget.period_seconds > 0),
            ("max_runs", budget.max_runs.to_string(), budget.max_runs > 0),
            ("max_cost", budget.max_cost.to_string(), budget.max_cost > 0.0),
            ("max_tokens", budget.max_tokens.to_string(), budget.max_tokens > 0),
            ("run_max_cost", budget.run_max_cost.to_string(), budget.run_max_cost > 0.0),
            ("run_max_tokens", budget.run_max_tokens.to_string(), budget.run_max_tokens > 0),
            ("on_exceed", budget.on_exceed.clone(), !budget.on_exceed.is_empty()),
        ];
        source.push_str(&mapping("budget", &fields));
    }
    if let Some(throttle) = &role.throttle {
        let fields = [
            ("min_interval_seconds", throttle.min_interval_seconds.to_string(), throttle.min_interval_seconds > 0),
            ("max_concurrent", throttle.max_concurrent.to_string(), throttle.max_concurrent > 0),
        ];
        source.push_str(&mapping("throttle", &fields));
    }
    source.push_str(&step(&role.name, &role.post_to_inbox));
    Some(source)
}

/// A mapping of the fields that are set; nothing when none is.
fn mapping(key: &str, fields: &[(&str, String, bool)]) -> String {
    let set: String =
        fields.iter().filter(|(_, _, set)| *set).map(|(field, value, _)| format!("  {field}: {value}\n")).collect();
    if set.is_empty() { set } else { format!("{key}:\n{set}") }
}

/// The source of a role's process that nothing starts any more.
fn retired_source(process: &str, role: &str) -> String {
    format!(
        "# The role '{role}' has no schedule or inbox now (or is gone): nothing starts this.\n\
         name: {process}\ndescription: {}\n{}",
        quoted(&description(role)),
        step(role, ""),
    )
}

/// Text as a YAML double-quoted scalar (a JSON string is one).
fn quoted(text: &str) -> String {
    serde_json::Value::from(text).to_string()
}

fn step(role: &str, post_to_inbox: &str) -> String {
    let mut step = format!(
        "steps:\n  - id: run\n    name: {name}\n    type: agent_task\n    delegate:\n      role: {role}\n    \
         message: {message}\n",
        name = quoted(role),
        role = quoted(role),
        message = quoted(&format!(
            "Run as the {role} role: think first, then do what needs attention now \
             (your mission, goals and tools are in your system prompt; inbox messages are in your inputs)."
        )),
    );
    if !post_to_inbox.trim().is_empty() {
        step.push_str(&format!("    post_to_inbox: {}\n", post_to_inbox.trim()));
    }
    step
}

impl Engine {
    /// Follows the roster's role changes until the engine stops, comparing
    /// every role with its process at each (re)connection and every minute;
    /// any change of an agent or a role also forgets the agents' contexts
    /// kept for assignments.
    pub(crate) async fn follow_roles(self: Arc<Self>, roster: Arc<RosterClient>) {
        loop {
            let mut changes = match roster.watch().await {
                Ok(changes) => changes,
                Err(failure) => {
                    tracing::warn!(error = %failure.message(), "cannot follow the roster's roles; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            // Watching first: a change made during the comparison is still seen.
            self.contexts.following(true);
            let mut resync = tokio::time::interval(RESYNC);
            loop {
                tokio::select! {
                    _ = resync.tick() => {
                        if let Err(error) = self.sync_roles(&roster).await {
                            tracing::warn!(%error, "could not keep the roles' processes in step");
                        }
                    }
                    change = changes.next() => match change {
                        Some(change) => {
                            // Every change watched is of an agent or a role.
                            self.contexts.forget();
                            self.role_changed(change).await;
                        }
                        None => break,
                    },
                }
            }
            self.contexts.following(false);
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    async fn role_changed(&self, change: RosterChange) {
        let (role, outcome) = match change {
            RosterChange::RoleUpserted(role) => (role.name.clone(), self.sync_role(&role).await),
            RosterChange::RoleRemoved(role) => {
                let outcome = self.retire_role(&role).await;
                (role, outcome)
            }
            RosterChange::Other => return,
        };
        if let Err(error) = outcome {
            tracing::warn!(%role, %error, "could not keep the role's process in step");
        }
    }

    /// Compares every role with its process, and retires the processes of
    /// roles that are gone.
    pub(crate) async fn sync_roles(&self, roster: &RosterClient) -> Result<()> {
        let roles = roster
            .roles()
            .await
            .map_err(|failure| crate::Error::Unavailable { service: "roster", detail: failure.message().to_owned() })?;
        let mut kept = HashSet::with_capacity(roles.len());
        for role in &roles {
            kept.insert(process_name(&role.name));
            if let Err(error) = self.sync_role(role).await {
                tracing::warn!(role = %role.name, %error, "could not keep the role's process in step");
            }
        }
        let mut after = PREFIX.to_owned();
        'pages: loop {
            let page = self.store.list_processes(&after, 100).await?;
            let Some(last) = page.last() else { break };
            after = last.name.clone();
            for process in &page {
                if !process.name.starts_with(PREFIX) {
                    break 'pages;
                }
                if !kept.contains(&process.name)
                    && let Some(role) = owned_role(&process.definition.description)
                {
                    self.retire_role(&role).await?;
                }
            }
        }
        Ok(())
    }

    /// Publishes the process of a role (or retires it when nothing starts
    /// the role any more).
    async fn sync_role(&self, role: &RoleDefinition) -> Result<()> {
        let Some(source) = source(role) else { return self.retire_role(&role.name).await };
        let name = process_name(&role.name);
        if !self.owns(&name, &role.name).await? {
            return Ok(());
        }
        let (process, new) = self.publish(source).await?;
        if new {
            tracing::info!(role = %role.name, process = %process.name, version = process.version, "role runs on its own");
        }
        Ok(())
    }

    /// Gives a role's process a version that nothing starts, unless it has
    /// one already.
    async fn retire_role(&self, role: &str) -> Result<()> {
        let name = process_name(role);
        let Some(latest) = self.process(&name, None).await? else { return Ok(()) };
        if latest.definition.triggers.is_none() || !self.owns(&name, role).await? {
            return Ok(());
        }
        // The role may be gone: its reference is not checked.
        let (process, _) = self.publish_checked(retired_source(&name, role), muster_format::Context::default()).await?;
        tracing::info!(role, process = %process.name, version = process.version, "role no longer runs on its own");
        Ok(())
    }

    /// Whether the process `name` is free or runs `role`; a process of that
    /// name that a person published, or that runs another role, is left
    /// alone (and said so).
    async fn owns(&self, name: &str, role: &str) -> Result<bool> {
        let Some(latest) = self.process(name, None).await? else { return Ok(true) };
        match owned_role(&latest.definition.description) {
            Some(owner) if owner == role => Ok(true),
            _ => {
                tracing::warn!(
                    role,
                    process = name,
                    "the role has a schedule or an inbox, but a process of its name exists: rename one of them"
                );
                Ok(false)
            }
        }
    }
}

/// The role a process description says the process runs.
pub(crate) fn owned_role(description: &str) -> Option<String> {
    let rest = description.strip_prefix(MARKER)?.strip_prefix(" '")?;
    Some(rest.split_once("', started by")?.0.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    use muster_format::roster::model::{RoleBudget, RoleThrottle};

    fn role() -> RoleDefinition {
        RoleDefinition {
            name: "Delivery.Manager".into(),
            schedule: "9am and 5pm, weekdays: `0 9,17 * * 1-5`".into(),
            inbox: "agent/inbox/delivery/".into(),
            post_to_inbox: "risk".into(),
            budget: Some(RoleBudget {
                period_seconds: 3600,
                max_runs: 5,
                run_max_cost: 0.5,
                on_exceed: "pause".into(),
                ..RoleBudget::default()
            }),
            throttle: Some(RoleThrottle { min_interval_seconds: 60, max_concurrent: 0 }),
            ..RoleDefinition::default()
        }
    }

    #[test]
    fn a_role_with_a_schedule_and_an_inbox_becomes_a_valid_one_step_process() {
        let source = source(&role()).expect("the role is started by something");
        let report = muster_format::validate_process(&source, &muster_format::Context::default());
        let process = report.process.unwrap_or_else(|| panic!("{source}\n{:?}", report.diagnostics));
        assert_eq!(process.name, "role-delivery-manager");
        let triggers = process.triggers.expect("triggers");
        assert_eq!(triggers.schedule.as_deref(), Some("0 9,17 * * 1-5"));
        assert_eq!(triggers.inbox.as_deref(), Some("delivery"));
        let [step] = process.steps.as_slice() else { panic!("one step: {:?}", process.steps) };
        assert_eq!(step.delegate.as_ref().and_then(|delegate| delegate.role.as_deref()), Some("Delivery.Manager"));
        assert_eq!(step.post_to_inbox.as_deref(), Some("risk"));
        let budget = process.budget.expect("the role's budget");
        assert_eq!((budget.period_seconds, budget.max_runs, budget.run_max_cost), (3600, 5, 0.5));
        assert_eq!((budget.max_cost, budget.max_tokens, budget.on_exceed.as_str()), (0.0, 0, "pause"));
        let throttle = process.throttle.expect("the role's throttle");
        assert_eq!((throttle.min_interval_seconds, throttle.max_concurrent), (60, 0));
        assert_eq!(owned_role(&process.description).as_deref(), Some("Delivery.Manager"));
    }

    #[test]
    fn a_role_nothing_starts_has_no_process_and_a_retired_one_has_no_triggers() {
        let quiet = RoleDefinition { schedule: "twice a day".into(), inbox: String::new(), ..role() };
        assert_eq!(source(&quiet), None);
        let retired = retired_source("role-delivery-manager", "Delivery.Manager");
        let process = muster_format::validate_process(&retired, &muster_format::Context::default())
            .process
            .expect("a valid process");
        assert_eq!(process.triggers, None);
        assert_eq!(owned_role(&process.description).as_deref(), Some("Delivery.Manager"));
    }

    #[test]
    fn process_names_are_identifiers_of_at_most_64_characters() {
        assert_eq!(process_name("Risk"), "role-risk");
        let long = process_name(&"R".repeat(64));
        assert_eq!(long.len(), 64);
        assert!(muster_format::is_identifier(&long));
        assert_eq!(owned_role("Runs of a person's choosing"), None);
    }
}
