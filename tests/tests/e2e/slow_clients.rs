//! Slow and silent clients hold nothing for long: requests whose bodies
//! never finish end with DEADLINE_EXCEEDED, answers nobody reads are ended,
//! connections that never speak HTTP/2 are closed, and no caller takes more
//! than its share of the read slots (docs/security.md, "Slow and silent
//! clients"). The bounds are set short through the services' environment.

use std::time::Duration;

use bytes::Bytes;
use muster_proto::execution::v1::{ListExecutionsRequest, ListProcessesRequest};
use muster_tests::{Backend, TestCluster, agent, as_agent};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpStream,
};

/// Four read slots (one each for four callers), short bounds.
async fn cluster() -> Option<TestCluster> {
    let environment = [
        ("MUSTER_MAX_READS_IN_FLIGHT", "4"),
        ("MUSTER_MAX_WATCHES_OPENING", "4"),
        ("MUSTER_REQUEST_BODY_TIMEOUT_MS", "1500"),
        ("MUSTER_RESPONSE_IDLE_TIMEOUT_MS", "6000"),
        ("MUSTER_HANDSHAKE_TIMEOUT_MS", "500"),
    ];
    TestCluster::start_with_environment(
        Backend::Sqlite,
        environment.iter().map(|(name, value)| ((*name).to_owned(), (*value).to_owned())).collect(),
    )
    .await
}

/// The execution service's address.
fn execution_address(test: &TestCluster) -> String {
    test.cluster().execution_url().trim_start_matches("http://").trim_end_matches('/').to_owned()
}

/// An HTTP/2 connection of our own to the execution service, whose streams
/// get `window` bytes of flow control (0: answers cannot be sent).
async fn raw_connection(test: &TestCluster, window: u32) -> h2::client::SendRequest<Bytes> {
    let tcp = TcpStream::connect(execution_address(test)).await.expect("connecting");
    let (send, connection) =
        h2::client::Builder::new().initial_window_size(window).handshake(tcp).await.expect("the HTTP/2 handshake");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    send
}

