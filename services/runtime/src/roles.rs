//! The role model at the wire: the one conversion between the format
//! library's [`RoleDefinition`] and `muster.roster.v1.RoleDefinition`, for
//! the services that carry roles (the roster stores and serves them; the
//! execution service runs them and hands them to workers with their steps).

use muster_format::roster::model::{RoleBudget, RoleDefinition, RoleThrottle};
use muster_proto::roster::v1 as pb;

use crate::{
    json::{stored_struct, struct_to_text},
    time::{duration_seconds, seconds_to_duration},
};

/// A field of a role definition on the wire that does not read: its path,
/// and a message that names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidRoleField {
    /// The field's path, such as `role.budget.period`.
    pub field: &'static str,
    /// What is wrong, starting with the path.
    pub message: String,
}

/// A role definition as the wire carries it.
pub fn role_to_wire(role: &RoleDefinition) -> pb::RoleDefinition {
    pb::RoleDefinition {
        name: role.name.clone(),
        description: role.description.clone(),
        goals: role.goals.clone(),
        responsibilities: role.responsibilities.clone(),
        tools: role.tools.clone(),
        permitted_actions: role.permitted_actions.clone(),
        input_schema: stored_struct(&role.input_schema_json),
        output_schema: stored_struct(&role.output_schema_json),
        mission: role.mission.clone(),
        context_files: role.context_files.clone(),
        read_paths: role.read_paths.clone(),
        write_paths: role.write_paths.clone(),
        schedule: role.schedule.clone(),
        inbox: role.inbox.clone(),
        user_preferences: role.user_preferences.clone(),
        post_to_inbox: role.post_to_inbox.clone(),
        budget: role.budget.as_ref().map(|budget| pb::RoleBudget {
            period: (budget.period_seconds > 0).then(|| seconds_to_duration(budget.period_seconds)),
            max_runs: budget.max_runs,
            max_cost: budget.max_cost,
            max_tokens: budget.max_tokens,
            run_max_cost: budget.run_max_cost,
            run_max_tokens: budget.run_max_tokens,
            on_exceed: budget.on_exceed.clone(),
        }),
        throttle: role.throttle.map(|throttle| pb::RoleThrottle {
            min_interval: (throttle.min_interval_seconds > 0)
                .then(|| seconds_to_duration(throttle.min_interval_seconds)),
            max_concurrent: throttle.max_concurrent,
        }),
    }
}

/// A role definition from the wire, its name and budget action trimmed; not
/// yet checked against the model's rules ([`RoleDefinition::normalize`]).
pub fn role_from_wire(role: pb::RoleDefinition) -> Result<RoleDefinition, InvalidRoleField> {
    Ok(RoleDefinition {
        name: role.name.trim().to_owned(),
        description: role.description,
        goals: role.goals,
        responsibilities: role.responsibilities,
        tools: role.tools,
        permitted_actions: role.permitted_actions,
        input_schema_json: json_text("role.input_schema", role.input_schema.as_ref())?,
        output_schema_json: json_text("role.output_schema", role.output_schema.as_ref())?,
        mission: role.mission,
        context_files: role.context_files,
        read_paths: role.read_paths,
        write_paths: role.write_paths,
        schedule: role.schedule,
        inbox: role.inbox,
        user_preferences: role.user_preferences,
        post_to_inbox: role.post_to_inbox,
        budget: role
            .budget
            .map(|budget| {
                Ok::<_, InvalidRoleField>(RoleBudget {
                    period_seconds: seconds("role.budget.period", budget.period.as_ref())?,
                    max_runs: budget.max_runs,
                    max_cost: budget.max_cost,
                    max_tokens: budget.max_tokens,
                    run_max_cost: budget.run_max_cost,
                    run_max_tokens: budget.run_max_tokens,
                    on_exceed: budget.on_exceed.trim().to_owned(),
                })
            })
            .transpose()?,
        throttle: role
            .throttle
            .map(|throttle| {
                Ok::<_, InvalidRoleField>(RoleThrottle {
                    min_interval_seconds: seconds("role.throttle.min_interval", throttle.min_interval.as_ref())?,
                    max_concurrent: throttle.max_concurrent,
                })
            })
            .transpose()?,
    })
}

/// The stored JSON text of a wire object: empty when not set.
fn json_text(field: &'static str, object: Option<&prost_types::Struct>) -> Result<String, InvalidRoleField> {
    match object {
        None => Ok(String::new()),
        Some(object) => struct_to_text(Some(object))
            .map_err(|problem| InvalidRoleField { field, message: format!("{field} {problem}") }),
    }
}

/// Whole seconds of a wire duration; not set is zero.
fn seconds(field: &'static str, duration: Option<&prost_types::Duration>) -> Result<u64, InvalidRoleField> {
    duration_seconds(duration).map_err(|problem| InvalidRoleField { field, message: format!("{field} {problem}") })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn role() -> RoleDefinition {
        RoleDefinition {
            name: "Reviewer".into(),
            description: "reviews".into(),
            goals: vec!["catch bugs".into()],
            tools: vec!["read_file".into()],
            input_schema_json: r#"{"type":"object"}"#.into(),
            schedule: "every day at 9".into(),
            inbox: "reviews".into(),
            post_to_inbox: "done".into(),
            budget: Some(RoleBudget {
                period_seconds: 3600,
                max_runs: 3,
                on_exceed: "pause".into(),
                ..RoleBudget::default()
            }),
            throttle: Some(RoleThrottle { min_interval_seconds: 60, max_concurrent: 2 }),
            ..RoleDefinition::default()
        }
    }

    #[test]
    fn a_role_goes_to_the_wire_and_back_unchanged() {
        let role = role();
        assert_eq!(role_from_wire(role_to_wire(&role)), Ok(role));
    }

    #[test]
    fn a_negative_duration_names_its_field() {
        let mut wire = role_to_wire(&role());
        wire.budget.as_mut().unwrap().period = Some(prost_types::Duration { seconds: -5, nanos: 0 });
        let error = role_from_wire(wire).unwrap_err();
        assert_eq!(error.field, "role.budget.period");
        assert!(error.message.starts_with("role.budget.period "), "{}", error.message);
    }
}
