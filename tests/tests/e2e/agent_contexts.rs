//! What an assignment tells an agent about itself (its rendered prompt, its
//! limits, its role) is kept by the execution service across executions,
//! and forgotten when the roster announces a change: a run started after an
//! agent or its role changed is told the new one.

use std::sync::{Arc, Mutex};

use muster::worker::{AgentCredential, Behaviour, Step, StepOutcome};
use muster_proto::{
    common::v1::ExecutionStatus,
    execution::v1::Assignment,
    roster::v1::{Agent, PutRoleDefinitionRequest, RoleDefinition, UpdateAgentRequest},
};
use muster_tests::{Backend, RosterClient, TestCluster, agent, events_until_finished, publish_and_start, spawn_worker};

/// Answers every step, keeping what each assignment told its agent.
#[derive(Debug, Clone, Default)]
struct Recording(Arc<Mutex<Vec<Assignment>>>);

impl Behaviour for Recording {
    async fn run(&self, assignment: Assignment, _step: Step) -> StepOutcome {
        self.0.lock().unwrap().push(assignment);
        StepOutcome::Completed {
            output_json: "{}".to_owned(),
            tokens_used: 1,
            cost: 0.0,
            iterations: 1,
            remember: Vec::new(),
            skip_triggers: false,
        }
    }
}

/// A process of one step for each of `agents`, one after another.
fn steps_of(name: &str, agents: &[&str]) -> String {
    let mut yaml = format!("name: {name}\nsteps:\n");
    for (index, agent) in agents.iter().enumerate() {
        yaml.push_str(&format!(
            "  - id: s{index}\n    type: agent_task\n    agent: {agent}\n    message: step {index}\n"
        ));
        if index > 0 {
            yaml.push_str(&format!("    depends_on: [s{}]\n", index - 1));
        }
    }
    yaml
}

/// Runs `source` to completion; the assignments it made, in order.
async fn run(test: &TestCluster, recording: &Recording, source: &str) -> Vec<Assignment> {
    recording.0.lock().unwrap().clear();
    let id = publish_and_start(&mut test.execution(), source).await;
    let events = events_until_finished(&test.operator("execution"), &id).await;
    let finished = events.last().expect("events");
    assert_eq!(finished.execution_status, ExecutionStatus::Completed as i32, "{}", finished.detail);
    std::mem::take(&mut *recording.0.lock().unwrap())
}

/// Puts the role `writer` with `mission`.
async fn put_writer(roster: &mut RosterClient, mission: &str) {
    let role = RoleDefinition {
        name: "writer".to_owned(),
        description: "Writes".to_owned(),
        mission: mission.to_owned(),
        ..Default::default()
    };
    roster.put_role_definition(PutRoleDefinitionRequest { role: Some(role) }).await.expect("a role");
}

async fn a_changed_agent_or_role_reaches_the_next_run(backend: Backend) {
    let Some(test) = TestCluster::start(backend).await else { return };
    let mut roster = test.roster();
    put_writer(&mut roster, "Write the first draft").await;
    let writer = Agent { backstory: "Trained in Lisbon".to_owned(), ..agent("ada", "writer", "docs") };
    let tokens = test.register_agents(&[writer.clone(), agent("bo", "editor", "docs")]).await;
    let credentials = ["ada", "bo"]
        .iter()
        .zip(&tokens)
        .map(|(agent_id, token)| AgentCredential { agent_id: (*agent_id).to_owned(), token: token.clone() })
        .collect();
    let recording = Recording::default();
    let (stop, worker) = spawn_worker(test.operator("execution"), credentials, recording.clone());

    // Steps go to one agent after the other: each asks for its context.
    let first = run(&test, &recording, &steps_of("drafts", &["ada", "bo", "ada"])).await;
    assert_eq!(first.len(), 3);
    assert!(first[0].system_prompt.contains("Trained in Lisbon"), "{}", first[0].system_prompt);
    assert_eq!(first[0].max_iterations, 10, "the default when the roster says none");

    // The agent changes, and a run starts at once: it is told the change.
    roster
        .update_agent(UpdateAgentRequest {
            agent: Some(Agent { backstory: "Trained in Osaka".to_owned(), max_iterations: 3, ..writer.clone() }),
            update_mask: None,
        })
        .await
        .expect("an update");
    let second = run(&test, &recording, &steps_of("drafts", &["ada", "bo", "ada"])).await;
    for assignment in second.iter().filter(|assignment| assignment.agent_id == "ada") {
        assert!(assignment.system_prompt.contains("Trained in Osaka"), "{}", assignment.system_prompt);
        assert!(!assignment.system_prompt.contains("Lisbon"), "{}", assignment.system_prompt);
        assert_eq!(assignment.max_iterations, 3);
    }

    // Its role changes: the next run carries the new definition.
    put_writer(&mut roster, "Write the final copy").await;
    let third = run(&test, &recording, &steps_of("drafts", &["ada"])).await;
    let role = third[0].role_definition.as_ref().expect("the role's definition");
    assert_eq!(role.mission, "Write the final copy");
    assert!(third[0].system_prompt.contains("Write the final copy"), "{}", third[0].system_prompt);

    let _ = stop.send(());
    let _ = worker.await;
    test.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_agent_or_role_reaches_the_next_run_on_sqlite() {
    a_changed_agent_or_role_reaches_the_next_run(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_agent_or_role_reaches_the_next_run_on_postgres() {
    a_changed_agent_or_role_reaches_the_next_run(Backend::Postgres).await;
}
