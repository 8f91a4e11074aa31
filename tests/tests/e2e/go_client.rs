//! The Go client: `proto/buf.gen.go.yaml` generates it with Debian's
//! `protoc-gen-go` and `protoc-gen-go-grpc`, Debian's Go builds
//! `clients/go/example` against it (GOPATH mode over Debian's Go sources,
//! `/usr/share/gocode`), and the program serves one agent as a worker,
//! publishes a process, starts it and watches it complete on a real cluster.
//!
//! Needs `go`, the two plugins and `buf` (`MUSTER_GO`, `MUSTER_BUF`; `.ci/run`
//! installs them): without them the test says so and passes, except under
//! `CI=true`.

use muster_tests::{Backend, TestCluster, agent};

use super::clients::{repository, tool};

const PROCESS: &str = "name: go-example\nsteps:\n  - id: greet\n    type: agent_task\n    agent: go-agent\n    message: hello\n  - id: answer\n    type: agent_task\n    agent: go-agent\n    message: and goodbye\n    depends_on: [greet]\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_go_client_serves_an_agent_and_runs_a_process() {
    let Some(go) = tool("MUSTER_GO", "go", &["version"]) else { return };
    let Some(buf) = tool("MUSTER_BUF", "buf", &["--version"]) else { return };
    for plugin in ["protoc-gen-go", "protoc-gen-go-grpc"] {
        if tool(&format!("MUSTER_{}", plugin.to_uppercase().replace('-', "_")), plugin, &["--version"]).is_none() {
            return;
        }
    }
    let Some(test) = TestCluster::start(Backend::Sqlite).await else { return };
    let tokens = test.register_agents(&[agent("go-agent", "writer", "go-team")]).await;

    // Generated into a GOPATH of the test's own, beside the example.
    let gopath = test.data_dir.join("go");
    let module = gopath.join("src/example.com/muster");
    std::fs::create_dir_all(module.join("example")).unwrap();
    std::fs::copy(repository().join("clients/go/example/main.go"), module.join("example/main.go")).unwrap();
    let generated = std::process::Command::new(&buf)
        .args(["generate", "--template", "buf.gen.go.yaml", "--output"])
        .arg(&module)
        .current_dir(repository().join("proto"))
        .output()
        .unwrap();
    assert!(generated.status.success(), "buf generate: {}", String::from_utf8_lossy(&generated.stderr));
    assert!(module.join("gen/go/muster/execution/v1/execution_grpc.pb.go").exists());

    // The build cache is kept with cargo's, so a second run compiles little.
    let binary = gopath.join("example");
    let built = std::process::Command::new(&go)
        .args(["build", "-o"])
        .arg(&binary)
        .arg("example.com/muster/example")
        .env("GO111MODULE", "off")
        .env("GOPATH", format!("{}:/usr/share/gocode", gopath.display()))
        .env("GOCACHE", repository().join("target/go-cache"))
        .current_dir(&module)
        .output()
        .unwrap();
    assert!(built.status.success(), "go build: {}", String::from_utf8_lossy(&built.stderr));

    let process = test.data_dir.join("go-example.yaml");
    std::fs::write(&process, PROCESS).unwrap();
    let operator = std::fs::read_to_string(test.data_dir.join(muster::credentials::OPERATOR_TOKEN_FILE)).unwrap();
    let run = tokio::process::Command::new(&binary)
        .env("MUSTER_EXECUTION_ADDR", test.cluster().execution_url().trim_start_matches("http://"))
        .env("MUSTER_TOKEN", operator.trim())
        .env("MUSTER_AGENT_ID", "go-agent")
        .env("MUSTER_AGENT_TOKEN", &tokens[0])
        .env("MUSTER_PROCESS_FILE", &process)
        .kill_on_drop(true)
        .output();
    let run =
        tokio::time::timeout(std::time::Duration::from_secs(90), run).await.expect("the Go example ends").unwrap();
    let printed = format!("{}{}", String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    eprintln!("{printed}");
    assert!(run.status.success(), "{printed}");
    for line in [
        "worker welcomed as",
        "published go-example version 1",
        "event STEP_COMPLETED greet",
        "event EXECUTION_FINISHED",
        "finished: COMPLETED",
        "step greet: hello, from Go",
        "step answer: and goodbye, from Go",
    ] {
        assert!(printed.contains(line), "missing {line:?} in:\n{printed}");
    }
    test.shutdown().await;
}
