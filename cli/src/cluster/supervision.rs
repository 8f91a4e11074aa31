//! Watching a cluster's processes: a service that exits while supervised is
//! restarted on the same address, with the same database and arguments,
//! after a backoff that doubles with each crash; one that keeps crashing is
//! given up on.
//!
//! Supervision borrows the cluster mutably for as long as it runs, so a
//! deliberate [`Cluster::kill`] or [`Cluster::stop`] (as the fault tests do)
//! never races it: a cluster is either supervised or driven by hand.

use std::{
    collections::{HashMap, VecDeque},
    future::Future,
    net::SocketAddr,
    path::PathBuf,
    process::ExitStatus,
    task::Poll,
    time::{Duration, Instant},
};

use anyhow::Context as _;

use super::{Cluster, ExitedWhileStarting, ServiceProcess, log_tail};

/// How many lines of a crashed service's log a report carries.
const LOG_TAIL_LINES: usize = 5;

/// How a supervised cluster restarts a service that exits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestartPolicy {
    /// The wait before the first restart; it doubles with each crash within
    /// the window.
    pub first_backoff: Duration,
    /// The longest wait before a restart.
    pub max_backoff: Duration,
    /// A service that crashes this many times within `window` is given up on.
    pub max_crashes: usize,
    /// The window crashes are counted in.
    pub window: Duration,
}

impl Default for RestartPolicy {
    /// 0.5 s doubling up to 10 s; five crashes within 60 s is too many.
    fn default() -> Self {
        Self {
            first_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(10),
            max_crashes: 5,
            window: Duration::from_secs(60),
        }
    }
}

impl RestartPolicy {
    /// The wait before restart number `attempt` (from 1).
    pub fn backoff(&self, attempt: usize) -> Duration {
        let doublings = u32::try_from(attempt.saturating_sub(1)).unwrap_or(u32::MAX).min(16);
        self.first_backoff.saturating_mul(1 << doublings).min(self.max_backoff)
    }
}

/// What supervision saw and did, reported as it happens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SupervisionEvent {
    /// A service exited while nobody asked it to, or did not come back from
    /// a restart.
    Crashed {
        /// Which service.
        service: &'static str,
        /// What happened: `exited unexpectedly (signal: 9 (SIGKILL))`.
        what: String,
        /// Its log file.
        log_path: PathBuf,
        /// The last lines this run of it wrote to its log, when it ended by
        /// itself (a process killed by a signal wrote nothing about it).
        log_tail: Vec<String>,
        /// The crash's number within the window, and of the restart to come.
        attempt: usize,
        /// When it restarts; `None` when supervision gives up on it.
        restart_in: Option<Duration>,
    },
    /// A restarted service reports SERVING again.
    Restarted {
        /// Which service.
        service: &'static str,
        /// The restart's number within the window.
        attempt: usize,
        /// Its new process id.
        pid: Option<u32>,
        /// Where it listens: the address it had.
        address: SocketAddr,
    },
}

