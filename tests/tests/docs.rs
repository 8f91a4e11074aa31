//! The documentation's commands run as written: every shell block of
//! `README.md` and `docs/*.md` (`docs/tutorial.md` first among them) runs
//! verbatim, in order, one document after the other in one folder, as a
//! newcomer would paste them from the repository's root; a block fails the
//! test when a command of it fails. A block that cannot run here (it needs
//! a model endpoint, a container engine, a Kubernetes cluster) carries
//! `<!-- not run here: REASON -->` on the line before it, and a marker
//! without a reason fails the test too. A block shown failing carries
//! `<!-- exits N printing "TEXT" -->`: it must end with that status, having
//! printed that text.
//!
//! The folder holds the repository's `target` and `examples` (linked), a
//! copy of `clients` and `proto` (the clients are generated and built
//! there), a Python virtual environment of its own first on the PATH (what
//! the blocks `pip install` goes there), and `cargo` builds the repository.
//! The blocks use the default ports (50051–50054, 50080) and the
//! tutorial's cluster its own (50061–50064, 50090): this test is a
//! binary of its own, so no other test of this package runs beside it. It
//! needs `grpcurl` and `buf` (`MUSTER_GRPCURL`, `MUSTER_BUF`, which
//! `.ci/run` installs), `python3` with `venv`, Node.js with `npm`, and the
//! package registries; without the tools it says so and passes, except
//! under `CI=true`.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use muster_tests::{Folder, build_service_binaries};

/// How long the commands of one document may take.
const LIMIT: Duration = Duration::from_secs(300);

fn repository() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().expect("the repository")
}

/// One fenced shell block.
#[derive(Debug)]
struct Block {
    /// `FILE:LINE` of its opening fence.
    place: String,
    text: String,
    /// Why it is not run, when it says so.
    not_run: Option<String>,
    /// The status it ends with and a text it prints, when not 0.
    fails: Option<(i32, String)>,
}

/// `exits N printing "TEXT"` of a marker line.
fn expected_failure(line: &str) -> Option<(i32, String)> {
    let rest = line.trim().strip_prefix("<!-- exits ")?.strip_suffix("-->")?.trim();
    let (status, text) = rest.split_once(" printing ")?;
    Some((status.parse().ok()?, text.trim().strip_prefix('"')?.strip_suffix('"')?.to_owned()))
}

/// The documents, in the order their blocks run.
fn documents() -> Vec<PathBuf> {
    let root = repository();
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|entry| entry.expect("an entry").path())
        .filter(|path| path.extension().is_some_and(|extension| extension == "md"))
        .collect();
    docs.sort_by_key(|path| (!path.ends_with("tutorial.md"), path.clone()));
    [vec![root.join("README.md")], docs].concat()
}

/// The shell blocks of `path`.
fn blocks(path: &Path) -> Vec<Block> {
    let text = std::fs::read_to_string(path).expect("a document");
    let name = path.strip_prefix(repository()).unwrap_or(path).display().to_string();
    let mut found = Vec::new();
    let mut lines = text.lines().enumerate().peekable();
    let mut previous = "";
    while let Some((number, line)) = lines.next() {
        let fence = line.trim_start();
        if let Some(language) = fence.strip_prefix("```")
            && ["sh", "bash", "shell"].contains(&language.trim())
        {
            let mut body = String::new();
            for (_, line) in lines.by_ref() {
                if line.trim_start().starts_with("```") {
                    break;
                }
                body.push_str(line);
                body.push('\n');
            }
            let not_run = previous
                .trim()
                .strip_prefix("<!-- not run here:")
                .and_then(|rest| rest.strip_suffix("-->"))
                .map(|reason| reason.trim().to_owned());
            let fails = expected_failure(previous);
            found.push(Block { place: format!("{name}:{}", number + 1), text: body, not_run, fails });
            previous = "";
            continue;
        }
        if !line.trim().is_empty() {
            previous = line;
        }
    }
    found
}

#[test]
fn every_block_not_run_says_why() {
    let mut blocks_seen = 0;
    for document in documents() {
        for block in blocks(&document) {
            blocks_seen += 1;
            if let Some(reason) = &block.not_run {
                assert!(!reason.is_empty(), "{}: `not run here` gives no reason", block.place);
            }
            if let Some((status, text)) = &block.fails {
                assert!(
                    *status != 0 && !text.is_empty(),
                    "{}: an `exits` marker names a failing status and a text",
                    block.place
                );
            }
        }
    }
    assert!(blocks_seen > 20, "the documents' blocks were not found ({blocks_seen})");
}

/// The ports the blocks' clusters listen on: `muster up`'s defaults and
/// the tutorial's cluster's.
const DOCUMENTED_PORTS: [u16; 10] = [50051, 50052, 50053, 50054, 50080, 50061, 50062, 50063, 50064, 50090];

