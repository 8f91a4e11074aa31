//! Write transactions on a SQLite file run whole on the calling thread.
//!
//! sqlx runs each SQLite statement on the connection's own thread and hands
//! the statement there and its result back: a transaction of five short
//! statements is five round trips between threads, each a futex wake and a
//! context switch, 100–150 µs in all on two cores, against the 15–20 µs
//! SQLite needs to run it (`cargo bench -p muster-runtime --bench
//! statements`). A service's hot write paths instead run their transaction
//! here, on a connection of this process's own, without leaving the task's
//! thread: the transaction is shorter than a hand-off would be.
//!
//! The writers' pool of a SQLite [`Database`](super::Database) holds one
//! connection, so that SQLite's one writer is never refused with
//! `SQLITE_BUSY` by another of the same process. A native transaction
//! keeps that promise by holding the pool's connection while it runs: the
//! pool's writes and the native ones take turns.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex, OnceLock, PoisonError, Weak},
    time::Duration,
};

use rusqlite::{Connection, OpenFlags};
use sqlx::AnyPool;

/// Prepared statements a connection keeps (a multi-row statement is one per
/// row count it was used with).
const CACHED_STATEMENTS: usize = 128;

/// How often the checkpointer copies the write-ahead log into the database.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(100);

/// The native connection of a SQLite file, opened on first use.
#[derive(Debug)]
pub struct NativeSqlite {
    path: PathBuf,
    /// What every connection runs first (the pools' settings).
    settings: Arc<str>,
    /// Whether a checkpointer thread runs for the file (then commits do not checkpoint).
    checkpointed: bool,
    connection: Mutex<Option<Connection>>,
    /// A second connection, for reads ([`NativeSqlite::read`]).
    reader: Mutex<Option<Connection>>,
}

impl NativeSqlite {
    pub(super) fn new(path: PathBuf, settings: Arc<str>, checkpointed: bool) -> Self {
        Self { path, settings, checkpointed, connection: Mutex::new(None), reader: Mutex::new(None) }
    }

    /// Runs `work` on a read-only connection of its own, on the calling
    /// thread: for a hot read of a few rows, shorter than a hand-off to a
    /// pool's connection thread. Each statement reads the last commit (WAL:
    /// it neither waits for the writer nor makes it wait); `work` must not
    /// block on anything but SQLite.
    pub fn read<R, E>(&self, work: impl FnOnce(&Connection) -> Result<R, E>) -> Result<R, E>
    where
        E: From<rusqlite::Error>,
    {
        let mut guard = self.reader.lock().unwrap_or_else(PoisonError::into_inner);
        let connection = match &mut *guard {
            Some(connection) => connection,
            empty => {
                let connection = self.open()?;
                connection.execute_batch("PRAGMA query_only = ON;")?;
                empty.insert(connection)
            }
        };
        work(connection)
    }

    /// Runs `work` in one `BEGIN IMMEDIATE` transaction on the connection
    /// it is given and commits it, while holding `writers`' connection so
    /// that no write of the pool runs at the same time. An error from
    /// `work` (or the commit) rolls everything back. `work` must not block
    /// on anything but SQLite: it runs on the calling task's thread.
    pub async fn write<R, E>(&self, writers: &AnyPool, work: impl FnOnce(&Connection) -> Result<R, E>) -> Result<R, E>
    where
        E: From<rusqlite::Error> + From<sqlx::Error>,
    {
        let mut turn = writers.acquire().await?;
        let outcome = self.run(work);
        // Given back here rather than by a task the drop would spawn, which
        // the next writer would wait for.
        turn.return_to_pool().await;
        outcome
    }

