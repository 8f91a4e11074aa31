//! Who may do what in an execution: the permission matrix, the role an agent
//! holds, and the check every agent action of a team session passes:
//!
//! 1. is the agent assigned (the session's lead, or a participant)?
//! 2. what is its role (`lead` for the lead, else its assignment)?
//! 3. does that role permit the action?
//!
//! Outside sessions the first check does not apply and the role is the
//! agent's roster role (`lead` for the execution's lead). A roster role that
//! lists its `actions` binds there first: an action it does not list is
//! refused, as publishing refuses a step declaring one. Then the matrix
//! governs only the roles it names: an agent whose roster role is not one of
//! them is not restricted by it, and the step's roles (executor, monitors)
//! alone decide what it may do. The matrix in force is versioned; every
//! verdict says which version decided it.

use std::collections::BTreeMap;

/// The matrix muster starts with (version 1).
pub const DEFAULT_MATRIX: &str = include_str!("../../default-permission-matrix.yaml");

/// The role of a session's lead.
pub const LEAD_ROLE: &str = "lead";

/// One role of the matrix, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatrixRole {
    pub name: String,
    pub permitted_actions: Vec<String>,
    pub forbidden_actions: Vec<String>,
}

/// A stored version of the permission matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct Matrix {
    pub version: u32,
    pub source: String,
    pub roles: Vec<MatrixRole>,
    pub created_at: i64,
    pub created_by: String,
}

impl Matrix {
    /// Reads a matrix document; its diagnostics when it has errors.
    pub fn parse(
        version: u32,
        source: String,
        created_at: i64,
        created_by: String,
    ) -> Result<(Self, Vec<muster_format::Diagnostic>), Vec<muster_format::Diagnostic>> {
        let report = muster_format::validate_permission_matrix(&source);
        if !report.is_valid() {
            return Err(report.diagnostics);
        }
        let roles = report
            .roles
            .into_iter()
            .map(|role| MatrixRole {
                name: role.name,
                permitted_actions: role.permitted_actions,
                forbidden_actions: role.forbidden_actions,
            })
            .collect();
        Ok((Self { version, source, roles, created_at, created_by }, report.diagnostics))
    }

    /// The role of the matrix named `name`.
    pub fn role(&self, name: &str) -> Option<&MatrixRole> {
        self.roles.iter().find(|role| role.name == name)
    }
}

/// An agent's role and subtask in a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleAssignment {
    pub agent_id: String,
    pub role: String,
    pub subtask: String,
    /// `operator:<name>` or the assigning lead's id.
    pub assigned_by: String,
    pub assigned_at: i64,
}

/// The session side of an execution.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Session {
    pub title: String,
    pub description: String,
    /// By agent id.
    pub assignments: BTreeMap<String, RoleAssignment>,
    /// Subtasks asked of the lead, by id (ids grow with time).
    pub subtasks: BTreeMap<String, SubtaskRequest>,
}

/// Most subtask requests a session keeps.
pub const MAX_SUBTASK_REQUESTS: usize = 100;

/// A subtask asked of the lead, and its decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubtaskRequest {
    pub id: String,
    pub requested_by: String,
    /// The agent that would do it.
    pub agent_id: String,
    pub role: String,
    pub subtask: String,
    pub reason: String,
    pub status: SubtaskStatus,
    /// `operator:<name>` or the lead's id; empty while pending.
    pub decided_by: String,
    pub note: String,
    pub requested_at: i64,
    /// 0 while pending.
    pub decided_at: i64,
}

/// Where a subtask request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubtaskStatus {
    Pending,
    Approved,
    Rejected,
}

impl SubtaskStatus {
    /// As stored.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Approved => "approved",
            Self::Rejected => "rejected",
        }
    }

    /// The status stored as `text`.
    pub fn parse(text: &str) -> Option<Self> {
        [Self::Pending, Self::Approved, Self::Rejected].into_iter().find(|status| status.as_str() == text)
    }
}

/// Which check decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    NotAssigned,
    UnknownRole,
    Action,
    /// Outside sessions, a role the matrix does not name: it does not apply.
    NotGoverned,
    /// Outside sessions, the actions the agent's roster role lists.
    RosterRole,
}

impl Check {
    /// The `ErrorInfo` reason of a refusal by this check.
    pub fn reason(self) -> &'static str {
        match self {
            Self::NotAssigned => "NOT_ASSIGNED",
            Self::UnknownRole => "UNKNOWN_ROLE",
            Self::Action => "ROLE_FORBIDS_ACTION",
            Self::NotGoverned => "NOT_GOVERNED",
            Self::RosterRole => "ROSTER_ROLE_FORBIDS_ACTION",
        }
    }
}

