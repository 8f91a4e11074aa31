//! Property tests of the delegation framework.

use proptest::prelude::*;

use super::*;
use crate::domain::model::Status;

const TAGS: [&str; 3] = ["x", "y", "z"];

fn agent_strategy(index: usize) -> impl Strategy<Value = Agent> {
    (0..3_usize, proptest::collection::vec(any::<bool>(), 3), 1..6_u32, 0..6_u32, 0..4_u8, 0..11_usize, any::<bool>())
        .prop_map(move |(team, tags, capacity, workload, manual, senior, has_until)| Agent {
            id: format!("a{index}"),
            name: format!("A{index}"),
            role: if index.is_multiple_of(2) { "even".into() } else { "odd".into() },
            team: format!("t{team}"),
            senior_id: if senior < 10 && senior != index { format!("a{senior}") } else { String::new() },
            expertise: TAGS.iter().zip(&tags).filter(|(_, on)| **on).map(|(tag, _)| (*tag).to_owned()).collect(),
            manual_status: match manual {
                0 => Some(Status::Offline),
                1 => Some(Status::Busy),
                _ => None,
            },
            current_workload: workload.min(capacity),
            workload_capacity: capacity,
            availability_until: has_until.then_some(1_000 + i64::from(workload) * 3_600_000),
            ..Agent::default()
        })
}

pub(crate) fn case_strategy() -> impl Strategy<Value = (Vec<Agent>, DelegationRequest)> {
    let agents = (0..10_usize).map(agent_strategy).collect::<Vec<_>>();
    (
        agents,
        0..11_usize,
        proptest::collection::vec(any::<bool>(), 3),
        proptest::collection::vec(0..10_usize, 0..4),
        0..13_usize,
        0..4_u8,
        0..3_u8,
    )
        .prop_map(|(agents, requester, tags, chain, preferred, urgency, role)| {
            let request = DelegationRequest {
                task_id: "task".into(),
                requester_id: if requester < 10 { format!("a{requester}") } else { String::new() },
                required_expertise: TAGS
                    .iter()
                    .zip(&tags)
                    .filter(|(_, on)| **on)
                    .map(|(tag, _)| (*tag).to_owned())
                    .collect(),
                required_role: match role {
                    0 => "even".into(),
                    _ => String::new(),
                },
                team: ["", "t1", "t2"][requester % 3].to_owned(),
                urgency: [Urgency::Low, Urgency::Normal, Urgency::High, Urgency::Critical][usize::from(urgency)],
                delegation_chain: chain.into_iter().map(|index| format!("a{index}")).collect(),
                preferred_agent_id: match preferred {
                    10 => "ghost".into(),
                    11 | 12 => String::new(),
                    index => format!("a{index}"),
                },
                ..DelegationRequest::default()
            };
            (agents, request)
        })
}

fn snapshot_of(agents: &[Agent]) -> Snapshot {
    Snapshot { agents: agents.iter().cloned().map(std::sync::Arc::new).collect(), ..Snapshot::default() }
}