    /// The transaction's statements are prepared once per connection, like
    /// every statement `work` prepares with `prepare_cached`.
    fn run<R, E>(&self, work: impl FnOnce(&Connection) -> Result<R, E>) -> Result<R, E>
    where
        E: From<rusqlite::Error>,
    {
        let mut guard = self.connection.lock().unwrap_or_else(PoisonError::into_inner);
        let connection = match &mut *guard {
            Some(connection) => connection,
            empty => empty.insert(self.open()?),
        };
        connection.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
        let open = Open(connection);
        let outcome = work(open.0)?;
        open.0.prepare_cached("COMMIT")?.execute([])?;
        Ok(outcome)
    }

    /// Opens the file with the settings of the pools' connections.
    fn open(&self) -> rusqlite::Result<Connection> {
        let connection = Connection::open_with_flags(
            &self.path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        connection.execute_batch(&self.settings)?;
        if self.checkpointed {
            connection.execute_batch(super::NO_CHECKPOINT_ON_COMMIT)?;
        }
        connection.set_prepared_statement_cache_capacity(CACHED_STATEMENTS);
        Ok(connection)
    }
}

/// Checkpoints the write-ahead log of the SQLite file at `path` every
/// [`CHECKPOINT_EVERY`] on a thread of its own, for as long as the token
/// answered lives; `None` when no thread could be started.
///
/// By default SQLite checkpoints in the commit that fills the log past
/// 1,000 pages: that caller copies the log into the database and waits for
/// its `fsync`s (with `synchronous = NORMAL`, the only ones in WAL mode),
/// one transaction in a few hundred taking milliseconds instead of
/// microseconds. With this thread running, the connections of the file
/// turn that off (`wal_autocheckpoint = 0`) and no commit waits for a
/// checkpoint.
///
/// Most checkpoints are passive: they never wait for, nor block, readers
/// and writers. But a passive checkpoint copies only what no reader still
/// reads from the log, and the log starts over (from its beginning, cut
/// back to `journal_size_limit`) only when a writer finds it copied whole
/// and no reader in it: under steady reads and writes that moment never
/// comes, and the log grew to hundreds of megabytes. So:
/// - past [`super::WAL_SIZE_LIMIT`], the thread checkpoints with RESTART:
///   it holds new writers back (at most [`RESTART_WAIT`]) while the readers
///   that began before it finish, and the next commit starts the log over;
/// - once no commit came for [`IDLE_BEFORE_TRUNCATE`], it checkpoints with
///   TRUNCATE, leaving the log empty (waiting for a reader at most
///   [`IDLE_WAIT`]).
///
/// Those two take SQLite's write lock, so they run in the writers' turn:
/// holding the one connection of `writers` (set once the pool exists), as a
/// native transaction does. Without it, a deferred transaction of the pool
/// that read before it wrote would be refused at once as busy (SQLite does
/// not wait to upgrade a read to a write). They need the runtime the
/// database was made on; without one, checkpoints stay passive.
pub(super) fn spawn_checkpointer(path: PathBuf, writers: Arc<OnceLock<AnyPool>>) -> Option<Arc<()>> {
    let alive = Arc::new(());
    let watched = Arc::downgrade(&alive);
    let runtime = tokio::runtime::Handle::try_current().ok();
    std::thread::Builder::new()
        .name("sqlite-checkpoint".to_owned())
        .spawn(move || checkpoint_while(&path, &watched, runtime.as_ref(), &writers))
        .ok()?;
    Some(alive)
}

/// How long a RESTART checkpoint holds writers back, waiting for readers.
const RESTART_WAIT: Duration = Duration::from_millis(500);

/// How long after a RESTART that readers kept from finishing the next may be tried.
const RESTART_BACKOFF: Duration = Duration::from_secs(2);

/// How long the log must have had no new commit before it is emptied.
const IDLE_BEFORE_TRUNCATE: Duration = Duration::from_secs(1);

/// How long an idle TRUNCATE checkpoint waits for a reader (or a writer
/// that came meanwhile waits for it).
const IDLE_WAIT: Duration = Duration::from_millis(100);

/// The checkpointer's connection and what it last saw of the log.
struct Checkpointer {
    connection: Connection,
    page_size: u64,
    /// Frames in the log at the last checkpoint, and since when unchanged.
    frames: i64,
    unchanged_since: std::time::Instant,
    /// No RESTART before this: one that a reader kept waiting is not tried
    /// again at once, so that a long read holds writers back at most
    /// [`RESTART_WAIT`] in each [`RESTART_BACKOFF`].
    restart_after: std::time::Instant,
}

/// The modes of `PRAGMA wal_checkpoint`, as the thread uses them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Checkpoint {
    Passive,
    Restart,
    Truncate,
}