impl Cluster {
    /// Watches the services until `until` resolves, restarting any that exits
    /// as `policy` says and telling `report` about it. Returns `Ok` when
    /// `until` resolves (the services still run: [`Cluster::shutdown`] stops
    /// them), and an error when a service crashed `policy.max_crashes` times
    /// within `policy.window` (the others still run).
    pub async fn supervise(
        &mut self,
        policy: RestartPolicy,
        until: impl Future<Output = ()>,
        mut report: impl FnMut(SupervisionEvent),
    ) -> anyhow::Result<()> {
        let mut until = std::pin::pin!(until);
        let mut crashes: HashMap<&'static str, VecDeque<Instant>> = HashMap::new();
        loop {
            let (position, status) = tokio::select! {
                biased;
                () = &mut until => return Ok(()),
                (position, status) = first_exit(&mut self.services) => {
                    (position, status.context("waiting for the service processes")?)
                }
            };
            let name = self.services[position].name;
            let address = self.services[position].address;
            let log_path = self.services[position].log_path.clone();
            let log_start = self.services[position].log_start;
            let mut what = format!("exited unexpectedly ({status})");
            let mut tail =
                if ended_by_itself(status) { log_tail(&log_path, log_start, LOG_TAIL_LINES) } else { Vec::new() };
            loop {
                let attempt = record_crash(crashes.entry(name).or_default(), policy.window);
                let given_up = attempt >= policy.max_crashes;
                let restart_in = (!given_up).then(|| policy.backoff(attempt));
                report(SupervisionEvent::Crashed {
                    service: name,
                    what: what.clone(),
                    log_path: log_path.clone(),
                    log_tail: std::mem::take(&mut tail),
                    attempt,
                    restart_in,
                });
                let Some(restart_in) = restart_in else {
                    anyhow::bail!(
                        "{name} crashed {attempt} times within {} s (the last time it {what}); gave up restarting it; \
                         its log: {}",
                        policy.window.as_secs(),
                        log_path.display()
                    );
                };
                tokio::select! {
                    biased;
                    () = &mut until => return Ok(()),
                    () = tokio::time::sleep(restart_in) => {}
                }
                tracing::info!(service = name, attempt, "restarting a service");
                let restarted = tokio::select! {
                    biased;
                    () = &mut until => return Ok(()),
                    restarted = self.spawn_at(name, address.port(), name) => restarted,
                };
                match restarted {
                    Ok(service) => {
                        report(SupervisionEvent::Restarted {
                            service: name,
                            attempt,
                            pid: service.pid(),
                            address: service.address,
                        });
                        self.services[position] = service;
                        break;
                    }
                    Err(error) => {
                        (what, tail) = match error.downcast_ref::<ExitedWhileStarting>() {
                            Some(exited) => (
                                format!("did not come back: it exited ({}) while starting", exited.status),
                                exited.log_tail[exited.log_tail.len().saturating_sub(LOG_TAIL_LINES)..].to_vec(),
                            ),
                            None => (format!("did not come back: {error:#}"), Vec::new()),
                        };
                    }
                }
            }
        }
    }
}

/// Notes a crash now; returns how many crashes the window holds.
fn record_crash(crashes: &mut VecDeque<Instant>, window: Duration) -> usize {
    let now = Instant::now();
    while crashes.front().is_some_and(|crash| now.duration_since(*crash) > window) {
        crashes.pop_front();
    }
    crashes.push_back(now);
    crashes.len()
}

/// Whether a process ended by itself rather than by a signal.
fn ended_by_itself(status: ExitStatus) -> bool {
    status.code().is_some()
}

/// The first of the services' processes to exit, and how it did.
async fn first_exit(services: &mut [ServiceProcess]) -> (usize, std::io::Result<ExitStatus>) {
    // `Child::wait` is cancel safe: the futures may be dropped at any point.
    let mut waits: Vec<_> = services.iter_mut().map(|service| Box::pin(service.child.wait())).collect();
    std::future::poll_fn(|context| {
        for (position, wait) in waits.iter_mut().enumerate() {
            if let Poll::Ready(status) = wait.as_mut().poll(context) {
                return Poll::Ready((position, status));
            }
        }
        Poll::Pending
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_up_to_its_limit() {
        let policy = RestartPolicy::default();
        let waits: Vec<u128> = (1..=7).map(|attempt| policy.backoff(attempt).as_millis()).collect();
        assert_eq!(waits, [500, 1000, 2000, 4000, 8000, 10_000, 10_000]);
        assert_eq!(policy.backoff(usize::MAX), policy.max_backoff);
    }

    #[test]
    fn crashes_older_than_the_window_are_forgotten() {
        let mut crashes = VecDeque::from([Instant::now() - Duration::from_secs(120)]);
        assert_eq!(record_crash(&mut crashes, Duration::from_secs(60)), 1);
        assert_eq!(record_crash(&mut crashes, Duration::from_secs(60)), 2);
    }
}