proptest! {
    #[test]
    fn never_offline_never_full_never_in_the_chain((agents, request) in case_strategy()) {
        let snapshot = snapshot_of(&agents);
        let decision = decide(&request, &snapshot, 1_000, Settings::default());
        let chosen = agents.iter().find(|agent| agent.id == decision.primary_agent_id);
        if !decision.primary_agent_id.is_empty() {
            prop_assert!(!request.delegation_chain.contains(&decision.primary_agent_id), "{decision:?}");
            prop_assert_ne!(&decision.primary_agent_id, &request.requester_id);
        }
        match decision.kind {
            DecisionKind::Delegate => {
                let chosen = chosen.expect("a delegate exists");
                prop_assert!(chosen.status() != Status::Offline);
                if decision.over_capacity {
                    // 5/5 means only urgent tasks, and only one of them over.
                    prop_assert!(request.urgency.is_urgent(), "{decision:?}");
                    prop_assert!(!chosen.has_free_slot() && has_slot_over_capacity(chosen), "{decision:?}");
                    prop_assert!(!agents.iter().any(|agent| agent.id != request.requester_id
                        && !request.delegation_chain.contains(&agent.id)
                        && agent.has_free_slot()
                        && (request.required_role.is_empty() || agent.role == request.required_role)
                        && request.required_expertise.iter().all(|tag| agent.expertise.contains(tag))),
                        "a colleague with a free slot was passed over: {decision:?}");
                } else {
                    prop_assert!(chosen.has_free_slot() && chosen.current_workload < chosen.workload_capacity);
                }
                prop_assert!(request.required_role.is_empty() || chosen.role == request.required_role);
            }
            DecisionKind::Queue => {
                let chosen = chosen.expect("an expert exists");
                prop_assert!(chosen.status() != Status::Offline);
                prop_assert!(!chosen.has_free_slot());
                prop_assert!(request.urgency != Urgency::Critical);
                prop_assert!(decision.wait_millis <= request.urgency.max_wait_millis().unwrap_or(0));
            }
            DecisionKind::Escalate => {
                if let Some(senior) = chosen {
                    prop_assert!(senior.status() != Status::Offline);
                }
            }
        }
        prop_assert!(decision.text.starts_with("DELEGATION DECISION:\nPrimary Choice: "));
    }

    #[test]
    fn the_decision_does_not_depend_on_the_order_of_the_roster((agents, request) in case_strategy(), seed in any::<u64>()) {
        let forward = decide(&request, &snapshot_of(&agents), 1_000, Settings::default());
        let mut shuffled = agents;
        let len = shuffled.len();
        for index in 0..len {
            let other = usize::try_from(seed.rotate_left(u32::try_from(index).unwrap_or(0)) % len as u64).unwrap_or(0);
            shuffled.swap(index, other);
        }
        let backward = decide(&request, &snapshot_of(&shuffled), 1_000, Settings::default());
        prop_assert_eq!(forward, backward);
    }

    #[test]
    fn an_available_same_team_expert_is_always_found((agents, request) in case_strategy()) {
        let snapshot = snapshot_of(&agents);
        let decision = decide(&request, &snapshot, 1_000, Settings::default());
        let requester_team = if request.team.is_empty() {
            agents.iter().find(|a| a.id == request.requester_id).map(|a| a.team.clone()).unwrap_or_default()
        } else {
            request.team.clone()
        };
        let exists = agents.iter().any(|agent| {
            agent.team == requester_team
                && agent.id != request.requester_id
                && !request.delegation_chain.contains(&agent.id)
                && agent.has_free_slot()
                && (request.required_role.is_empty() || agent.role == request.required_role)
                && request.required_expertise.iter().all(|tag| agent.expertise.contains(tag))
        });
        if exists && request.preferred_agent_id != "ghost" {
            prop_assert!(matches!(decision.tier, Tier::SameTeamMatch | Tier::Named), "{decision:?}");
        }
    }
}

#[test]
fn format_wait_reads_well() {
    assert_eq!(format_wait(30 * 60_000), "30m");
    assert_eq!(format_wait(5 * 3_600_000 + 60_000), "5h 1m");
    assert_eq!(format_wait(4 * 3_600_000), "4h");
    assert_eq!(format_wait(5_000), "5s");
}

/// A lead (under a head) and one rust expert holding `workload` of 5 tasks.
fn expert_holding(workload: u32, manual_status: Option<Status>) -> Snapshot {
    let head = Agent { id: "head".into(), name: "Head".into(), workload_capacity: 5, ..Agent::default() };
    let lead = Agent {
        id: "lead".into(),
        name: "Lead".into(),
        team: "core".into(),
        senior_id: "head".into(),
        workload_capacity: 5,
        ..Agent::default()
    };
    let expert = Agent {
        id: "dev".into(),
        name: "Dev".into(),
        team: "core".into(),
        senior_id: "lead".into(),
        expertise: vec!["rust".into()],
        manual_status,
        current_workload: workload,
        workload_capacity: 5,
        ..Agent::default()
    };
    snapshot_of(&[head, lead, expert])
}