/// The headers of a call of the execution service's `method` with `token`.
fn grpc_request(method: &str, token: &str) -> http::Request<()> {
    http::Request::post(format!("http://muster/muster.execution.v1.ExecutionService/{method}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("authorization", format!("Bearer {token}"))
        .body(())
        .expect("a request")
}

/// Opens a call of `method` with `token`, whose request body is one message
/// header announcing 10 bytes, and never the bytes: a body that never ends.
async fn open_unfinished(
    send: &mut h2::client::SendRequest<Bytes>,
    method: &str,
    token: &str,
) -> (h2::client::ResponseFuture, h2::SendStream<Bytes>) {
    let request = grpc_request(method, token);
    let mut ready = send.clone().ready().await.expect("a stream");
    let (response, mut body) = ready.send_request(request, false).expect("sending the headers");
    body.send_data(Bytes::from_static(&[0, 0, 0, 0, 10, 0x0a]), false).expect("sending part of a message");
    *send = ready;
    (response, body)
}

/// The grpc-status a call ended with: from its headers (a refusal) or its trailers.
async fn grpc_status(response: h2::client::ResponseFuture) -> Option<i32> {
    let response = response.await.ok()?;
    let from = |headers: &http::HeaderMap| {
        headers.get("grpc-status").and_then(|value| value.to_str().ok()).and_then(|value| value.parse().ok())
    };
    if let Some(status) = from(response.headers()) {
        return Some(status);
    }
    let mut body = response.into_body();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.ok()?;
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    body.trailers().await.ok().flatten().as_ref().and_then(from)
}

fn is_shed(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::ResourceExhausted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_that_never_finish_hold_no_one_elses_reads_and_end_with_deadline_exceeded() {
    let Some(test) = cluster().await else { return };
    let tokens = test.register_agents(&[agent("slow", "worker", "team"), agent("other", "worker", "team")]).await;
    let (slow, other) = (&tokens[0], &tokens[1]);

    // Four reads and four watches from one agent, their requests never whole.
    let mut send = raw_connection(&test, 1 << 20).await;
    let mut reads = Vec::new();
    for method in ["ListProcesses", "ListProcesses", "ListProcesses", "ListProcesses"] {
        reads.push(open_unfinished(&mut send, method, slow).await);
    }
    let mut watches = Vec::new();
    for _ in 0..4 {
        watches.push(open_unfinished(&mut send, "WatchExecution", slow).await);
    }
    // The slow agent holds its share; the operator's reads and the other
    // agent's still pass (a few tries: the calls above arrive meanwhile).
    let mut operator = test.execution();
    let mut other_agent = test.execution_as(other);
    for _ in 0..5 {
        let listed = operator.list_executions(ListExecutionsRequest::default()).await;
        assert!(listed.is_ok(), "the operator's read was refused: {listed:?}");
        let listed = other_agent.list_processes(as_agent(ListProcessesRequest::default(), other)).await;
        assert!(listed.is_ok(), "another agent's read was refused: {listed:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut slow_agent = test.execution_as(slow);
    let refused = slow_agent.list_processes(as_agent(ListProcessesRequest::default(), slow)).await;
    assert!(refused.as_ref().is_err_and(is_shed), "past its share, the slow agent is shed: {refused:?}");

    // Each slow call ends: DEADLINE_EXCEEDED for those that held a slot,
    // RESOURCE_EXHAUSTED at once for those past the agent's share.
    let mut deadlines = 0;
    for (response, _body) in reads.into_iter().chain(watches) {
        let status = tokio::time::timeout(Duration::from_secs(20), grpc_status(response))
            .await
            .expect("a call whose request never finishes is ended");
        match status {
            Some(4) => deadlines += 1,
            Some(8) => {}
            other => panic!("a slow call ended with grpc-status {other:?}"),
        }
    }
    assert!(deadlines >= 2, "the read and the watch that held slots end with DEADLINE_EXCEEDED ({deadlines})");
    // Their slots are free again.
    let listed = slow_agent.list_processes(as_agent(ListProcessesRequest::default(), slow)).await;
    assert!(listed.is_ok(), "the slow agent reads again once its calls ended: {listed:?}");
    test.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_nobody_reads_are_ended_and_free_their_slots() {
    let Some(test) = cluster().await else { return };
    let tokens = test.register_agents(&[agent("deaf", "worker", "team")]).await;
    let deaf = &tokens[0];
    // The agent's client connected and its credential known before the
    // stuck answer's clock starts: on a busy machine a first call can take
    // longer than the idle timeout.
    let mut client = test.execution_as(deaf);
    client.list_processes(as_agent(ListProcessesRequest::default(), deaf)).await.expect("a first read");

    // A whole request, on a connection whose window lets no answer through.
    // It is asked again if it was shed because the first read's slot was
    // not given back yet (a shed answer is headers only, which flow control
    // lets through).
    let mut send = raw_connection(&test, 0).await;
    let mut stuck = None;
    for _ in 0..40 {
        let mut ready = send.clone().ready().await.expect("a stream");
        let request = grpc_request("ListProcesses", deaf);
        let (mut response, mut body) = ready.send_request(request, false).expect("sending the headers");
        body.send_data(Bytes::from_static(&[0, 0, 0, 0, 0]), true).expect("sending an empty message");
        send = ready;
        match tokio::time::timeout(Duration::from_millis(300), &mut response).await {
            Ok(Ok(head)) if head.headers().get("grpc-status").is_some_and(|status| status == "8") => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            _ => {
                stuck = Some(response);
                break;
            }
        }
    }
    let response = stuck.expect("the stuck request is taken (not shed) once the first read is done");

    // While the answer waits, it holds the agent's one slot (6 s: time
    // enough for the stuck request to arrive and for probes on a loaded
    // machine)...
    let mut held = false;
    for _ in 0..160 {
        match client.list_processes(as_agent(ListProcessesRequest::default(), deaf)).await {
            Err(status) if is_shed(&status) => {
                held = true;
                break;
            }
            _ => tokio::time::sleep(Duration::from_millis(25)).await,
        }
    }
    assert!(held, "the unread answer holds its caller's slot");
    // One caller at its own share is not the service's overload: health
    // stays SERVING (a greedy agent must not take the pod out of its Service).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let channel = test.operator("execution").channel().expect("a channel");
    let health = tonic_health::pb::health_client::HealthClient::new(channel)
        .check(tonic_health::pb::HealthCheckRequest { service: String::new() })
        .await
        .expect("a health check");
    assert_eq!(
        health.into_inner().status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32,
        "health stays SERVING while one caller is refused its share"
    );
    // ...until it is ended, with its connection, and the slot is free.
    let ended = tokio::time::timeout(Duration::from_secs(20), async {
        let response = response.await;
        if let Ok(response) = response {
            let mut answer = response.into_body();
            while let Some(Ok(_)) = answer.data().await {}
        }
    })
    .await;
    assert!(ended.is_ok(), "an answer nobody reads is ended");
    let mut freed = false;
    for _ in 0..100 {
        if client.list_processes(as_agent(ListProcessesRequest::default(), deaf)).await.is_ok() {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(freed, "the ended answer's slot is free");
    drop(send);
    test.shutdown().await;
}

/// The frames the server sends first, read until `deadline` or the end.
async fn server_frames(stream: &mut TcpStream, deadline: Duration) -> (Vec<u8>, bool) {
    let mut received = Vec::new();
    let mut buffer = [0_u8; 4096];
    let closed = tokio::time::timeout(deadline, async {
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(read) => received.extend_from_slice(&buffer[..read]),
            }
        }
    })
    .await
    .is_ok();
    (received, closed)
}

/// The value of `setting` in the first SETTINGS frame of `frames`.
fn setting(frames: &[u8], setting: u16) -> Option<u32> {
    let mut rest = frames;
    while rest.len() >= 9 {
        let length = u32::from_be_bytes([0, rest[0], rest[1], rest[2]]) as usize;
        let (kind, flags) = (rest[3], rest[4]);
        let payload = rest.get(9..9 + length)?;
        if kind == 4 && flags & 1 == 0 {
            return payload.chunks_exact(6).find_map(|entry| {
                (u16::from_be_bytes([entry[0], entry[1]]) == setting)
                    .then(|| u32::from_be_bytes([entry[2], entry[3], entry[4], entry[5]]))
            });
        }
        rest = &rest[9 + length..];
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_are_closed_and_the_stream_limit_is_advertised() {
    let Some(test) = cluster().await else { return };
    let address = execution_address(&test);

    // A connection that never sends the preface is closed by the server.
    let mut silent = TcpStream::connect(&address).await.expect("connecting");
    let (_, closed) = server_frames(&mut silent, Duration::from_secs(20)).await;
    assert!(closed, "a connection that never speaks HTTP/2 is closed");

    // One that speaks is told how many streams it may open.
    let mut speaking = TcpStream::connect(&address).await.expect("connecting");
    speaking.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.expect("the preface");
    speaking.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.expect("empty SETTINGS");
    let mut frames = Vec::new();
    for _ in 0..50 {
        let (received, _) = server_frames(&mut speaking, Duration::from_millis(100)).await;
        frames.extend(received);
        if setting(&frames, 3).is_some() || frames.len() >= 9 {
            break;
        }
    }
    assert_eq!(setting(&frames, 3), Some(256), "SETTINGS_MAX_CONCURRENT_STREAMS is advertised");
    test.shutdown().await;
}
