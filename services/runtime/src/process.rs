//! The life of a service process, shared by the four `main`s: the Tokio
//! runtime, logs and traces, the listener, the service's `run`, and the exit
//! code.

use std::{
    cell::Cell,
    fmt::Display,
    future::Future,
    net::SocketAddr,
    pin::Pin,
    process::ExitCode,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use tokio::net::TcpListener;

use crate::config::ServerArgs;

/// The shutdown signal handed to a service's `run`.
pub type Shutdown = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Starts the Tokio runtime (whose idle threads give freed memory back,
/// see `runtime` below), makes what the process writes its
/// owner's alone ([`crate::files::private_umask`]), sets up logs and traces
/// (`name` names the process in them), binds `server.listen` (or
/// `default_address`), runs the service until SIGTERM or SIGINT, and turns
/// the outcome into an exit code.
pub fn serve<Run, Running, Failure>(name: &str, server: &ServerArgs, default_address: SocketAddr, run: Run) -> ExitCode
where
    Run: FnOnce(TcpListener, Shutdown) -> Running,
    Running: Future<Output = Result<(), Failure>>,
    Failure: Display,
{
    let logs = Logs { format: server.log_format, filter: &server.log_filter };
    serve_at(name, logs, server.listen_or(default_address), run)
}

/// How a process logs: the format and the `tracing` filter.
#[derive(Debug, Clone, Copy)]
pub struct Logs<'a> {
    /// The log format.
    pub format: crate::config::LogFormat,
    /// The filter, in `tracing` syntax.
    pub filter: &'a str,
}

/// [`serve`] for a process that is not a gRPC service (the console): its
/// logs and its address given as they are.
pub fn serve_at<Run, Running, Failure>(name: &str, logs: Logs<'_>, address: SocketAddr, run: Run) -> ExitCode
where
    Run: FnOnce(TcpListener, Shutdown) -> Running,
    Running: Future<Output = Result<(), Failure>>,
    Failure: Display,
{
    match runtime() {
        Ok(runtime) => runtime.block_on(serve_on_runtime(name, logs, address, run)),
        Err(error) => {
            eprintln!("{name}: cannot start the Tokio runtime: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn serve_on_runtime<Run, Running, Failure>(name: &str, logs: Logs<'_>, address: SocketAddr, run: Run) -> ExitCode
where
    Run: FnOnce(TcpListener, Shutdown) -> Running,
    Running: Future<Output = Result<(), Failure>>,
    Failure: Display,
{
    crate::files::private_umask();
    crate::metrics::record_client_calls();
    let telemetry = match crate::telemetry::init(name, logs.format, logs.filter) {
        Ok(telemetry) => telemetry,
        Err(error) => {
            eprintln!("{name}: {error}");
            return ExitCode::FAILURE;
        }
    };
    let code = match TcpListener::bind(address).await {
        Ok(listener) => match run(listener, Box::pin(crate::shutdown::signal())).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                tracing::error!(%error, service = name, "service stopped");
                ExitCode::FAILURE
            }
        },
        Err(error) => {
            tracing::error!(%address, %error, "cannot listen");
            ExitCode::FAILURE
        }
    };
    telemetry.shutdown().await;
    code
}

/// The shortest time between two releases of one worker thread's freed memory.
const RELEASE_INTERVAL: Duration = Duration::from_secs(1);

/// The runtime a service runs on: Tokio's multi-threaded one (a worker per
/// core), whose threads give the memory they freed back to the system when
/// they go idle ([`release_freed_memory_when_idle`]) and when they end (a
/// blocking-pool thread idle for ten seconds).
fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    let nudge_armed = Arc::new(AtomicBool::new(false));
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_park(move || release_freed_memory_when_idle(&nudge_armed))
        .on_thread_stop(muster_allocator::release_freed_memory)
        .build()
}

/// Called by a worker thread each time it runs out of work and parks.
///
/// mimalloc keeps what a thread frees for that thread to reuse, and a worker
/// that sleeps allocates nothing, so a worker going idle after a burst would
/// keep the burst's memory for as long as it sleeps. Here it gives it back
/// ([`muster_allocator::release_freed_memory`]), at most once a
/// [`RELEASE_INTERVAL`] per thread: a busy service, whose workers park and
/// wake many times a second, pays for it once a second. A park too soon
/// after the last release arms one nudge for the whole runtime
/// ([`nudge_workers_later`]), so the memory freed since is given back too,
/// a second later, even if no work ever wakes the worker again.
fn release_freed_memory_when_idle(nudge_armed: &Arc<AtomicBool>) {
    thread_local! {
        static LAST_RELEASE: Cell<Option<Instant>> = const { Cell::new(None) };
    }
    let now = Instant::now();
    if LAST_RELEASE.get().is_none_or(|at| now.duration_since(at) >= RELEASE_INTERVAL) {
        muster_allocator::release_freed_memory();
        LAST_RELEASE.set(Some(now));
    } else {
        nudge_workers_later(nudge_armed);
    }
}

/// One [`RELEASE_INTERVAL`] from now, wakes the runtime's workers (a task
/// each: a task queued wakes a sleeping worker to look for it), so that each
/// parks again when its release is due. One nudge is armed at a time.
fn nudge_workers_later(nudge_armed: &Arc<AtomicBool>) {
    if nudge_armed.load(Ordering::Relaxed) || nudge_armed.swap(true, Ordering::AcqRel) {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        nudge_armed.store(false, Ordering::Release);
        return;
    };
    let nudge_armed = Arc::clone(nudge_armed);
    let workers = runtime.metrics().num_workers();
    runtime.spawn(async move {
        tokio::time::sleep(RELEASE_INTERVAL).await;
        nudge_armed.store(false, Ordering::Release);
        for _ in 0..workers {
            tokio::spawn(std::future::ready(()));
        }
    });
}
