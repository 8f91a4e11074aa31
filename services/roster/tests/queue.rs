//! Workload, release, the queue for busy experts, stale-queue escalation and
//! the concurrency of slot reservation, on SQLite and PostgreSQL.

mod common;

use common::{Backend, TestServer, delegate_request};
use muster_proto::roster::v1 as pb;
use pb::DecisionKind as Kind;

async fn org(backend: Backend) -> Option<TestServer> {
    let mut server = TestServer::on(backend).await?;
    server.team("data").await;
    server.agent("boss", "data", "", &["management"], 5).await;
    server.agent("expert", "data", "boss", &["sql"], 2).await;
    server.agent("junior", "data", "boss", &["excel"], 5).await;
    Some(server)
}

async fn watch(server: &mut TestServer, task_id: &str) -> tonic::Streaming<pb::WatchQueuedTaskResponse> {
    server
        .client
        .watch_queued_task(pb::WatchQueuedTaskRequest { task_id: task_id.into() })
        .await
        .expect("watch")
        .into_inner()
}

async fn go_offline(server: &mut TestServer, agent_id: &str) {
    let request = pb::SetAgentStatusRequest {
        id: agent_id.into(),
        status: pb::AgentStatus::Offline as i32,
        availability_until: None,
    };
    server.client.set_agent_status(request).await.unwrap();
}