/// Waits (up to a minute) until every documented port can be listened on; a
/// port still taken then fails the test naming the process that holds it.
/// (`.ci/run` keeps these ports out of the range the kernel picks from for
/// other sockets; elsewhere a test's connection may hold one for a while.)
async fn ports_free() {
    let taken =
        || DOCUMENTED_PORTS.into_iter().filter(|port| std::net::TcpListener::bind(("127.0.0.1", *port)).is_err());
    for _ in 0..60 {
        if taken().next().is_none() {
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let held: Vec<String> = taken().map(|port| format!("{port} (held by {})", holder(port))).collect();
    if !held.is_empty() {
        panic!("the documented ports are taken: {}", held.join(", "));
    }
}

/// The process with a socket bound to local `port`, as `PID COMMAND`.
fn holder(port: u16) -> String {
    let needle = format!(":{port:04X} ");
    let inodes: Vec<String> = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(table).ok())
        .flat_map(|table| {
            table
                .lines()
                .filter(|line| {
                    line.split_whitespace().nth(1).is_some_and(|local| format!("{local} ").ends_with(&needle))
                })
                .filter_map(|line| line.split_whitespace().nth(9).map(|inode| format!("socket:[{inode}]")))
                .collect::<Vec<_>>()
        })
        .collect();
    for process in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(fds) = std::fs::read_dir(process.path().join("fd")) else { continue };
        for fd in fds.flatten() {
            if std::fs::read_link(fd.path())
                .is_ok_and(|target| inodes.iter().any(|inode| target.as_os_str() == inode.as_str()))
            {
                let command = std::fs::read_to_string(process.path().join("cmdline")).unwrap_or_default();
                return format!("{} {}", process.file_name().to_string_lossy(), command.replace('\0', " ").trim());
            }
        }
    }
    "an unknown process".to_owned()
}

/// `program` from `variable`, else on the PATH, when it runs with `probe`.
fn tool(variable: &str, default: &str, probe: &[&str]) -> Option<PathBuf> {
    let program = std::env::var(variable).unwrap_or_else(|_| default.to_owned());
    let works = std::process::Command::new(&program).args(probe).output().is_ok_and(|output| output.status.success());
    if works {
        return Some(PathBuf::from(program));
    }
    let message = format!("{program} {} does not work; set {variable} or install it (see .ci/run)", probe.join(" "));
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{message}");
    eprintln!("skipping: {message}");
    None
}

/// `name` in `folder`, linked to `target`.
fn link(folder: &Path, name: &str, target: &Path) {
    std::os::unix::fs::symlink(std::path::absolute(target).expect("a path"), folder.join(name)).expect("a link");
}

