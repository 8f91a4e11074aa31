//! Schedules end to end, through real gRPC to the four real processes and
//! the `muster` command, on both databases: a process with a schedule runs
//! at its due times; across a restart of the execution service that misses
//! due times, `missed: run_once` fires once for all of them and `missed:
//! skip` fires none; no due time ever fires twice, also with two execution
//! services on one PostgreSQL database; `ListSchedules` and `muster schedule
//! list` show when each fires next. A role's schedule written in plain
//! English ("9am and 5pm, weekdays") fires as the cron it reads as, in the
//! time zone the role names; one that cannot be read is named, at its line
//! and column, when the role is imported.

use std::time::Duration;

use muster_proto::execution::v1::{ListExecutionsRequest, ListSchedulesRequest, PublishProcessRequest, Schedule};
use muster_tests::{
    Backend, ExecutionClient, TestCluster, agent,
    command::{run, text},
    spawn_sample_worker,
};
use serde_json::Value;

/// Every two seconds (a six-field cron: seconds first).
fn process(name: &str, missed: &str) -> String {
    format!(
        "name: {name}\nlead: lead\ntriggers:\n  schedule: '*/2 * * * * *'\n  time_zone: Europe/Paris\n  missed: {missed}\n\
         steps:\n  - {{id: work, type: agent_task, agent: worker, message: m}}\n"
    )
}

/// The due times the runs of `process` were started for.
async fn fired_for(client: &mut ExecutionClient, process: &str) -> Vec<i64> {
    let request = ListExecutionsRequest { process_name: process.to_owned(), limit: 1000, ..Default::default() };
    let executions = client.list_executions(request).await.unwrap().into_inner().executions;
    let mut due: Vec<i64> = executions
        .iter()
        .map(|execution| {
            let inputs: Value =
                muster_runtime::json::object_to_json(execution.inputs.as_ref().expect("inputs")).unwrap();
            inputs["scheduled_for_ms"].as_i64().expect("the due time in the inputs")
        })
        .collect();
    due.sort_unstable();
    due
}

async fn schedule_of(client: &mut ExecutionClient, process: &str) -> Schedule {
    let schedules = client.list_schedules(ListSchedulesRequest::default()).await.unwrap().into_inner().schedules;
    schedules.into_iter().find(|schedule| schedule.process_name == process).expect("the schedule")
}

fn millis(at: Option<&prost_types::Timestamp>) -> i64 {
    muster_runtime::time::from_timestamp(at.expect("a time"))
}