fn rust_task(urgency: Urgency) -> DelegationRequest {
    DelegationRequest {
        task_id: "task".into(),
        requester_id: "lead".into(),
        required_expertise: vec!["rust".into()],
        urgency,
        ..DelegationRequest::default()
    }
}

#[test]
fn at_capacity_only_an_urgent_task_is_placed_and_only_one_over() {
    let at_capacity = expert_holding(5, None);
    for urgency in [Urgency::High, Urgency::Critical] {
        let decision = decide(&rust_task(urgency), &at_capacity, 1_000, Settings::default());
        assert_eq!(
            (decision.kind, decision.primary_agent_id.as_str()),
            (DecisionKind::Delegate, "dev"),
            "{decision:?}"
        );
        assert_eq!(decision.tier, Tier::QueueForExpert);
        assert!(decision.over_capacity);
        assert!(decision.text.contains("over capacity because the task is urgent"), "{}", decision.text);
        assert!(decision.text.contains("from 5/5 to 6/5 tasks"), "{}", decision.text);
        assert_eq!(decision.fallback_agent_id, "head", "the senior, should the expert not take it");
    }
    for urgency in [Urgency::Low, Urgency::Normal] {
        let decision = decide(&rust_task(urgency), &at_capacity, 1_000, Settings::default());
        assert_eq!((decision.kind, decision.over_capacity), (DecisionKind::Queue, false), "{decision:?}");
    }
    // Already over capacity: a second urgent task waits (HIGH, 30 minutes at
    // most) or escalates (CRITICAL).
    let over = expert_holding(6, None);
    let high = decide(&rust_task(Urgency::High), &over, 1_000, Settings::default());
    assert_eq!((high.kind, high.primary_agent_id.as_str(), high.over_capacity), (DecisionKind::Queue, "dev", false));
    let critical = decide(&rust_task(Urgency::Critical), &over, 1_000, Settings::default());
    assert_eq!((critical.kind, critical.primary_agent_id.as_str()), (DecisionKind::Escalate, "head"));
    // Set busy by hand: no task at all, urgent or not.
    let held_back = expert_holding(5, Some(Status::Busy));
    let decision = decide(&rust_task(Urgency::Critical), &held_back, 1_000, Settings::default());
    assert_eq!((decision.kind, decision.over_capacity), (DecisionKind::Escalate, false));
    // Below capacity an urgent task takes a free slot like any other.
    let decision = decide(&rust_task(Urgency::Critical), &expert_holding(4, None), 1_000, Settings::default());
    assert_eq!(
        (decision.kind, decision.tier, decision.over_capacity),
        (DecisionKind::Delegate, Tier::SameTeamMatch, false)
    );
}

#[test]
fn an_assigned_urgent_task_takes_the_slot_over_capacity() {
    let assigned = |urgency| DelegationRequest { assigned_agent_id: "dev".into(), ..rust_task(urgency) };
    let decision = decide(&assigned(Urgency::Critical), &expert_holding(5, None), 1_000, Settings::default());
    assert_eq!((decision.kind, decision.tier, decision.over_capacity), (DecisionKind::Delegate, Tier::Named, true));
    assert!(decision.notes.contains("over capacity because the task is urgent (critical)"), "{decision:?}");
    let decision = decide(&assigned(Urgency::Normal), &expert_holding(5, None), 1_000, Settings::default());
    assert_eq!((decision.kind, decision.over_capacity), (DecisionKind::Queue, false));
    let decision = decide(&assigned(Urgency::High), &expert_holding(6, None), 1_000, Settings::default());
    assert_eq!((decision.kind, decision.over_capacity), (DecisionKind::Queue, false));
}
