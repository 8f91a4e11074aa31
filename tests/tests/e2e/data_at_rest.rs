//! Data at rest is its owner's alone, whatever the umask: the data folder
//! `muster up` makes and everything in it, its logs, token and port files,
//! the services' SQLite files (with their `-wal` and `-shm`) and the
//! notifier's memory; data an older cluster left wider is narrowed when the
//! cluster starts again. And the execution service's SQLite write-ahead
//! log, grown by a burst of runs, is emptied once the service is idle.

use std::{
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    time::Duration,
};

use muster::{cluster::Cluster, worker::AgentCredential};
use muster_proto::execution::v1::{PublishProcessRequest, StartExecutionRequest};
use muster_tests::{Backend, TestCluster, agent, chain_process, events_until_finished, spawn_sample_worker};

/// Runs at once, of ten steps each.
const BURST: usize = 40;
const STEPS: usize = 10;

/// Every folder and file beneath `root` (and `root`) whose mode is not
/// 0700 (folders) or 0600 (files), with its mode.
fn wider_than_private(root: &Path) -> Vec<(PathBuf, u32)> {
    let mut wider = Vec::new();
    let mut folders = vec![root.to_owned()];
    while let Some(folder) = folders.pop() {
        let mode = std::fs::metadata(&folder).unwrap().permissions().mode() & 0o777;
        if mode != 0o700 {
            wider.push((folder.clone(), mode));
        }
        for entry in std::fs::read_dir(&folder).unwrap() {
            let entry = entry.unwrap();
            // A file SQLite removed meanwhile (a closed -wal) has no mode.
            let Ok(metadata) = std::fs::symlink_metadata(entry.path()) else { continue };
            if metadata.is_dir() {
                folders.push(entry.path());
            } else if metadata.permissions().mode() & 0o777 != 0o600 {
                wider.push((entry.path(), metadata.permissions().mode() & 0o777));
            }
        }
    }
    wider
}

fn widen(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_data_folder_is_private_and_the_log_is_emptied_when_idle() {
    // What a login shell gives: files 0644, folders 0755, unless the
    // cluster and the services see to it.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
    let Some(mut test) = TestCluster::start(Backend::Sqlite).await else { return };
    let tokens = test.register_agents(&[agent("doer", "worker", "team"), agent("watcher", "worker", "team")]).await;
    let credentials = vec![AgentCredential { agent_id: "doer".to_owned(), token: tokens[0].clone() }];
    let (stop, worker) = spawn_sample_worker(test.operator("execution"), credentials);

    // A burst of runs: steps, events, the watcher's memory.
    let mut client = test.execution();
    let source = chain_process("burst", STEPS, "doer", "watcher", "{}");
    client.publish_process(PublishProcessRequest { source, file_name: String::new() }).await.unwrap();
    let mut runs = tokio::task::JoinSet::new();
    for _ in 0..BURST {
        let (mut client, execution) = (test.execution(), test.operator("execution"));
        runs.spawn(async move {
            let request = StartExecutionRequest { process_name: "burst".to_owned(), ..Default::default() };
            let id = client.start_execution(request).await.unwrap().into_inner().execution.unwrap().id;
            events_until_finished(&execution, &id).await.pop().unwrap()
        });
    }
    let mut last = None;
    while let Some(finished) = runs.join_next().await {
        last = Some(finished.unwrap());
    }
    let last = last.unwrap();
    let notifier = test.operator("notifier");
    muster::inbox::wait_for_event(&notifier, "watcher", &last.event_id, Duration::from_secs(60)).await.unwrap();
    assert!(test.cluster().memory_dir().join("watcher").exists(), "the watcher's memory is written");

    let data_dir = test.data_dir.clone();
    assert_eq!(wider_than_private(&data_dir), [], "everything in the data folder is its owner's alone");

    // Once idle, the execution service's write-ahead log is emptied.
    let wal = data_dir.join("execution.db-wal");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let size = std::fs::metadata(&wal).map_or(0, |metadata| metadata.len());
        if size <= 1024 * 1024 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the write-ahead log stayed at {size} bytes once idle");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = stop.send(());
    let _ = worker.await;

    // Left wider by an older cluster: narrowed when the cluster starts again.
    let cluster = test.cluster.take().unwrap();
    let options = cluster.options.clone();
    cluster.shutdown().await.unwrap();
    widen(&data_dir, 0o755);
    widen(&data_dir.join("logs"), 0o755);
    widen(&data_dir.join("logs").join("execution.log"), 0o644);
    widen(&data_dir.join("operator.token"), 0o644);
    widen(&data_dir.join("execution.db"), 0o644);
    widen(&data_dir.join("roster.db"), 0o640);
    widen(&data_dir.join("agents"), 0o755);
    widen(&data_dir.join("agents").join("watcher"), 0o777);
    assert_ne!(wider_than_private(&data_dir), []);
    let cluster = Cluster::start(options).await.unwrap();
    assert_eq!(wider_than_private(&data_dir), [], "narrowed by the cluster and the services as they start");
    cluster.shutdown().await.unwrap();
}