async fn schedules_fire(backend: Backend) {
    let Some(mut test) = TestCluster::start(backend).await else { return };
    let tokens = test.register_agents(&[agent("lead", "member", "core"), agent("worker", "member", "core")]).await;
    let mut client = test.execution();
    for source in [process("tick", "run_once"), process("tock", "skip")] {
        client.publish_process(PublishProcessRequest { source, file_name: String::new() }).await.expect("publish");
    }
    let credentials = vec![muster::worker::AgentCredential { agent_id: "worker".into(), token: tokens[1].clone() }];
    let (stop, worker) = spawn_sample_worker(test.operator("execution"), credentials);

    // It fires at its due times, on even seconds.
    let mut fired = Vec::new();
    for _ in 0..200 {
        fired = fired_for(&mut client, "tick").await;
        if fired.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(fired.len() >= 2, "two runs within 20 s: {fired:?}");
    assert!(fired.iter().all(|due| due % 2000 == 0), "{fired:?}");
    let tick = schedule_of(&mut client, "tick").await;
    assert_eq!(
        (tick.cron.as_str(), tick.time_zone.as_str(), tick.missed.as_str()),
        ("*/2 * * * * *", "Europe/Paris", "run_once")
    );
    assert!(!tick.last_execution_id.is_empty());
    assert!(millis(tick.next_fire_at.as_ref()) > millis(tick.last_fired_at.as_ref()));
    let listed = run(vec!["schedule".into(), "list".into()], test.command_environment()).await;
    assert!(listed.status.success(), "{}", text(&listed));
    assert!(
        text(&listed).contains("tick  '*/2 * * * * *' Europe/Paris  missed: run_once  next 20"),
        "{}",
        text(&listed)
    );
    assert!(text(&listed).contains("tock  '*/2 * * * * *' Europe/Paris  missed: skip  next 20"), "{}", text(&listed));

    // The execution service goes down just after a due time, for more
    // than two periods.
    let missed_from = loop {
        let next = millis(schedule_of(&mut client, "tick").await.next_fire_at.as_ref());
        if next - muster_runtime::time::now_millis() > 1200 {
            break next;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    test.cluster_mut().kill("execution").await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    // Due times from here on are the scheduler's regular ones.
    let back_at = muster_runtime::time::now_millis();
    test.cluster_mut().restart("execution").await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;

    let mut client = test.execution();
    let tick = fired_for(&mut client, "tick").await;
    let tock = fired_for(&mut client, "tock").await;
    let missed = |fired: &[i64]| fired.iter().filter(|due| (missed_from..back_at).contains(*due)).count();
    assert_eq!(
        missed(&tick),
        1,
        "run_once: one run for the missed due times: {tick:?} from {missed_from} to {back_at}"
    );
    assert_eq!(missed(&tock), 0, "skip: none: {tock:?} from {missed_from} to {back_at}");
    for fired in [&tick, &tock] {
        assert!(fired.windows(2).all(|pair| pair[0] < pair[1]), "no due time fires twice: {fired:?}");
        assert!(fired.iter().any(|due| *due >= back_at), "it goes on after the restart: {fired:?}");
    }

    let _ = stop.send(());
    let _ = worker.await;
    test.shutdown().await;
}

async fn roles_schedules_in_plain_english(backend: Backend) {
    let Some(test) = TestCluster::start(backend).await else { return };
    let environment = test.command_environment();
    let role_file = |name: &str, schedule: &str| {
        let path = test.data_dir.join(format!("{name}.md"));
        std::fs::write(&path, format!("# {name}\n\n## Mission\nKeep the team in step.\n\n## Schedule\n{schedule}\n"))
            .unwrap();
        path.display().to_string()
    };
    let files = [
        role_file("standup", "9am and 5pm, weekdays\ntime_zone: Europe/Paris"),
        role_file("digest", "every 30 minutes"),
        role_file("typo", "9am and 5pm, weekdys"),
    ];
    let mut import = vec!["roster".to_owned(), "import".to_owned()];
    import.extend(files.iter().cloned());
    let imported = run(import, environment.clone()).await;
    assert!(imported.status.success(), "{}", text(&imported));
    // The phrase that cannot be read, where it is: line 7, column 14.
    let warning = format!("{}:7:14: warning[ROL011]: schedule: cannot read 'weekdys'", files[2]);
    assert!(text(&imported).contains(&warning), "{}", text(&imported));

    // Each readable schedule fires as its cron, in its role's time zone.
    let mut client = test.execution();
    let mut listed = Vec::new();
    for _ in 0..300 {
        let request = ListSchedulesRequest::default();
        listed = client.list_schedules(request).await.unwrap().into_inner().schedules;
        if listed.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut shown: Vec<(&str, &str, &str)> = listed
        .iter()
        .map(|schedule| (schedule.process_name.as_str(), schedule.cron.as_str(), schedule.time_zone.as_str()))
        .collect();
    shown.sort_unstable();
    assert_eq!(
        shown,
        [("role-digest", "*/30 * * * *", ""), ("role-standup", "0 9,17 * * 1-5", "Europe/Paris")],
        "the role whose schedule cannot be read has none"
    );
    let schedules = run(vec!["schedule".into(), "list".into()], environment.clone()).await;
    assert!(schedules.status.success(), "{}", text(&schedules));
    for line in ["role-standup  '0 9,17 * * 1-5' Europe/Paris  missed: skip", "role-digest  '*/30 * * * *' UTC"] {
        assert!(text(&schedules).contains(line), "{line} in:\n{}", text(&schedules));
    }
    test.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_schedules_in_plain_english_on_sqlite() {
    roles_schedules_in_plain_english(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_schedules_in_plain_english_on_postgres() {
    roles_schedules_in_plain_english(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_fire_on_sqlite() {
    schedules_fire(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_fire_on_postgres() {
    schedules_fire(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_fire_a_due_time_once_on_postgres() {
    let Some(mut test) = TestCluster::start(Backend::Postgres).await else { return };
    // A second execution service on the same database, as a second pod.
    test.cluster_mut().add_replica("execution").await.expect("a replica");
    let mut client = test.execution();
    let source = "name: beat\ntriggers: {schedule: '* * * * * *'}\n\
                  steps:\n  - {id: a, type: human_approval, roles: {executor: approval-system}}\n"
        .to_owned();
    client.publish_process(PublishProcessRequest { source, file_name: String::new() }).await.expect("publish");
    tokio::time::sleep(Duration::from_secs(6)).await;
    let fired = fired_for(&mut client, "beat").await;
    assert!(fired.len() >= 4, "every second: {fired:?}");
    assert!(fired.windows(2).all(|pair| pair[0] < pair[1]), "no due time fires twice: {fired:?}");
    test.shutdown().await;
}
