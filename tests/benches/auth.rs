//! What authentication and authorization cost per call, with and without:
//!
//! 1. the authenticator alone, for each kind of credential (agents looked up
//!    in a copy of 100,000 agents' credentials);
//! 2. the authentication layer around a service that answers at once, in
//!    process, against the bare service;
//! 3. a unary call (`ValidateProcess` of a one-line document) over gRPC on
//!    loopback, to a server with the layer and to one without;
//! 4. the checks inside the execution service's handlers, over gRPC to the
//!    real cluster: `GetExecution` of a 1,000-step execution as an operator
//!    (no finer check) and as an agent that takes part in it only through
//!    its last step (the whole "takes part" check), and `CheckRole` (the
//!    permission matrix and nothing else).
//!
//! `cargo bench -p muster-tests --bench auth` (AUTH_BENCH_ITERATIONS, default 20,000;
//! AUTH_BENCH_AGENTS, default 100,000).

use std::{
    convert::Infallible,
    sync::Arc,
    time::{Duration, Instant},
};

use muster_proto::{
    execution::v1::{CheckRoleRequest, GetExecutionRequest, PublishProcessRequest, StartExecutionRequest},
    validator::v1::{
        ValidateProcessRequest, validator_service_client::ValidatorServiceClient,
        validator_service_server::ValidatorServiceServer,
    },
};
use muster_runtime::{
    auth::{
        AgentDirectory, AuthArgs, AuthLayer, Authenticator, Secret, TokenHash,
        client::{Credentials, with_credentials},
        directory::CredentialChange,
        layer::Rules,
        token,
    },
    testing::TestCredentials,
};
use tower::{Layer as _, Service as _, ServiceExt as _};

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|value| value.parse().ok()).unwrap_or(default)
}

/// Times `calls` runs of `call`, after a warm-up.
async fn time<F: Future<Output = ()>>(calls: usize, mut call: impl FnMut() -> F) -> Vec<Duration> {
    for _ in 0..100 {
        call().await;
    }
    let mut samples = Vec::with_capacity(calls);
    for _ in 0..calls {
        let started = Instant::now();
        call().await;
        samples.push(started.elapsed());
    }
    samples
}

fn report(name: &str, mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    let at = |fraction: f64| samples[((samples.len() as f64 * fraction) as usize).min(samples.len() - 1)];
    let (p50, p99) = (at(0.50), at(0.99));
    println!("{name:<58} n={:<6} p50={p50:>10.2?} p99={p99:>10.2?}", samples.len());
    p50
}

const METHOD: &str = "/muster.validator.v1.ValidatorService/ValidateProcess";

/// An authenticator that knows an operator, the service secret and `agents` agents.
fn authenticator(credentials: &TestCredentials, agents: usize) -> (Arc<Authenticator>, String) {
    let directory = AgentDirectory::new(Duration::from_secs(3600));
    let mut changes = Vec::with_capacity(agents);
    let mut last_token = String::new();
    for index in 0..agents {
        last_token = token::generate(token::AGENT_PREFIX).expect("random source");
        changes.push(CredentialChange {
            token: TokenHash::of(&last_token),
            agent_id: format!("agent-{index:06}"),
            role: "member".into(),
            active: true,
            revision: index as u64 + 1,
        });
    }
    directory.apply(&changes);
    directory.caught_up();
    let args = AuthArgs {
        operators: Some(Secret(format!("bench:{}", TokenHash::of(&credentials.operator_token).to_hex()))),
        service_secret: Some(Secret(credentials.service_secret.clone())),
        ..AuthArgs::default()
    };
    (Arc::new(Authenticator::new(&args, directory, false).expect("an authenticator")), last_token)
}

fn rules() -> Rules {
    let mut rules = Rules::default();
    rules.add("muster.validator.v1.ValidatorService", muster_validator::ACCESS);
    rules
}