/// What the checks found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub allowed: bool,
    /// The role that applied; empty when none did.
    pub role: String,
    pub check: Check,
    /// For people: which check decided and what it found.
    pub reason: String,
    pub matrix_version: u32,
}

/// Who is asking, where: what the checks need to know.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    pub agent_id: &'a str,
    /// The agent's roster role (used outside sessions).
    pub roster_role: &'a str,
    /// The actions the roster role lists, when it lists any (outside
    /// sessions they bind the agent acting in its roster role); `None`
    /// when it lists none, or is not known.
    pub roster_actions: Option<&'a [String]>,
    /// The execution's lead, if any.
    pub lead: &'a str,
    /// The session, when the execution runs as one.
    pub session: Option<&'a Session>,
}

impl Subject<'_> {
    /// The role the agent holds: `lead` for the lead; in a session its
    /// assignment (none when unassigned); else its roster role.
    pub fn role(&self) -> Option<&str> {
        if !self.lead.is_empty() && self.agent_id == self.lead {
            return Some(LEAD_ROLE);
        }
        match self.session {
            Some(session) => session.assignments.get(self.agent_id).map(|assignment| assignment.role.as_str()),
            None => (!self.roster_role.is_empty()).then_some(self.roster_role),
        }
    }
}

/// Runs the three checks for `action`.
pub fn check(matrix: &Matrix, subject: &Subject<'_>, action: &str) -> Verdict {
    let version = matrix.version;
    let verdict = |allowed, role: &str, check, reason: String| Verdict {
        allowed,
        role: role.to_owned(),
        check,
        reason,
        matrix_version: version,
    };
    let Some(role) = subject.role() else {
        return match subject.session {
            Some(_) => verdict(
                false,
                "",
                Check::NotAssigned,
                format!(
                    "'{}' is not assigned in the session: it is neither its lead nor a participant",
                    subject.agent_id
                ),
            ),
            None => verdict(
                true,
                "",
                Check::NotGoverned,
                format!(
                    "'{}' has no roster role: outside sessions the permission matrix (version {version}) does not \
                     restrict it, and the step's roles alone decide",
                    subject.agent_id
                ),
            ),
        };
    };
    let in_roster_role = subject.session.is_none() && (subject.lead.is_empty() || subject.agent_id != subject.lead);
    if in_roster_role
        && let Some(listed) = subject.roster_actions.filter(|listed| !listed.is_empty())
        && !listed.iter().any(|listed| listed == action)
    {
        return verdict(
            false,
            role,
            Check::RosterRole,
            format!(
                "'{action}' is not among the actions roster role '{role}' lists ({}): outside sessions the \
                 role's own actions bind",
                listed.join(", ")
            ),
        );
    }
    let Some(matrix_role) = matrix.role(role) else {
        if subject.session.is_none() {
            return verdict(
                true,
                role,
                Check::NotGoverned,
                format!(
                    "role '{role}' is not in the permission matrix (version {version}): outside sessions the \
                     matrix does not restrict it, and the step's roles alone decide"
                ),
            );
        }
        return verdict(
            false,
            role,
            Check::UnknownRole,
            format!("role '{role}' is not in the permission matrix (version {version})"),
        );
    };
    if matrix_role.permitted_actions.iter().any(|permitted| permitted == action) {
        verdict(
            true,
            role,
            Check::Action,
            format!("role '{role}' may '{action}' (permission matrix version {version})"),
        )
    } else if matrix_role.forbidden_actions.iter().any(|forbidden| forbidden == action) {
        verdict(
            false,
            role,
            Check::Action,
            format!("role '{role}' is forbidden to '{action}' (permission matrix version {version})"),
        )
    } else {
        verdict(
            false,
            role,
            Check::Action,
            format!("'{action}' is not among the actions of role '{role}' (permission matrix version {version})"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn default_matrix() -> Matrix {
        Matrix::parse(1, DEFAULT_MATRIX.to_owned(), 0, "muster".to_owned()).expect("the default matrix is valid").0
    }

    fn session(assignments: &[(&str, &str)]) -> Session {
        Session {
            title: "t".to_owned(),
            description: String::new(),
            subtasks: Default::default(),
            assignments: assignments
                .iter()
                .map(|(agent, role)| {
                    (
                        (*agent).to_owned(),
                        RoleAssignment {
                            agent_id: (*agent).to_owned(),
                            role: (*role).to_owned(),
                            subtask: String::new(),
                            assigned_by: "lead".to_owned(),
                            assigned_at: 0,
                        },
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn the_default_matrix_is_the_team_protocol_table() {
        let matrix = default_matrix();
        let session = session(&[("dev", "developer"), ("rev", "reviewer"), ("ana", "analyst"), ("arch", "architect")]);
        let subject = |agent_id| Subject {
            agent_id,
            roster_role: "",
            roster_actions: None,
            lead: "boss",
            session: Some(&session),
        };
        let allowed = |agent, action| check(&matrix, &subject(agent), action).allowed;
        assert!(allowed("boss", "assign_role") && allowed("boss", "code") && allowed("boss", "approve"));
        assert!(allowed("dev", "code") && allowed("dev", "report_done") && !allowed("dev", "reassign"));
        assert!(allowed("rev", "approve") && !allowed("rev", "code"));
        assert!(allowed("ana", "summarize") && !allowed("ana", "code") && !allowed("ana", "report_done"));
        assert!(allowed("arch", "design") && !allowed("arch", "assign_role"));
        let forbidden = check(&matrix, &subject("dev"), "reassign");
        assert_eq!(forbidden.check, Check::Action);
        assert!(forbidden.reason.contains("forbidden"), "{}", forbidden.reason);
        let outsider = check(&matrix, &subject("stranger"), "code");
        assert_eq!((outsider.allowed, outsider.check), (false, Check::NotAssigned));
    }

    #[test]
    fn outside_sessions_the_roster_role_applies() {
        let matrix = default_matrix();
        let subject = Subject { agent_id: "a", roster_role: "reviewer", roster_actions: None, lead: "", session: None };
        assert!(check(&matrix, &subject, "approve").allowed);
        assert!(!check(&matrix, &subject, "code").allowed, "a matrix role is restricted outside sessions too");
        let lead =
            Subject { agent_id: "boss", roster_role: "writer", roster_actions: None, lead: "boss", session: None };
        assert_eq!(check(&matrix, &lead, "close_task").role, LEAD_ROLE);
        let ungoverned = Subject { roster_role: "writer", ..subject };
        let verdict = check(&matrix, &ungoverned, "approve");
        assert_eq!((verdict.allowed, verdict.check), (true, Check::NotGoverned), "{verdict:?}");
        let roleless = Subject { roster_role: "", ..subject };
        assert_eq!(check(&matrix, &roleless, "code").check, Check::NotGoverned);
    }

    #[test]
    fn outside_sessions_the_actions_a_roster_role_lists_bind() {
        let matrix = default_matrix();
        let listed = ["code".to_owned(), "report_done".to_owned()];
        let writer =
            Subject { agent_id: "w", roster_role: "writer", roster_actions: Some(&listed), lead: "", session: None };
        let refused = check(&matrix, &writer, "approve");
        assert_eq!((refused.allowed, refused.check), (false, Check::RosterRole), "{refused:?}");
        assert_eq!(check(&matrix, &writer, "code").check, Check::NotGoverned, "a listed action goes on to the matrix");
        // A governed role is held to both: its list, then the matrix.
        let reviewer = Subject { roster_role: "reviewer", ..writer };
        assert_eq!(check(&matrix, &reviewer, "approve").check, Check::RosterRole);
        assert!(!check(&matrix, &reviewer, "code").allowed, "listed, but the matrix forbids it");
        // The lead acts as `lead`, and a session role replaces the roster role.
        let lead = Subject { lead: "w", ..writer };
        assert!(check(&matrix, &lead, "approve").allowed);
        let session = session(&[("w", "reviewer")]);
        let in_session = Subject { session: Some(&session), ..writer };
        assert!(check(&matrix, &in_session, "approve").allowed);
        let unlisted = Subject { roster_actions: Some(&[]), ..writer };
        assert!(check(&matrix, &unlisted, "approve").allowed, "a role listing no actions is not held to a list");
    }

    #[test]
    fn in_a_session_a_role_outside_the_matrix_is_refused() {
        let matrix = default_matrix();
        let session = session(&[("w", "writer")]);
        let subject =
            Subject { agent_id: "w", roster_role: "", roster_actions: None, lead: "", session: Some(&session) };
        let verdict = check(&matrix, &subject, "code");
        assert_eq!((verdict.allowed, verdict.check), (false, Check::UnknownRole), "{verdict:?}");
    }
}
