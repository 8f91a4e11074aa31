//! The `muster` command as the tests run it: to its end, or in the background
//! with its output gathered as it comes, to wait for a line or send it a
//! signal.

use std::{
    io::{BufRead as _, BufReader, Read},
    path::PathBuf,
    process::{Child, Command, ExitStatus, Output, Stdio},
    time::Duration,
};

use tokio::sync::watch;

/// The `muster` binary next to the test binaries.
pub fn muster() -> PathBuf {
    muster::cluster::default_binary_dir().expect("locating the binaries").join("muster")
}

/// The repository, where the commands run (for `examples/...`).
pub fn repository() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `muster` in the repository, with cluster contexts off unless the
/// environment a test gives sets `MUSTER_CONFIG_DIR` (a command reads no
/// context of the machine, and `muster up` writes none there).
fn command(arguments: impl IntoIterator<Item = impl AsRef<std::ffi::OsStr>>) -> Command {
    let mut command = Command::new(muster());
    command.args(arguments).env("MUSTER_CONFIG_DIR", "").current_dir(repository());
    command
}

/// Runs `muster` with these arguments and extra environment to its end.
pub async fn run(arguments: Vec<String>, environment: Vec<(String, String)>) -> Output {
    tokio::task::spawn_blocking(move || command(arguments).envs(environment).output().unwrap()).await.unwrap()
}

/// A finished command's standard output, then its standard error.
pub fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// A `muster` command running in the background; killed when dropped.
pub struct Background {
    child: Option<Child>,
    pid: u32,
    output: watch::Receiver<String>,
}

impl Background {
    /// Starts `muster` with these arguments and extra environment.
    pub fn spawn(arguments: &[&str], environment: &[(String, String)]) -> Self {
        let mut child = command(arguments)
            .envs(environment.iter().cloned())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|error| panic!("starting muster {arguments:?}: {error}"));
        let (sender, output) = watch::channel(String::new());
        gather(child.stdout.take().expect("a piped stdout"), sender.clone());
        gather(child.stderr.take().expect("a piped stderr"), sender);
        Self { pid: child.id(), child: Some(child), output }
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Its output so far, standard output and error line by line as they came.
    pub fn output(&self) -> String {
        self.output.borrow().clone()
    }

    /// Waits until its output contains `wanted`; returns the output. Panics,
    /// showing the output, when the command ends or `limit` passes first.
    pub async fn wait_for(&mut self, wanted: &str, limit: Duration) -> String {
        let found = tokio::time::timeout(limit, self.output.wait_for(|output| output.contains(wanted)))
            .await
            .map(|found| found.map(|output| output.clone()));
        match found {
            Ok(Ok(output)) => output,
            Ok(Err(_)) => panic!("muster ended before printing {wanted:?}:\n{}", self.output()),
            Err(_) => panic!("muster did not print {wanted:?} within {} s:\n{}", limit.as_secs(), self.output()),
        }
    }

    /// Sends it a signal.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.pid()).expect("a process id"));
        nix::sys::signal::kill(pid, signal).expect("signalling muster");
    }

    /// Waits until it ends, within `limit`; its exit status and whole output.
    pub async fn wait(mut self, limit: Duration) -> (ExitStatus, String) {
        let mut child = self.child.take().expect("the command is running");
        let ended = tokio::time::timeout(limit, tokio::task::spawn_blocking(move || child.wait())).await;
        let Ok(status) = ended else {
            self.signal(nix::sys::signal::Signal::SIGKILL);
            panic!("muster did not end within {} s:\n{}", limit.as_secs(), self.output());
        };
        let status = status.unwrap().expect("waiting for muster");
        // The output is whole once both pipes are closed.
        let _ = tokio::time::timeout(limit, self.output.wait_for(|_| false)).await;
        (status, self.output())
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Appends each line from `pipe` to the shared output, on a thread of its own.
fn gather(pipe: impl Read + Send + 'static, output: watch::Sender<String>) {
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            output.send_modify(|output| {
                output.push_str(&line);
                output.push('\n');
            });
        }
    });
}