async fn release_offers_the_slot_to_the_oldest_queued_task(backend: Backend) {
    let Some(mut server) = org(backend).await else { return };
    for task in ["a", "b"] {
        let decision = server.delegate(delegate_request(task, "junior", &["sql"])).await;
        assert_eq!(decision.primary_agent_id, "expert");
    }
    let expert = server.get("expert").await;
    assert_eq!((expert.current_workload, expert.status), (2, pb::AgentStatus::Busy as i32));
    server.clock.advance(1000);
    let first = server.delegate(delegate_request("c", "junior", &["sql"])).await;
    assert_eq!(Kind::try_from(first.decision).unwrap(), Kind::Queue);
    assert_eq!(first.estimated_wait.map(|wait| wait.seconds).unwrap_or_default(), 1800);
    server.clock.advance(1000);
    let second = server.delegate(delegate_request("d", "boss", &["sql"])).await;
    assert_eq!(Kind::try_from(second.decision).unwrap(), Kind::Queue);
    assert_eq!(second.estimated_wait.map(|wait| wait.seconds).unwrap_or_default(), 3600, "one task queued ahead");
    let status =
        server.client.watch_queued_task(pb::WatchQueuedTaskRequest { task_id: "zzz".into() }).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::NotFound);

    let mut watch_c = watch(&mut server, "c").await;
    let released =
        server.client.release_task(pb::ReleaseTaskRequest { task_id: "a".into() }).await.unwrap().into_inner();
    assert_eq!(released.agent_id, "expert");
    let resolution = watch_c.message().await.unwrap().unwrap().decision.unwrap();
    assert_eq!(Kind::try_from(resolution.decision).unwrap(), Kind::Delegate);
    assert_eq!(resolution.primary_agent_id, "expert");
    assert_eq!(server.get("expert").await.current_workload, 2, "the freed slot went to c at once");

    // Idempotent: a second release of the same task frees nothing.
    let again = server.client.release_task(pb::ReleaseTaskRequest { task_id: "a".into() }).await.unwrap().into_inner();
    assert!(again.agent_id.is_empty());
    assert_eq!(server.get("expert").await.current_workload, 2);
    let unknown =
        server.client.release_task(pb::ReleaseTaskRequest { task_id: "never".into() }).await.unwrap().into_inner();
    assert!(unknown.agent_id.is_empty());

    // A watcher arriving after the resolution gets it at once.
    let mut late = watch(&mut server, "c").await;
    assert_eq!(late.message().await.unwrap().unwrap().decision.unwrap().primary_agent_id, "expert");

    // c finishes; d is next.
    server.client.release_task(pb::ReleaseTaskRequest { task_id: "c".into() }).await.unwrap();
    let mut watch_d = watch(&mut server, "d").await;
    let resolution = watch_d.message().await.unwrap().unwrap().decision.unwrap();
    assert_eq!(resolution.primary_agent_id, "expert");
    let records = server
        .client
        .list_delegations(pb::ListDelegationsRequest { task_id: "d".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner()
        .records;
    let kinds: Vec<i32> = records.iter().map(|record| record.decision.as_ref().unwrap().decision).collect();
    assert_eq!(kinds, vec![Kind::Queue as i32, Kind::Delegate as i32]);
    assert_eq!(records[1].requester_id, "boss");

    // Releasing everything returns the expert to idle.
    for task in ["b", "d"] {
        server.client.release_task(pb::ReleaseTaskRequest { task_id: task.into() }).await.unwrap();
    }
    let expert = server.get("expert").await;
    assert_eq!((expert.current_workload, expert.status), (0, pb::AgentStatus::Idle as i32));
    server.stop().await;
}

async fn stale_queued_tasks_are_escalated(backend: Backend) {
    let Some(mut server) = org(backend).await else { return };
    server.delegate(delegate_request("a", "junior", &["sql"])).await;
    server.delegate(delegate_request("b", "junior", &["sql"])).await;
    // An urgent task takes the expert's one slot over capacity; past it,
    // urgent tasks wait or escalate too.
    let over =
        pb::DelegateRequest { urgency: pb::Urgency::Critical as i32, ..delegate_request("x", "junior", &["sql"]) };
    assert_eq!(Kind::try_from(server.delegate(over).await.decision).unwrap(), Kind::Delegate);
    let high = pb::DelegateRequest { urgency: pb::Urgency::High as i32, ..delegate_request("c", "junior", &["sql"]) };
    assert_eq!(Kind::try_from(server.delegate(high).await.decision).unwrap(), Kind::Queue);
    let normal = delegate_request("d", "junior", &["sql"]);
    assert_eq!(Kind::try_from(server.delegate(normal).await.decision).unwrap(), Kind::Queue);

    let mut watch_c = watch(&mut server, "c").await;
    // Thirty minutes and a millisecond: the high-urgency task is stale, the normal one not.
    server.clock.advance(30 * 60_000 + 1);
    let resolution = watch_c.message().await.unwrap().unwrap().decision.unwrap();
    assert_eq!(Kind::try_from(resolution.decision).unwrap(), Kind::Escalate);
    assert_eq!(resolution.primary_agent_id, "boss");
    assert!(resolution.reasoning.contains("longer than a high task may wait"), "{}", resolution.reasoning);

    // The expert going offline escalates what waits for it at once.
    let mut watch_d = watch(&mut server, "d").await;
    go_offline(&mut server, "expert").await;
    let resolution = watch_d.message().await.unwrap().unwrap().decision.unwrap();
    assert_eq!(Kind::try_from(resolution.decision).unwrap(), Kind::Escalate);
    assert!(resolution.reasoning.contains("went offline"), "{}", resolution.reasoning);
    let records = server
        .client
        .list_delegations(pb::ListDelegationsRequest { agent_id: "boss".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner()
        .records;
    assert_eq!(records.len(), 2);
    server.stop().await;
}

async fn concurrent_delegations_take_the_last_slot_once(backend: Backend) {
    let Some(mut server) = TestServer::on(backend).await else { return };
    server.team("ops").await;
    server.agent("lead", "ops", "", &[], 5).await;
    server.agent("solo", "ops", "lead", &["pager"], 3).await;
    server.delegate(delegate_request("warm-1", "lead", &["pager"])).await;
    server.delegate(delegate_request("warm-2", "lead", &["pager"])).await;
    assert_eq!(server.get("solo").await.current_workload, 2, "one free slot left");

    let mut calls = Vec::new();
    for index in 0..32 {
        let mut client = server.client.clone();
        calls.push(tokio::spawn(async move {
            let request = pb::DelegateRequest {
                urgency: pb::Urgency::Critical as i32,
                ..delegate_request(&format!("race-{index}"), "lead", &["pager"])
            };
            client.delegate(request).await.expect("delegate").into_inner().decision.expect("decision")
        }));
    }
    let mut delegated = 0;
    let mut over_capacity = 0;
    for call in calls {
        let decision = call.await.unwrap();
        match Kind::try_from(decision.decision).unwrap() {
            Kind::Delegate => {
                assert_eq!(decision.primary_agent_id, "solo");
                delegated += 1;
                over_capacity += usize::from(decision.text.contains("placed over capacity"));
            }
            Kind::Escalate => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    // The calls are critical: after the last slot, one takes the slot over capacity.
    assert_eq!((delegated, over_capacity), (2, 1), "exactly one call takes the last slot, one the slot over");
    let solo = server.get("solo").await;
    assert_eq!(solo.current_workload, 4);
    assert_eq!(solo.current_workload, solo.workload_capacity + 1, "never more than one over capacity");
    server.stop().await;
}

async fn a_task_assigned_to_an_agent_waits_for_its_slot_or_escalates(backend: Backend) {
    let Some(mut server) = org(backend).await else { return };
    let assigned = |task: &str, agent: &str| pb::DelegateRequest {
        task_id: task.into(),
        requester_id: "junior".into(),
        assigned_agent_id: agent.into(),
        ..Default::default()
    };
    // A free slot: delegated to the agent, whatever the criteria would pick.
    let first = server.delegate(assigned("a", "expert")).await;
    assert_eq!((Kind::try_from(first.decision).unwrap(), first.primary_agent_id.as_str()), (Kind::Delegate, "expert"));
    assert_eq!(pb::DelegationTier::try_from(first.tier).unwrap(), pb::DelegationTier::Named);
    // Asked again for the same task (a restarted step), it keeps its one slot.
    let again = server.delegate(assigned("a", "expert")).await;
    assert_eq!(Kind::try_from(again.decision).unwrap(), Kind::Delegate);
    assert_eq!(server.get("expert").await.current_workload, 1);
    server.delegate(assigned("b", "expert")).await;
    // At capacity: a task that is not urgent waits for the agent.
    let queued = server.delegate(assigned("c", "expert")).await;
    assert_eq!((Kind::try_from(queued.decision).unwrap(), queued.primary_agent_id.as_str()), (Kind::Queue, "expert"));
    assert_eq!(queued.fallback_agent_id, "boss", "the senior to escalate to");
    // An urgent one takes the agent's one slot over capacity; once it ends,
    // the agent is back at capacity and the queued task still waits.
    let critical = pb::DelegateRequest { urgency: pb::Urgency::Critical as i32, ..assigned("u", "expert") };
    let over = server.delegate(critical).await;
    assert_eq!((Kind::try_from(over.decision).unwrap(), over.primary_agent_id.as_str()), (Kind::Delegate, "expert"));
    assert!(over.text.contains("placed over capacity because the task is urgent (critical)"), "{}", over.text);
    assert_eq!(server.get("expert").await.current_workload, 3);
    server.client.release_task(pb::ReleaseTaskRequest { task_id: "u".into() }).await.unwrap();
    assert_eq!(server.get("expert").await.current_workload, 2);
    // A task holding a slot of another agent and handed to the busy expert
    // waits too, and gives its former slot back when the expert takes it.
    server.delegate(assigned("m", "boss")).await;
    assert_eq!(server.get("boss").await.current_workload, 1);
    server.clock.advance(1);
    let moved = server.delegate(assigned("m", "expert")).await;
    assert_eq!(Kind::try_from(moved.decision).unwrap(), Kind::Queue);
    let mut watch_c = watch(&mut server, "c").await;
    server.client.release_task(pb::ReleaseTaskRequest { task_id: "a".into() }).await.unwrap();
    let resolution = watch_c.message().await.unwrap().unwrap().decision.unwrap();
    assert_eq!(
        (Kind::try_from(resolution.decision).unwrap(), resolution.primary_agent_id.as_str()),
        (Kind::Delegate, "expert")
    );
    let mut watch_m = watch(&mut server, "m").await;
    server.client.release_task(pb::ReleaseTaskRequest { task_id: "b".into() }).await.unwrap();
    let resolution = watch_m.message().await.unwrap().unwrap().decision.unwrap();
    assert_eq!(resolution.primary_agent_id, "expert");
    assert_eq!(server.get("boss").await.current_workload, 0, "the former slot is given back");
    assert_eq!(server.get("expert").await.current_workload, 2);
    // Offline, or not in the roster: escalated to the requester's senior.
    go_offline(&mut server, "expert").await;
    for (task, agent, why) in [("d", "expert", "is offline"), ("e", "ghost", "is not in the roster")] {
        let decision = server.delegate(assigned(task, agent)).await;
        assert_eq!(
            (Kind::try_from(decision.decision).unwrap(), decision.primary_agent_id.as_str()),
            (Kind::Escalate, "boss")
        );
        assert!(decision.reasoning.contains(why), "{}", decision.reasoning);
    }
    // The audit trail keeps what the roster decided: queue waits and
    // escalations of assigned tasks, not the slot an assigned agent took.
    let recorded = async |server: &mut TestServer, task: &str| {
        let request = pb::ListDelegationsRequest { task_id: task.into(), ..Default::default() };
        server.client.list_delegations(request).await.unwrap().into_inner().records.len()
    };
    assert_eq!(recorded(&mut server, "b").await, 0);
    assert_eq!(recorded(&mut server, "c").await, 2, "queued, then offered the slot");
    assert_eq!(recorded(&mut server, "e").await, 1);
    let too_long = server.client.delegate(assigned("f", &"x".repeat(300))).await.unwrap_err();
    assert_eq!(too_long.code(), tonic::Code::InvalidArgument);
    assert!(too_long.message().contains("assigned_agent_id"), "{}", too_long.message());
    // Asked for only if free, a task names the agent whose slot it wants.
    let unnamed = pb::DelegateRequest { only_if_free: true, ..delegate_request("g", "boss", &["excel"]) };
    let unnamed = server.client.delegate(unnamed).await.unwrap_err();
    assert_eq!(unnamed.code(), tonic::Code::InvalidArgument);
    assert!(unnamed.message().contains("only_if_free: needs assigned_agent_id"), "{}", unnamed.message());
    server.stop().await;
}

async fn a_batch_places_many_tasks_of_one_agent_at_once(backend: Backend) {
    let Some(mut server) = org(backend).await else { return };
    let junior_token = server.agent("junior2", "data", "boss", &["excel"], 5).await;
    let assigned = |task: &str, agent: &str| pb::DelegateRequest {
        task_id: task.into(),
        requester_id: "junior".into(),
        assigned_agent_id: agent.into(),
        ..Default::default()
    };
    // The expert (capacity 2) already holds "held".
    server.delegate(assigned("held", "expert")).await;
    let requests = vec![
        assigned("held", "expert"),
        assigned("t1", "expert"),
        assigned("t2", "expert"),
        assigned("t3", "expert"),
        delegate_request("by-criteria", "boss", &["excel"]),
    ];
    let responses =
        server.client.delegate_batch(pb::DelegateBatchRequest { requests }).await.unwrap().into_inner().responses;
    let decided: Vec<(Kind, String)> = responses
        .iter()
        .map(|response| {
            let decision = response.decision.as_ref().unwrap();
            (Kind::try_from(decision.decision).unwrap(), decision.primary_agent_id.clone())
        })
        .collect();
    assert_eq!(
        decided,
        [
            (Kind::Delegate, "expert".to_owned()),
            (Kind::Delegate, "expert".to_owned()),
            (Kind::Queue, "expert".to_owned()),
            (Kind::Queue, "expert".to_owned()),
            (Kind::Delegate, "junior".to_owned()),
        ],
        "the held task keeps its slot, the one free slot goes to the first, the rest wait"
    );
    assert_eq!(server.get("expert").await.current_workload, 2, "never over capacity");
    // Released, the slots go to the tasks queued in the batch, oldest first.
    let mut watch_t2 = watch(&mut server, "t2").await;
    server.client.release_task(pb::ReleaseTaskRequest { task_id: "held".into() }).await.unwrap();
    assert_eq!(watch_t2.message().await.unwrap().unwrap().decision.unwrap().primary_agent_id, "expert");
    // Many released at once, each as alone: the freed expert slot goes to t3.
    let mut watch_t3 = watch(&mut server, "t3").await;
    let task_ids = vec!["t1".to_owned(), "by-criteria".to_owned(), "never".to_owned()];
    let released =
        server.client.release_tasks(pb::ReleaseTasksRequest { task_ids }).await.unwrap().into_inner().agent_ids;
    assert_eq!(released, ["expert", "junior", ""]);
    assert_eq!(watch_t3.message().await.unwrap().unwrap().decision.unwrap().primary_agent_id, "expert");
    assert_eq!(server.get("expert").await.current_workload, 2, "t2 and t3");
    assert_eq!(server.get("junior").await.current_workload, 0);
    // Two slots of one agent freed together go to the two oldest waiting; a
    // waiting task released with them leaves the queue and is offered nothing.
    for task in ["q1", "q2", "q3"] {
        assert_eq!(server.delegate(assigned(task, "expert")).await.decision, Kind::Queue as i32);
    }
    let (mut watch_q1, mut watch_q2) = (watch(&mut server, "q1").await, watch(&mut server, "q2").await);
    let task_ids = vec!["t2".to_owned(), "q3".to_owned(), "t3".to_owned(), "t2".to_owned()];
    let released =
        server.client.release_tasks(pb::ReleaseTasksRequest { task_ids }).await.unwrap().into_inner().agent_ids;
    assert_eq!(released, ["expert", "", "expert", ""], "a task named twice is released once");
    for watch in [&mut watch_q1, &mut watch_q2] {
        let offered = tokio::time::timeout(std::time::Duration::from_secs(10), watch.message())
            .await
            .expect("a freed slot is offered to each of the two oldest waiting");
        assert_eq!(offered.unwrap().unwrap().decision.unwrap().primary_agent_id, "expert");
    }
    assert_eq!(server.get("expert").await.current_workload, 2, "q1 and q2");
    let released = server
        .client
        .release_tasks(pb::ReleaseTasksRequest { task_ids: vec!["q1".into(), "q2".into()] })
        .await
        .unwrap()
        .into_inner()
        .agent_ids;
    assert_eq!(released, ["expert", "expert"]);
    assert_eq!(server.get("expert").await.current_workload, 0, "q3 left the queue: nobody takes the slots");
    let status = server
        .client
        .release_tasks(pb::ReleaseTasksRequest { task_ids: vec!["a".into(), " ".into()] })
        .await
        .unwrap_err();
    assert!(status.message().contains("task_ids[1]: required"), "{}", status.message());

    // Refused as a whole: a task asked about twice, a dry run, too many, an agent calling.
    let twice = vec![assigned("x", "expert"), assigned("x", "expert")];
    let status = server.client.delegate_batch(pb::DelegateBatchRequest { requests: twice }).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("requests[1]: task_id \"x\" is asked about twice"), "{}", status.message());
    let dry = vec![pb::DelegateRequest { dry_run: true, ..assigned("y", "expert") }];
    let status = server.client.delegate_batch(pb::DelegateBatchRequest { requests: dry }).await.unwrap_err();
    assert!(status.message().contains("requests[0]: a batch takes no dry runs"), "{}", status.message());
    let many: Vec<_> = (0..1001).map(|index| assigned(&format!("m{index}"), "expert")).collect();
    let status = server.client.delegate_batch(pb::DelegateBatchRequest { requests: many }).await.unwrap_err();
    assert_eq!(status.message(), "field requests has more than 1000 elements (the limit)");
    let ids: Vec<String> = (0..1001).map(|index| format!("m{index}")).collect();
    let status = server.client.release_tasks(pb::ReleaseTasksRequest { task_ids: ids }).await.unwrap_err();
    assert_eq!(status.message(), "field task_ids has more than 1000 elements (the limit)");
    let status = server
        .client_as(&junior_token)
        .delegate_batch(pb::DelegateBatchRequest { requests: vec![assigned("z", "expert")] })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    server.stop().await;
}

/// The PlaceTasks stream: each request's releases, then its delegations,
/// answered in order with the request's id; a request refused on its own,
/// the stream going on; a caller that is not a service or an operator refused.
async fn placements_release_then_decide_on_one_stream(backend: Backend) {
    let Some(mut server) = org(backend).await else { return };
    let junior_token = server.agent("junior2", "data", "boss", &["excel"], 5).await;
    let assigned = |task: &str, only_if_free: bool| pb::DelegateRequest {
        task_id: task.into(),
        assigned_agent_id: "expert".into(),
        only_if_free,
        ..Default::default()
    };
    let place = |id: u64, release: &[&str], delegations: Vec<pb::DelegateRequest>| pb::PlaceTasksRequest {
        id,
        release_task_ids: release.iter().map(|task| (*task).to_owned()).collect(),
        delegations,
        trace_parent: String::new(),
    };
    let (requests, outgoing) = tokio::sync::mpsc::unbounded_channel();
    let mut answers = server
        .client
        .place_tasks(tokio_stream::wrappers::UnboundedReceiverStream::new(outgoing))
        .await
        .unwrap()
        .into_inner();
    // The expert (capacity 2) takes two; a third asked only if free is not placed.
    requests.send(place(7, &[], vec![assigned("a", false), assigned("b", false)])).unwrap();
    requests.send(place(8, &[], vec![assigned("c", true)])).unwrap();
    // The same task twice: refused whole, nothing released.
    requests.send(place(9, &["a"], vec![assigned("x", false), assigned("x", false)])).unwrap();
    // Released first, then decided: c finds a's slot.
    requests.send(place(10, &["a", "never"], vec![assigned("c", true)])).unwrap();
    let kinds = |answer: &pb::PlaceTasksResponse| -> Vec<Kind> {
        answer
            .delegations
            .iter()
            .map(|response| Kind::try_from(response.decision.as_ref().unwrap().decision).unwrap())
            .collect()
    };
    let first = answers.message().await.unwrap().unwrap();
    assert_eq!((first.id, kinds(&first), first.refusal), (7, vec![Kind::Delegate, Kind::Delegate], None));
    let second = answers.message().await.unwrap().unwrap();
    assert_eq!((second.id, kinds(&second)), (8, vec![Kind::Queue]));
    let refused = answers.message().await.unwrap().unwrap();
    let refusal = refused.refusal.expect("refused");
    assert_eq!((refused.id, refusal.code), (9, tonic::Code::InvalidArgument as i32));
    assert!(refusal.message.contains("delegations[1]: task_id \"x\" is asked about twice"), "{}", refusal.message);
    assert!(refused.delegations.is_empty() && refused.released_agent_ids.is_empty());
    let placed = answers.message().await.unwrap().unwrap();
    assert_eq!(
        (placed.id, placed.released_agent_ids.as_slice(), kinds(&placed)),
        (10, &["expert".to_owned(), String::new()][..], vec![Kind::Delegate])
    );
    assert_eq!(server.get("expert").await.current_workload, 2, "b and c");
    // A slot freed while a task waits for it goes to that task, not to a
    // delegation asked only if a slot is free.
    requests.send(place(13, &[], vec![assigned("q", false)])).unwrap();
    let queued = answers.message().await.unwrap().unwrap();
    assert_eq!((queued.id, kinds(&queued)), (13, vec![Kind::Queue]));
    let mut watch_q = watch(&mut server, "q").await;
    requests.send(place(14, &["b"], vec![assigned("d", true)])).unwrap();
    let freed = answers.message().await.unwrap().unwrap();
    assert_eq!(
        (freed.id, freed.released_agent_ids.as_slice(), kinds(&freed)),
        (14, &["expert".to_owned()][..], vec![Kind::Queue])
    );
    assert_eq!(watch_q.message().await.unwrap().unwrap().decision.unwrap().primary_agent_id, "expert");
    assert_eq!(server.get("expert").await.current_workload, 2, "c and q");
    // An unknown requester is named; a task id left empty too.
    let unknown = pb::DelegateRequest { requester_id: "ghost".into(), ..assigned("g", false) };
    requests.send(place(11, &[" "], Vec::new())).unwrap();
    requests.send(place(12, &[], vec![unknown])).unwrap();
    let empty = answers.message().await.unwrap().unwrap().refusal.unwrap();
    assert!(empty.message.contains("release_task_ids[0]: required"), "{}", empty.message);
    let ghost = answers.message().await.unwrap().unwrap().refusal.unwrap();
    assert_eq!(ghost.code, tonic::Code::NotFound as i32, "{}", ghost.message);
    // Over the limit: the stream ends with the status.
    let many: Vec<String> = (0..1001).map(|index| format!("m{index}")).collect();
    requests.send(pb::PlaceTasksRequest { release_task_ids: many, ..Default::default() }).unwrap();
    let status = answers.message().await.unwrap_err();
    assert_eq!(status.message(), "field release_task_ids has more than 1000 elements (the limit)");
    drop(requests);
    // An agent may not open the stream.
    let (_requests, outgoing) = tokio::sync::mpsc::unbounded_channel::<pb::PlaceTasksRequest>();
    let status = server
        .client_as(&junior_token)
        .place_tasks(tokio_stream::wrappers::UnboundedReceiverStream::new(outgoing))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    server.stop().await;
}

/// A queued task's wait comes from how long the expert's tasks took: the
/// configured average (30 minutes here) until one ended, then the expert's
/// own moving figure.
async fn waits_are_estimated_from_what_the_agent_took(backend: Backend) {
    let Some(mut server) = org(backend).await else { return };
    for task in ["a", "b"] {
        assert_eq!(server.delegate(delegate_request(task, "junior", &["sql"])).await.primary_agent_id, "expert");
    }
    let before = server.delegate(delegate_request("c", "junior", &["sql"])).await;
    assert_eq!(Kind::try_from(before.decision).unwrap(), Kind::Queue);
    assert_eq!(
        before.estimated_wait.map(|wait| wait.seconds).unwrap_or_default(),
        1800,
        "no task of the expert ended yet"
    );
    server.client.release_task(pb::ReleaseTaskRequest { task_id: "c".into() }).await.unwrap();

    // Task a took ten minutes; b, released with it, as long.
    server.clock.advance(10 * 60_000);
    let released = pb::ReleaseTasksRequest { task_ids: vec!["a".into(), "b".into()] };
    server.client.release_tasks(released).await.unwrap();
    for task in ["d", "e"] {
        assert_eq!(server.delegate(delegate_request(task, "junior", &["sql"])).await.primary_agent_id, "expert");
    }
    let queued = server.delegate(delegate_request("f", "junior", &["sql"])).await;
    assert_eq!(Kind::try_from(queued.decision).unwrap(), Kind::Queue);
    assert_eq!(queued.estimated_wait.map(|wait| wait.seconds).unwrap_or_default(), 600, "one of the expert's tasks");
    let behind = server.delegate(delegate_request("g", "boss", &["sql"])).await;
    assert_eq!(behind.estimated_wait.map(|wait| wait.seconds).unwrap_or_default(), 1200, "one queued ahead");

    // d took twenty minutes: the figure moves a fifth of the way (10 → 12 minutes).
    server.clock.advance(20 * 60_000);
    server.client.release_task(pb::ReleaseTaskRequest { task_id: "d".into() }).await.unwrap();
    for task in ["f", "g"] {
        server.client.release_task(pb::ReleaseTaskRequest { task_id: task.into() }).await.unwrap();
    }
    assert_eq!(server.delegate(delegate_request("h", "junior", &["sql"])).await.primary_agent_id, "expert");
    let later = server.delegate(delegate_request("i", "junior", &["sql"])).await;
    assert_eq!(Kind::try_from(later.decision).unwrap(), Kind::Queue);
    assert_eq!(later.estimated_wait.map(|wait| wait.seconds).unwrap_or_default(), 720);
}

#[tokio::test]
async fn waits_are_estimated_from_what_the_agent_took_on_sqlite() {
    waits_are_estimated_from_what_the_agent_took(Backend::Sqlite).await;
}

#[tokio::test]
async fn waits_are_estimated_from_what_the_agent_took_on_postgres() {
    waits_are_estimated_from_what_the_agent_took(Backend::Postgres).await;
}

#[tokio::test]
async fn release_offers_the_slot_to_the_oldest_queued_task_on_sqlite() {
    release_offers_the_slot_to_the_oldest_queued_task(Backend::Sqlite).await;
}

#[tokio::test]
async fn release_offers_the_slot_to_the_oldest_queued_task_on_postgres() {
    release_offers_the_slot_to_the_oldest_queued_task(Backend::Postgres).await;
}

#[tokio::test]
async fn stale_queued_tasks_are_escalated_on_sqlite() {
    stale_queued_tasks_are_escalated(Backend::Sqlite).await;
}

#[tokio::test]
async fn stale_queued_tasks_are_escalated_on_postgres() {
    stale_queued_tasks_are_escalated(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_delegations_take_the_last_slot_once_on_sqlite() {
    concurrent_delegations_take_the_last_slot_once(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_delegations_take_the_last_slot_once_on_postgres() {
    concurrent_delegations_take_the_last_slot_once(Backend::Postgres).await;
}

#[tokio::test]
async fn a_task_assigned_to_an_agent_waits_for_its_slot_or_escalates_on_sqlite() {
    a_task_assigned_to_an_agent_waits_for_its_slot_or_escalates(Backend::Sqlite).await;
}

#[tokio::test]
async fn a_task_assigned_to_an_agent_waits_for_its_slot_or_escalates_on_postgres() {
    a_task_assigned_to_an_agent_waits_for_its_slot_or_escalates(Backend::Postgres).await;
}

#[tokio::test]
async fn placements_release_then_decide_on_one_stream_on_sqlite() {
    placements_release_then_decide_on_one_stream(Backend::Sqlite).await;
}

#[tokio::test]
async fn placements_release_then_decide_on_one_stream_on_postgres() {
    placements_release_then_decide_on_one_stream(Backend::Postgres).await;
}

#[tokio::test]
async fn a_batch_places_many_tasks_of_one_agent_at_once_on_sqlite() {
    a_batch_places_many_tasks_of_one_agent_at_once(Backend::Sqlite).await;
}

#[tokio::test]
async fn a_batch_places_many_tasks_of_one_agent_at_once_on_postgres() {
    a_batch_places_many_tasks_of_one_agent_at_once(Backend::Postgres).await;
}

/// A task queued through one replica and resolved through another: the
/// watcher on the first hears of it (from the database, within a second).
async fn a_resolution_on_another_replica_reaches_the_watcher(backend: Backend) {
    let Some(mut first) = org(backend).await else { return };
    let mut second = first.replica().await;
    for task in ["a", "b"] {
        assert_eq!(first.delegate(delegate_request(task, "junior", &["sql"])).await.primary_agent_id, "expert");
    }
    first.clock.advance(1000);
    let queued = first.delegate(delegate_request("c", "junior", &["sql"])).await;
    assert_eq!(Kind::try_from(queued.decision).unwrap(), Kind::Queue);
    let mut watch_c = watch(&mut first, "c").await;
    let released =
        second.client.release_task(pb::ReleaseTaskRequest { task_id: "a".into() }).await.unwrap().into_inner();
    assert_eq!(released.agent_id, "expert");
    let resolution = tokio::time::timeout(std::time::Duration::from_secs(20), watch_c.message())
        .await
        .expect("the resolution made on the other replica reaches the watcher")
        .unwrap()
        .unwrap()
        .decision
        .unwrap();
    assert_eq!(Kind::try_from(resolution.decision).unwrap(), Kind::Delegate);
    assert_eq!(resolution.primary_agent_id, "expert");
    second.stop().await;
    first.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resolution_on_another_replica_reaches_the_watcher_on_sqlite() {
    a_resolution_on_another_replica_reaches_the_watcher(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resolution_on_another_replica_reaches_the_watcher_on_postgres() {
    a_resolution_on_another_replica_reaches_the_watcher(Backend::Postgres).await;
}