fn request(authorization: Option<&str>) -> http::Request<tonic::body::Body> {
    let mut request = http::Request::builder().uri(format!("http://localhost{METHOD}"));
    if let Some(token) = authorization {
        request = request.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    request.body(tonic::body::Body::empty()).expect("a request")
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let iterations = setting("AUTH_BENCH_ITERATIONS", 20_000);
    let agents = setting("AUTH_BENCH_AGENTS", 100_000);
    let credentials = TestCredentials::new();
    let (authenticator, agent_token) = authenticator(&credentials, agents);
    let service_token = credentials.service_token("execution");
    let callers =
        [("operator", credentials.operator_token.clone()), ("agent", agent_token), ("service", service_token)];
    println!("auth bench: {agents} agents' credentials, {iterations} calls per measure");

    // 1. The authenticator alone.
    for (kind, token) in &callers {
        let request = request(Some(token));
        let mut samples = Vec::with_capacity(iterations);
        for _ in 0..iterations {
            let started = Instant::now();
            let caller = authenticator.authenticate(request.headers(), request.extensions());
            samples.push(started.elapsed());
            assert!(caller.is_ok());
        }
        report(&format!("authenticate ({kind})"), samples);
    }

    // 2. The layer around a service that answers at once, against the bare service.
    let answer = tower::service_fn(|_request: http::Request<tonic::body::Body>| async {
        Ok::<_, Infallible>(http::Response::new(tonic::body::Body::empty()))
    });
    let mut bare = answer;
    let mut samples = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let request = request(Some(&callers[0].1));
        let started = Instant::now();
        let response = bare.ready().await.expect("ready").call(request).await;
        samples.push(started.elapsed());
        assert!(response.is_ok());
    }
    let without = report("in process, without the layer", samples);
    let mut layered = AuthLayer::new(authenticator.clone(), rules()).layer(answer);
    for (kind, token) in &callers {
        let mut samples = Vec::with_capacity(iterations);
        for _ in 0..iterations {
            let request = request(Some(token));
            let started = Instant::now();
            let response = layered.ready().await.expect("ready").call(request).await;
            samples.push(started.elapsed());
            assert!(response.expect("a response").headers().get("grpc-status").is_none(), "admitted");
        }
        let with = report(&format!("in process, with the layer ({kind})"), samples);
        println!("{:<58} {:>10.2?}", "  the layer's cost (p50 difference)", with.saturating_sub(without));
    }

    // 3. A unary call over loopback, to a server without the layer and to one with it.
    let document = ValidateProcessRequest { source: "name: p\nsteps: []\n".into(), ..Default::default() };
    let calls = iterations / 4;
    let serve = |layered: bool| {
        let authenticator = authenticator.clone();
        async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let address = listener.local_addr().expect("address");
            let service =
                ValidatorServiceServer::new(muster_validator::ValidatorGrpc::new(muster_format::Limits::default()));
            let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
            tokio::spawn(async move {
                let mut builder = tonic::transport::Server::builder();
                let served = if layered {
                    builder
                        .layer(AuthLayer::new(authenticator, rules()))
                        .add_service(service)
                        .serve_with_incoming(incoming)
                        .await
                } else {
                    builder.add_service(service).serve_with_incoming(incoming).await
                };
                served.expect("serving");
            });
            format!("http://{address}")
        }
    };
    for (name, layered, caller) in [
        ("gRPC loopback, without the layer", false, None),
        ("gRPC loopback, with the layer (operator)", true, Some(0)),
        ("gRPC loopback, with the layer (agent)", true, Some(1)),
        ("gRPC loopback, with the layer (service)", true, Some(2)),
    ] {
        let url = serve(layered).await;
        let channel = tonic::transport::Endpoint::from_shared(url)
            .expect("a URL")
            .tcp_nodelay(true)
            .connect()
            .await
            .expect("connect");
        let credentials =
            caller.map_or_else(Credentials::none, |index| Credentials::bearer(&callers[index].1).expect("a token"));
        let client = ValidatorServiceClient::new(with_credentials(channel, credentials));
        let samples = time(calls, || {
            let mut client = client.clone();
            let document = document.clone();
            async move {
                client.validate_process(document).await.expect("validate");
            }
        })
        .await;
        report(name, samples);
    }

    // 4. The execution service's own checks, on the real cluster.
    handler_checks(calls).await;
}

async fn handler_checks(calls: usize) {
    let Some(test) = muster_tests::TestCluster::start(muster_tests::Backend::Sqlite).await else { return };
    let tokens = test
        .register_agents(&[
            muster_tests::agent("first", "member", "core"),
            muster_tests::agent("last", "reviewer", "core"),
        ])
        .await;
    let mut operator = test.execution();
    let mut source = "name: wide\nmax_parallel: 1\nsteps:\n".to_owned();
    for index in 0..999 {
        source.push_str(&format!("  - {{id: s{index}, type: agent_task, agent: first, message: m}}\n"));
    }
    source.push_str("  - {id: end, type: agent_task, agent: last, message: m}\n");
    operator.publish_process(PublishProcessRequest { source, file_name: String::new() }).await.expect("publish");
    let execution = operator
        .start_execution(StartExecutionRequest { process_name: "wide".into(), ..Default::default() })
        .await
        .expect("start")
        .into_inner()
        .execution
        .expect("an execution");
    let get = GetExecutionRequest { id: execution.id.clone() };
    let as_agent = test.execution_as(&tokens[1]);
    let mut p50 = Vec::new();
    for (name, client) in [("operator", operator.clone()), ("agent", as_agent.clone())] {
        let samples = time(calls / 5, || {
            let mut client = client.clone();
            let get = get.clone();
            async move {
                client.get_execution(get).await.expect("get");
            }
        })
        .await;
        p50.push(report(&format!("GetExecution, 1,000 steps, gRPC loopback ({name})"), samples));
    }
    println!("{:<58} {:>10.2?}", "  the agent's checks (p50 difference)", p50[1].saturating_sub(p50[0]));
    let check =
        CheckRoleRequest { execution_id: execution.id.clone(), action: "approve".into(), agent_id: String::new() };
    let samples = time(calls, || {
        let mut client = as_agent.clone();
        let check = check.clone();
        async move {
            assert!(client.check_role(check).await.expect("check").into_inner().allowed);
        }
    })
    .await;
    report("CheckRole in a 1,000-step execution, gRPC loopback (agent)", samples);
    test.shutdown().await;
}