impl Checkpointer {
    /// Not created here: the pools create the file when they first connect.
    fn open(path: &Path) -> rusqlite::Result<Self> {
        let connection =
            Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX)?;
        connection.execute_batch("PRAGMA journal_size_limit = 4194304;")?;
        let page_size: i64 = connection.query_row("PRAGMA page_size", [], |row| row.get(0))?;
        let now = std::time::Instant::now();
        Ok(Self { connection, page_size: page_size as u64, frames: 0, unchanged_since: now, restart_after: now })
    }

    /// One checkpoint, in the mode the log's size and age ask for.
    #[expect(
        clippy::disallowed_methods,
        reason = "the checkpointer's own thread, outside the runtime, waits for the writers' turn"
    )]
    fn tick(&mut self, turn: Option<(&tokio::runtime::Handle, &AnyPool)>) -> rusqlite::Result<()> {
        let (frames, _) = self.checkpoint(Checkpoint::Passive)?;
        let now = std::time::Instant::now();
        if frames != self.frames {
            self.frames = frames;
            self.unchanged_since = now;
        }
        let size = (frames.max(0) as u64).saturating_mul(self.page_size);
        // Idle first: a RESTART leaves the file as large as it was until
        // the next commit, a TRUNCATE empties it.
        let Some((runtime, writers)) = turn else { return Ok(()) };
        let mode = if frames > 0 && now.duration_since(self.unchanged_since) >= IDLE_BEFORE_TRUNCATE {
            Checkpoint::Truncate
        } else if size > super::WAL_SIZE_LIMIT && now >= self.restart_after {
            Checkpoint::Restart
        } else {
            return Ok(());
        };
        // A runtime shut down under it panics: the service is stopping.
        let checkpointed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            runtime.block_on(async {
                let Ok(Ok(mut turn)) = tokio::time::timeout(TURN_WAIT, writers.acquire()).await else {
                    return None;
                };
                let checkpointed = self.checkpoint(mode);
                turn.return_to_pool().await;
                Some(checkpointed)
            })
        }));
        let Ok(Some(checkpointed)) = checkpointed else { return Ok(()) };
        let (frames, busy) = checkpointed?;
        if !busy {
            self.frames = frames;
        } else if mode == Checkpoint::Restart {
            self.restart_after = std::time::Instant::now() + RESTART_BACKOFF;
        }
        Ok(())
    }

    /// Runs a checkpoint: the frames in the log after it, and whether a
    /// reader or writer kept it from finishing.
    fn checkpoint(&self, mode: Checkpoint) -> rusqlite::Result<(i64, bool)> {
        let (sql, wait) = match mode {
            Checkpoint::Passive => ("PRAGMA wal_checkpoint(PASSIVE)", Duration::ZERO),
            Checkpoint::Restart => ("PRAGMA wal_checkpoint(RESTART)", RESTART_WAIT),
            Checkpoint::Truncate => ("PRAGMA wal_checkpoint(TRUNCATE)", IDLE_WAIT),
        };
        self.connection.busy_timeout(wait)?;
        self.connection.query_row(sql, [], |row| Ok((row.get::<_, i64>(1)?, row.get::<_, i64>(0)? != 0)))
    }
}

/// How long the checkpointer waits for the writers' turn before it tries again later.
const TURN_WAIT: Duration = Duration::from_secs(1);