/// A copy of the folder `from` at `to`, without what builds and installs
/// leave in it.
fn copy_sources(from: &Path, to: &Path) {
    const LEFT_OUT: [&str; 5] = ["node_modules", "dist", "gen", "build", "__pycache__"];
    std::fs::create_dir_all(to).expect("a folder");
    for entry in std::fs::read_dir(from).expect("a folder") {
        let entry = entry.expect("an entry");
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if path.is_dir() {
            if !LEFT_OUT.contains(&name.as_str()) && !name.ends_with(".egg-info") {
                copy_sources(&path, &to.join(&name));
            }
        } else {
            std::fs::copy(&path, to.join(&name)).expect("a copy");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_commands_run_as_written() {
    let Some(grpcurl) = tool("MUSTER_GRPCURL", "grpcurl", &["-version"]) else { return };
    let Some(buf) = tool("MUSTER_BUF", "buf", &["--version"]) else { return };
    let Some(_) = tool("MUSTER_NPM", "npm", &["--version"]) else { return };
    let Some(_) = tool("MUSTER_VENV_PYTHON", "python3", &["-c", "import venv, ensurepip"]) else { return };
    build_service_binaries();
    ports_free().await;
    let root = repository();
    let folder = Folder::new("docs");
    let home = folder.0.join("home");
    let bin = folder.0.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(home.join(".local/share/bash-completion/completions")).unwrap();
    for shared in ["target", "examples"] {
        link(&folder.0, shared, &root.join(shared));
    }
    for copied in ["clients", "proto"] {
        copy_sources(&root.join(copied), &folder.0.join(copied));
    }
    // The Python client as generated in the repository, if it was: the
    // blocks generate their own.
    let _ = std::fs::remove_dir_all(folder.0.join("clients/python/muster"));
    link(&bin, "grpcurl", &grpcurl);
    link(&bin, "buf", &buf);
    link(&bin, "muster", &root.join("target/debug/muster"));
    // A Python of the folder's own: what the blocks install goes there.
    let venv = folder.0.join("venv");
    let made = std::process::Command::new("python3").args(["-m", "venv"]).arg(&venv).status().expect("python3 -m venv");
    assert!(made.success(), "making a Python virtual environment failed");
    // `cargo` builds the repository, wherever it is called.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let script = format!("#!/bin/sh\ncd '{}' && exec '{cargo}' \"$@\"\n", root.display());
    std::fs::write(bin.join("cargo"), script).unwrap();
    let mut permissions = std::fs::metadata(bin.join("cargo")).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    std::fs::set_permissions(bin.join("cargo"), permissions).unwrap();

    let mut failures = Vec::new();
    let mut ran = 0;
    for document in documents() {
        let runnable: Vec<Block> = blocks(&document).into_iter().filter(|block| block.not_run.is_none()).collect();
        if runnable.is_empty() {
            continue;
        }
        ran += runnable.len();
        // Each document in a shell of its own; what it leaves in the
        // background is stopped when it ends.
        let mut script = String::from("set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n");
        for block in &runnable {
            script.push_str(&format!("echo \"### {} (at $SECONDS s)\"\n", block.place));
            match &block.fails {
                None => script.push_str(&block.text),
                // Run apart, its status and output checked.
                Some((status, text)) => script.push_str(&format!(
                    "status=0\n( set -e\n{}) > .block.out 2>&1 || status=$?\ncat .block.out\n\
                     if [ \"$status\" != {status} ] || ! grep -qF '{text}' .block.out; then\n\
                     echo \"!!! expected exit status {status} printing {text}; got $status\"; exit 1\nfi\n",
                    block.text
                )),
            }
        }
        let mut command = tokio::process::Command::new("bash");
        // Nothing of this test's own environment leaks in: no cluster's
        // addresses or credential, and none of the variables cargo gives
        // a test (passed on, they would make `cargo build` rebuild).
        for (name, _) in std::env::vars_os() {
            let name = name.to_string_lossy();
            if (name.starts_with("MUSTER_") && name != "MUSTER_LOG")
                || name.starts_with("CARGO_PKG_")
                || ["CARGO_MANIFEST_DIR", "CARGO_MANIFEST_PATH", "CARGO_CRATE_NAME", "CARGO_PRIMARY_PACKAGE"]
                    .contains(&name.as_ref())
            {
                command.env_remove(name.as_ref());
            }
        }
        command
            .args(["-c", &script])
            .current_dir(&folder.0)
            .env(
                "PATH",
                format!(
                    "{}:{}:{}",
                    venv.join("bin").display(),
                    bin.display(),
                    std::env::var("PATH").unwrap_or_default()
                ),
            )
            .env("VIRTUAL_ENV", &venv)
            .env("HOME", &home)
            .env("MUSTER_CONFIG_DIR", folder.0.join("config"))
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let name = document.strip_prefix(&root).unwrap_or(&document).display().to_string();
        let log = folder.0.join(format!("{}.log", name.replace('/', "-")));
        let output = std::fs::File::create(&log).expect("a log");
        command.stdout(output.try_clone().expect("a log")).stderr(output);
        let started = std::time::Instant::now();
        let mut child = command.spawn().expect("bash");
        let status = tokio::time::timeout(LIMIT, child.wait()).await;
        let output = std::fs::read_to_string(&log).unwrap_or_default();
        let block = output.lines().rfind(|line| line.starts_with("### ")).unwrap_or("### ?");
        let block = block.trim_start_matches("### ");
        // How long each block took, for `--nocapture` (the slow ones first).
        let mut starts: Vec<(&str, u64)> = output
            .lines()
            .filter_map(|line| {
                let (place, at) = line.strip_prefix("### ")?.rsplit_once(" (at ")?;
                Some((place, at.strip_suffix(" s)")?.parse().ok()?))
            })
            .collect();
        starts.push(("end", started.elapsed().as_secs()));
        let mut took: Vec<(u64, &str)> = starts.windows(2).map(|pair| (pair[1].1 - pair[0].1, pair[0].0)).collect();
        took.sort_unstable_by(|left, right| right.cmp(left));
        eprintln!(
            "{name}: {} blocks in {:.0?}; slowest: {:?}",
            runnable.len(),
            started.elapsed(),
            &took[..took.len().min(5)]
        );
        let tail: Vec<&str> = output.lines().rev().take(40).collect::<Vec<_>>().into_iter().rev().collect();
        let tail = tail.join("\n");
        match status {
            Ok(Ok(status)) if status.success() => {}
            Ok(Ok(status)) => failures.push(format!("{name}: the block at {block} failed ({status}):\n{tail}")),
            Ok(Err(error)) => failures.push(format!("{name}: {error}")),
            Err(_) => {
                let _ = child.kill().await;
                failures.push(format!("{name}: the block at {block} took more than {LIMIT:?}:\n{tail}"));
            }
        }
    }
    // The clusters started in the background stop.
    for data in ["muster-data", "tutorial-data"] {
        if folder.0.join(data).join("up.pid").exists() {
            let _ = tokio::process::Command::new(root.join("target/debug/muster"))
                .args(["down", "--data-dir"])
                .arg(folder.0.join(data))
                .env("MUSTER_CONFIG_DIR", folder.0.join("config"))
                .output()
                .await;
        }
    }
    assert!(ran > 10, "only {ran} blocks ran");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
