use super::found;
use crate::validate_permission_matrix;

/// The example permission matrix of `docs/process-format.md`.
const EXAMPLE_MATRIX: &str = "\
roles:
  lead:
    description: Runs the session
    can: [create_task, assign_role, reassign, unblock, close_task]
    includes: [architect, developer, reviewer, analyst]
  architect:
    can: [design, create_subtask, code]
    cannot: [create_task, assign_role]
  developer:
    can: [code, test, commit, report_done, request_review]
    cannot: [create_task, assign_role, reassign]
  reviewer:
    can: [review, approve, request_changes, report_done]
    cannot: [code, create_task]
  analyst:
    can: [analyze, summarize, report]
    cannot: [code, create_task, assign_role]
";

#[test]
fn the_example_matrix_is_valid_and_lead_can_do_all_below() {
    let report = validate_permission_matrix(EXAMPLE_MATRIX);
    assert_eq!(report.diagnostics, vec![]);
    let lead = report.roles.iter().find(|role| role.name == "lead").expect("lead");
    for action in ["create_task", "assign_role", "design", "code", "review", "approve", "summarize"] {
        assert!(lead.permitted_actions.iter().any(|permitted| permitted == action), "lead can {action}");
    }
    let reviewer = report.roles.iter().find(|role| role.name == "reviewer").expect("reviewer");
    assert!(!reviewer.permitted_actions.iter().any(|action| action == "code"));
}

fn check(source: &str) -> Vec<(&'static str, u32, u32)> {
    found(&validate_permission_matrix(source).diagnostics)
}

#[test]
fn matrix_rules() {
    assert_eq!(check("- lead\n"), vec![("MTX001", 1, 1)]);
    assert_eq!(check("roles: [lead]\n"), vec![("MTX001", 1, 8)]);
    assert_eq!(check("roles:\n  lead: everything\n"), vec![("MTX002", 2, 9)]);
    assert_eq!(check("roles:\n  lead: {can: code}\n"), vec![("MTX003", 2, 15)]);
    assert_eq!(check("roles:\n  dev: {can: [code], cannot: [test, code]}\n"), vec![("MTX004", 2, 37)]);
    assert_eq!(
        check("roles:\n  lead: {can: [x], includes: [developr]}\n  developer: {can: [code]}\n"),
        vec![("MTX005", 2, 31)]
    );
    assert_eq!(
        check("roles:\n  a: {can: [x], includes: [b]}\n  b: {can: [y], includes: [a]}\n"),
        vec![("MTX006", 2, 3), ("MTX006", 3, 3)]
    );
    assert_eq!(check("roles:\n  a: {can: [x], cant: [y]}\n"), vec![("MTX007", 2, 17)]);
    assert_eq!(check("roles:\n  a: {can: [x, x]}\n"), vec![("MTX008", 2, 16)]);
    assert_eq!(check("roles:\n  a: {can: [Write Code]}\n"), vec![("MTX009", 2, 13)]);
    assert_eq!(check("roles:\n  Lead: {can: [x]}\n"), vec![("MTX010", 2, 3)]);
    assert_eq!(check("roles:\n  a: {cannot: [x]}\n"), vec![("MTX011", 2, 3)]);
}

#[test]
fn matrices_with_too_many_roles_are_refused() {
    let roles: String = (0..1_001).map(|index| format!("  r{index}: {{can: [x]}}\n")).collect();
    assert_eq!(check(&format!("roles:\n{roles}")), vec![("MTX012", 2, 3)]);
}