#[expect(
    clippy::disallowed_methods,
    reason = "the checkpointer's own thread does nothing but wait between checkpoints"
)]
fn checkpoint_while(
    path: &Path,
    alive: &Weak<()>,
    runtime: Option<&tokio::runtime::Handle>,
    writers: &OnceLock<AnyPool>,
) {
    let mut checkpointer: Option<Checkpointer> = None;
    loop {
        std::thread::sleep(CHECKPOINT_EVERY);
        if alive.strong_count() == 0 {
            return;
        }
        if checkpointer.is_none() {
            checkpointer = Checkpointer::open(path).ok();
        }
        let forced = runtime.zip(writers.get());
        if let Some(open) = &mut checkpointer
            && let Err(error) = open.tick(forced)
        {
            tracing::warn!(%error, path = %path.display(), "checkpointing the SQLite write-ahead log failed");
            checkpointer = None;
        }
    }
}

/// A transaction that has begun: unless it was committed, it is rolled
/// back when this is dropped (an error, or a panic in the work).
struct Open<'a>(&'a Connection);

impl Drop for Open<'_> {
    fn drop(&mut self) {
        if !self.0.is_autocommit() {
            let _ = self.0.execute_batch("ROLLBACK");
        }
    }
}

/// The file a `sqlite:` URL names, unless it names a database in memory
/// (which another connection could not share).
pub(super) fn file_of(url: &str) -> Option<PathBuf> {
    let path = url.trim_start_matches("sqlite://").trim_start_matches("sqlite:");
    let path = path.split('?').next().unwrap_or_default();
    (!path.is_empty() && !path.contains(":memory:") && !url.contains("mode=memory")).then(|| PathBuf::from(path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::{Connections, DEFAULT_PAGES, Database};

    /// A SQLite file in a folder of its own, removed when dropped.
    struct Folder(PathBuf);

    impl Drop for Folder {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[derive(Debug)]
    enum Failure {
        Database(String),
        Refused,
    }

    impl From<rusqlite::Error> for Failure {
        fn from(error: rusqlite::Error) -> Self {
            Self::Database(error.to_string())
        }
    }

    impl From<sqlx::Error> for Failure {
        fn from(error: sqlx::Error) -> Self {
            Self::Database(error.to_string())
        }
    }

    /// A SQLite file of the test's own: its folder (removed when dropped) and URL.
    fn temporary_file() -> (Folder, String) {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        let folder = Folder(std::env::temp_dir().join(format!("muster-native-{}-{nanos}", std::process::id())));
        let url = format!("sqlite://{}/t.db", folder.0.display());
        (folder, url)
    }

    async fn count(database: &Database) -> i64 {
        sqlx::query_scalar("SELECT COUNT(*) FROM t").fetch_one(&database.pool).await.unwrap()
    }

    /// A pool transaction begun to write takes the file's write lock before
    /// it reads: another connection's commit cannot come between its read
    /// and its write, which SQLite would refuse at once as busy (the fate of
    /// a deferred `BEGIN` when another replica commits meanwhile).
    #[tokio::test]
    async fn a_write_transaction_on_the_pool_holds_the_lock_from_its_first_read() {
        let (folder, url) = temporary_file();
        let database = Database::connect_lazy(&url, 1).unwrap();
        sqlx::query("CREATE TABLE t (id INTEGER PRIMARY KEY, source TEXT NOT NULL)")
            .execute(&database.pool)
            .await
            .unwrap();
        let mut transaction = database.begin_write().await.unwrap();
        let before: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM t").fetch_one(&mut *transaction).await.unwrap();
        // Another replica's connection, waiting for nobody: refused while the transaction is open.
        let other = Connection::open(folder.0.join("t.db")).unwrap();
        other.busy_timeout(Duration::ZERO).unwrap();
        let refused = other.execute("INSERT INTO t (source) VALUES ('other')", []);
        assert!(
            matches!(&refused, Err(rusqlite::Error::SqliteFailure(error, _)) if error.code == rusqlite::ErrorCode::DatabaseBusy),
            "{refused:?}"
        );
        sqlx::query("INSERT INTO t (source) VALUES ('own')").execute(&mut *transaction).await.unwrap();
        transaction.commit().await.unwrap();
        assert_eq!(count(&database).await, before + 1);
        other.execute("INSERT INTO t (source) VALUES ('other')", []).unwrap();
        assert_eq!(count(&database).await, before + 2);
    }

    #[tokio::test]
    async fn native_and_pool_writes_take_turns_and_a_failure_leaves_nothing() {
        let (_folder, url) = temporary_file();
        let database = Database::connect_lazy_with(&url, Connections { readers: 2, ..Connections::new(4) }).unwrap();
        sqlx::query("CREATE TABLE t (id INTEGER PRIMARY KEY, source TEXT NOT NULL)")
            .execute(&database.pool)
            .await
            .unwrap();
        let native = database.native().expect("a SQLite file has a native connection");

        // A failure after a write rolls the write back.
        let refused: Result<(), Failure> = native
            .write(&database.pool, |transaction| {
                transaction.execute("INSERT INTO t (source) VALUES ('refused')", [])?;
                Err(Failure::Refused)
            })
            .await;
        assert!(matches!(refused, Err(Failure::Refused)));
        let broken: Result<(), Failure> = native
            .write(&database.pool, |transaction| {
                transaction.execute("INSERT INTO t (source) VALUES ('broken')", [])?;
                transaction.execute("INSERT INTO missing VALUES (1)", [])?;
                Ok(())
            })
            .await;
        assert!(matches!(&broken, Err(Failure::Database(message)) if message.contains("no such table")), "{broken:?}");
        let panicked = tokio::spawn({
            let database = database.clone();
            async move {
                let native = database.native().unwrap();
                native
                    .write(&database.pool, |transaction| {
                        transaction.execute("INSERT INTO t (source) VALUES ('panicked')", [])?;
                        panic!("a bug in the work");
                        #[allow(unreachable_code)]
                        Ok::<_, Failure>(())
                    })
                    .await
            }
        })
        .await;
        assert!(panicked.is_err());
        assert_eq!(count(&database).await, 0);
        // Rolled back as it unwound: the pool can write at once.
        sqlx::query("INSERT INTO t (source) VALUES ('after the panic')").execute(&database.pool).await.unwrap();
        sqlx::query("DELETE FROM t").execute(&database.pool).await.unwrap();

        // Native and pool writers at once, each in its own transaction that
        // reads then writes: none is refused as busy, none is lost.
        let mut tasks = tokio::task::JoinSet::new();
        for writer in 0..8 {
            let database = database.clone();
            tasks.spawn(async move {
                for _ in 0..50 {
                    if writer % 2 == 0 {
                        let native = database.native().unwrap();
                        native
                            .write(&database.pool, |transaction| {
                                let n: i64 = transaction.query_row("SELECT COUNT(*) FROM t", [], |row| row.get(0))?;
                                transaction.execute("INSERT INTO t (source) VALUES (?1)", [format!("native {n}")])?;
                                Ok::<_, Failure>(())
                            })
                            .await
                            .unwrap();
                    } else {
                        let mut transaction = database.pool.begin().await.unwrap();
                        let n: i64 =
                            sqlx::query_scalar("SELECT COUNT(*) FROM t").fetch_one(&mut *transaction).await.unwrap();
                        sqlx::query("INSERT INTO t (source) VALUES ($1)")
                            .bind(format!("pool {n}"))
                            .execute(&mut *transaction)
                            .await
                            .unwrap();
                        transaction.commit().await.unwrap();
                    }
                }
            });
        }
        while let Some(done) = tasks.join_next().await {
            done.unwrap();
        }
        assert_eq!(count(&database).await, 400);
        database.pool.close().await;
        database.reads.close().await;
    }

    async fn page_size(database: &Database) -> i64 {
        sqlx::query_scalar("PRAGMA page_size").fetch_one(&database.reads).await.unwrap()
    }

    /// A file takes the page size asked for, whichever connection creates
    /// it, and keeps it when opened again with another.
    #[tokio::test]
    async fn a_new_file_takes_the_page_size_asked_for_and_keeps_it() {
        let small = Connections { readers: 1, sqlite_page_size: crate::db::SMALL_PAGES, ..Connections::new(1) };
        for native_first in [true, false] {
            let (_folder, url) = temporary_file();
            let database = Database::connect_lazy_with(&url, small).unwrap();
            if native_first {
                let native = database.native().unwrap();
                native
                    .write(&database.pool, |transaction| -> Result<(), Failure> {
                        transaction.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY)")?;
                        Ok(())
                    })
                    .await
                    .unwrap();
            } else {
                sqlx::query("CREATE TABLE t (id INTEGER PRIMARY KEY)").execute(&database.pool).await.unwrap();
            }
            assert_eq!(page_size(&database).await, 1024, "created by the native connection first: {native_first}");
            database.pool.close().await;
            database.reads.close().await;

            let again =
                Database::connect_lazy_with(&url, Connections { sqlite_page_size: DEFAULT_PAGES, ..small }).unwrap();
            assert_eq!(page_size(&again).await, 1024, "an existing file keeps its pages");
            again.pool.close().await;
            again.reads.close().await;
        }
        let (_folder, url) = temporary_file();
        let database = Database::connect_lazy(&url, 1).unwrap();
        sqlx::query("CREATE TABLE t (id INTEGER PRIMARY KEY)").execute(&database.pool).await.unwrap();
        assert_eq!(page_size(&database).await, i64::from(DEFAULT_PAGES));
        database.pool.close().await;
    }

    /// Foreign keys are checked unless the database is asked not to, on
    /// the pools' connections and the native one alike.
    #[tokio::test]
    async fn foreign_keys_are_checked_unless_asked_not_to() {
        const SCHEMA: &str = "CREATE TABLE parent (id INTEGER PRIMARY KEY); \
             CREATE TABLE child (parent_id INTEGER NOT NULL REFERENCES parent (id));";
        for checked in [true, false] {
            let (_folder, url) = temporary_file();
            let connections = Connections { sqlite_foreign_keys: checked, ..Connections::new(1) };
            let database = Database::connect_lazy_with(&url, connections).unwrap();
            sqlx::raw_sql(SCHEMA).execute(&database.pool).await.unwrap();
            let pool = sqlx::query("INSERT INTO child (parent_id) VALUES (1)").execute(&database.pool).await;
            let native = database
                .native()
                .unwrap()
                .write(&database.pool, |transaction| -> Result<(), Failure> {
                    transaction.execute("INSERT INTO child (parent_id) VALUES (2)", [])?;
                    Ok(())
                })
                .await;
            assert_eq!(pool.is_err(), checked, "the pool's connection, checked: {checked}: {pool:?}");
            assert_eq!(native.is_err(), checked, "the native connection, checked: {checked}: {native:?}");
            database.pool.close().await;
        }
    }

    /// Commits never checkpoint; the checkpointer thread copies the log into
    /// the database file soon after, and stops with the database.
    #[tokio::test]
    async fn the_checkpointer_moves_the_log_into_the_file() {
        let (folder, url) = temporary_file();
        let database = Database::connect_lazy_with(&url, Connections { readers: 1, ..Connections::new(1) }).unwrap();
        let weak = Arc::downgrade(database._checkpointer.as_ref().expect("a SQLite file has a checkpointer"));
        sqlx::query("CREATE TABLE t (id INTEGER PRIMARY KEY, source TEXT NOT NULL)")
            .execute(&database.pool)
            .await
            .unwrap();
        let every: i64 = sqlx::query_scalar("PRAGMA wal_autocheckpoint").fetch_one(&database.pool).await.unwrap();
        assert_eq!(every, 0, "commits do not checkpoint");
        // 2 MB: less than the 1,000 pages (4 MB) at which a commit would
        // checkpoint by default, so only the thread puts them in the file.
        write_rows(&database, &folder, 20, 100, Duration::ZERO).await;
        let file = folder.0.join("t.db");
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::fs::metadata(&file).unwrap().len() < 2_000_000 {
            assert!(std::time::Instant::now() < deadline, "the log never reached the database file");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        database.pool.close().await;
        database.reads.close().await;
        drop(database);
        assert_eq!(weak.strong_count(), 0, "the thread's token is gone: it stops within its period");
    }

    fn log_size(folder: &Folder) -> u64 {
        std::fs::metadata(folder.0.join("t.db-wal")).map_or(0, |metadata| metadata.len())
    }

    /// Writes `transactions` of `rows` rows of 1 KB through the native
    /// connection, `pause` apart; the largest the log of `folder` was seen.
    async fn write_rows(
        database: &Database,
        folder: &Folder,
        transactions: usize,
        rows: usize,
        pause: Duration,
    ) -> u64 {
        let mut largest = 0;
        let native = database.native().unwrap();
        for _ in 0..transactions {
            native
                .write(&database.pool, |transaction| -> Result<(), Failure> {
                    let mut insert = transaction.prepare_cached("INSERT INTO t (source) VALUES (?1)")?;
                    for _ in 0..rows {
                        insert.execute([&"x".repeat(1000)])?;
                    }
                    Ok(())
                })
                .await
                .unwrap();
            largest = largest.max(log_size(folder));
            if !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
        }
        largest
    }

    /// A reader that held the log while it grew does not leave it large:
    /// every connection cuts it back to the limit, and once no commit
    /// comes the checkpointer empties it.
    #[tokio::test]
    async fn the_log_is_emptied_once_the_writer_is_idle() {
        let (folder, url) = temporary_file();
        let database = Database::connect_lazy_with(&url, Connections { readers: 1, ..Connections::new(1) }).unwrap();
        sqlx::query("CREATE TABLE t (id INTEGER PRIMARY KEY, source TEXT NOT NULL)")
            .execute(&database.pool)
            .await
            .unwrap();
        let limit: i64 = sqlx::query_scalar("PRAGMA journal_size_limit").fetch_one(&database.reads).await.unwrap();
        assert_eq!(limit as u64, crate::db::WAL_SIZE_LIMIT);
        // A read transaction open from the start keeps every frame in the log.
        let reader = Connection::open(folder.0.join("t.db")).unwrap();
        reader.execute_batch("BEGIN").unwrap();
        let _: i64 = reader.query_row("SELECT COUNT(*) FROM t", [], |row| row.get(0)).unwrap();
        write_rows(&database, &folder, 150, 64, Duration::ZERO).await;
        let grown = log_size(&folder);
        assert!(grown > 2 * crate::db::WAL_SIZE_LIMIT, "the held log grew: {grown} bytes");
        reader.execute_batch("COMMIT").unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while log_size(&folder) > 1024 * 1024 {
            assert!(
                std::time::Instant::now() < deadline,
                "the log stayed at {} bytes once idle (it had grown to {grown})",
                log_size(&folder)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        database.pool.close().await;
        database.reads.close().await;
    }

    /// Readers that overlap, so that one always reads from the log, do not
    /// keep it from starting over: it stays within a few times its limit
    /// while the writer writes six times that.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn overlapping_readers_cannot_starve_the_checkpoints() {
        // A reader descheduled for half a second on a loaded machine can make
        // one RESTART busy, and the backoff after it lets the log grow past
        // the bound: tried twice. A checkpointer the readers starve fails
        // both (the log reaches the 24 MB written each time).
        let mut sizes = Vec::new();
        for _ in 0..2 {
            let largest = largest_log_under_overlapping_readers().await;
            if largest < 3 * crate::db::WAL_SIZE_LIMIT {
                return;
            }
            sizes.push(largest);
        }
        panic!("the log reached {sizes:?} bytes");
    }

    /// The largest the log grew while two overlapping readers read and the
    /// writer wrote 24 MB.
    #[expect(
        clippy::disallowed_methods,
        reason = "the readers are threads of their own, holding their transactions for a while"
    )]
    async fn largest_log_under_overlapping_readers() -> u64 {
        let (folder, url) = temporary_file();
        let database = Database::connect_lazy_with(&url, Connections { readers: 1, ..Connections::new(1) }).unwrap();
        sqlx::query("CREATE TABLE t (id INTEGER PRIMARY KEY, source TEXT NOT NULL)")
            .execute(&database.pool)
            .await
            .unwrap();
        write_rows(&database, &folder, 1, 64, Duration::ZERO).await;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let readers: Vec<_> = (0..2)
            .map(|index| {
                let (path, stop) = (folder.0.join("t.db"), stop.clone());
                std::thread::spawn(move || {
                    let reader = Connection::open(path).unwrap();
                    reader.busy_timeout(Duration::from_secs(5)).unwrap();
                    std::thread::sleep(Duration::from_millis(3 * index));
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        reader.execute_batch("BEGIN").unwrap();
                        let _: i64 = reader.query_row("SELECT MAX(id) FROM t", [], |row| row.get(0)).unwrap();
                        std::thread::sleep(Duration::from_millis(6));
                        reader.execute_batch("COMMIT").unwrap();
                    }
                })
            })
            .collect();
        // 64 KB per commit, 24 MB in all (six times the limit), at most
        // 13 MB/s (the checkpointer looks every 100 ms).
        let largest = write_rows(&database, &folder, 384, 64, Duration::from_millis(5)).await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for reader in readers {
            reader.join().unwrap();
        }
        database.pool.close().await;
        database.reads.close().await;
        largest
    }

    /// How often the statement was prepared again after its first run, over
    /// ten runs with a new limit bound each time.
    fn prepared_again(connection: &Connection, sql: &str) -> i32 {
        let mut statement = connection.prepare(sql).unwrap();
        for limit in 1..=10_i64 {
            let rows: Vec<i64> =
                statement.query_map([limit], |row| row.get(0)).unwrap().collect::<Result<_, _>>().unwrap();
            assert_eq!(rows.len(), limit as usize);
        }
        statement.get_status(rusqlite::StatementStatus::RePrepare)
    }

    #[test]
    fn a_limit_bound_through_a_cast_does_not_prepare_the_statement_again() {
        let connection = Connection::open_in_memory().unwrap();
        connection
            .execute_batch(
                "CREATE TABLE t (id INTEGER PRIMARY KEY); \
                 WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20) INSERT INTO t SELECT i FROM n;",
            )
            .unwrap();
        assert!(
            prepared_again(&connection, "SELECT id FROM t WHERE id > 0 ORDER BY id LIMIT ?1") >= 9,
            "SQLite plans a bare bound LIMIT with its value: this is why the cast is there"
        );
        assert_eq!(
            prepared_again(&connection, "SELECT id FROM t WHERE id > 0 ORDER BY id LIMIT CAST(?1 AS BIGINT)"),
            0
        );
    }

    #[test]
    fn only_files_have_a_native_connection() {
        assert_eq!(file_of("sqlite://data/roster.db?mode=rwc"), Some(PathBuf::from("data/roster.db")));
        assert_eq!(file_of("sqlite:/var/lib/muster/x.db"), Some(PathBuf::from("/var/lib/muster/x.db")));
        assert_eq!(file_of("sqlite::memory:"), None);
        assert_eq!(file_of("sqlite://shared?mode=memory&cache=shared"), None);
    }
}
