//! Database pools and migrations. The URL chooses the backend: `sqlite://`
//! (the embedded default) or `postgres://`. Services use sqlx's `Any` driver
//! with portable SQL; each ships one migration set per backend.
//!
//! A bound `LIMIT` is written `LIMIT CAST($n AS BIGINT)`: SQLite plans a
//! bare `LIMIT $n` with the value bound when it prepared the statement, so
//! every new value prepares the statement again (a parse and a plan on each
//! call of a cached statement); the cast keeps the limit a value read when
//! the statement runs. Both backends read it the same way.

use std::{borrow::Cow, str::FromStr, sync::Arc};

use sqlx::{
    AnyPool, Executor,
    any::AnyPoolOptions,
    migrate::{Migration, MigrationType, Migrator},
};

use crate::{Error, Result};

mod native;
pub use native::NativeSqlite;

/// The database behind a URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// SQLite, one file per service.
    Sqlite,
    /// PostgreSQL.
    Postgres,
}

impl FromStr for Backend {
    type Err = Error;

    fn from_str(url: &str) -> Result<Self> {
        if url.starts_with("sqlite:") {
            Ok(Self::Sqlite)
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            Ok(Self::Postgres)
        } else {
            Err(Error::UnsupportedDatabase(url.to_owned()))
        }
    }
}

/// One migration: a version, a description and its SQL.
pub type MigrationStep = (i64, &'static str, &'static str);

/// A service's migrations, one list per backend.
#[derive(Debug, Clone, Copy)]
pub struct Migrations {
    /// For SQLite.
    pub sqlite: &'static [MigrationStep],
    /// For PostgreSQL.
    pub postgres: &'static [MigrationStep],
}

/// A pool and the backend it talks to.
#[derive(Debug, Clone)]
pub struct Database {
    /// The pool: every write goes through it.
    pub pool: AnyPool,
    /// Reads that need not wait for writers, nor make writers wait: a
    /// separate pool (read-only connections with SQLite, which WAL lets read
    /// while the one writer writes), or the same pool as [`Database::pool`]
    /// when no readers were asked for.
    pub reads: AnyPool,
    /// Which backend.
    pub backend: Backend,
    /// Write transactions run whole on the calling thread, for a SQLite
    /// file ([`NativeSqlite`]).
    native: Option<Arc<NativeSqlite>>,
    /// Keeps the SQLite file's checkpointer thread running while any clone
    /// of this lives (see `native::spawn_checkpointer`).
    _checkpointer: Option<Arc<()>>,
}

/// Settings of every connection to a SQLite file, after its page size and
/// foreign keys: WAL, with temporary data in memory (a multi-row statement
/// in a transaction keeps a statement journal, by default a temporary file
/// written on every such statement), and a write-ahead log cut back to
/// [`WAL_SIZE_LIMIT`] bytes each time it starts over (without a limit the
/// file keeps the largest size it ever reached).
const SQLITE_SETTINGS: &str = "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; \
     PRAGMA busy_timeout = 5000; PRAGMA temp_store = MEMORY; PRAGMA journal_size_limit = 4194304;";

/// The size (4 MiB) a SQLite file's write-ahead log is cut back to when it
/// starts over (`journal_size_limit`); past it, the checkpointer waits for
/// readers so that the log can start over (see `native::spawn_checkpointer`).
pub const WAL_SIZE_LIMIT: u64 = 4 * 1024 * 1024;

/// SQLite's own page size, for files written in large batches.
pub const DEFAULT_PAGES: u32 = 4096;

/// A page size for files written in many small transactions. A commit
/// writes every page it changed to the write-ahead log, whole: a
/// transaction that changes a few small rows in several tables and
/// indexes writes a page per table and per index, so with 1 KiB pages it
/// writes a quarter of the bytes it writes with 4 KiB ones.
pub const SMALL_PAGES: u32 = 1024;

/// The settings of a connection to a SQLite file, as `connections` asks.
/// The page size must come first: once WAL is on, the file's page size
/// cannot change.
fn sqlite_settings(connections: &Connections) -> Arc<str> {
    let foreign_keys = if connections.sqlite_foreign_keys { "ON" } else { "OFF" };
    format!(
        "PRAGMA page_size = {}; PRAGMA foreign_keys = {foreign_keys}; {SQLITE_SETTINGS}",
        connections.sqlite_page_size
    )
    .into()
}

/// For the connections of a file that a checkpointer thread looks after.
const NO_CHECKPOINT_ON_COMMIT: &str = "PRAGMA wal_autocheckpoint = 0;";

/// The placeholder of the `number`th (1-based) bind parameter. SQLite gets
/// anonymous `?`: it resolves `$N` names with a linear search per parameter,
/// which makes large multi-row statements quadratic.
pub fn placeholder(backend: Backend, number: usize) -> String {
    match backend {
        Backend::Sqlite => "?".to_owned(),
        Backend::Postgres => format!("${number}"),
    }
}

/// The row counts of multi-row statements on SQLite (each value bound, or
/// each element of an `IN` list): rows go in statements of these sizes,
/// largest first ([`in_statements`]), so a connection prepares at most
/// four texts per statement. A text per row count would make hundreds,
/// which take turns in the connection's cache of prepared statements when
/// batches of every size come, each parsed again.
pub const ROW_COUNTS: [usize; 4] = [256, 32, 4, 1];

/// `rows` in the statements they go in: sizes from [`ROW_COUNTS`], largest first.
pub fn in_statements<T>(mut rows: &[T]) -> impl Iterator<Item = &[T]> {
    std::iter::from_fn(move || {
        let size = ROW_COUNTS.into_iter().find(|size| *size <= rows.len())?;
        let (statement, rest) = rows.split_at(size);
        rows = rest;
        Some(statement)
    })
}

/// `placeholder(first), placeholder(first + 1), ..` for `count` parameters.
pub fn placeholder_list(backend: Backend, first: usize, count: usize) -> String {
    (first..first + count).map(|number| placeholder(backend, number)).collect::<Vec<_>>().join(", ")
}

/// `($1, $2, ..), ($k, ..)` for `rows` rows of `columns` placeholders.
pub fn placeholders(backend: Backend, rows: usize, columns: usize) -> String {
    let mut text = String::with_capacity(rows * columns * 5);
    for row in 0..rows {
        if row > 0 {
            text.push_str(", ");
        }
        text.push('(');
        text.push_str(&placeholder_list(backend, row * columns + 1, columns));
        text.push(')');
    }
    text
}

/// [`Connections::idle_in_transaction`] unless set: no transaction of
/// muster's waits on anything but the database for so long.
pub const IDLE_IN_TRANSACTION: std::time::Duration = std::time::Duration::from_secs(5);

/// How many connections a [`Database`] opens, and the SQLite settings
/// they open with.
#[derive(Debug, Clone, Copy)]
pub struct Connections {
    /// The writers' pool on PostgreSQL (on SQLite it is one connection).
    pub max_connections: u32,
    /// A pool of read connections for [`Database::reads`] (0: reads share
    /// the writers' pool).
    pub readers: u32,
    /// The page size of a SQLite file the database creates
    /// ([`DEFAULT_PAGES`], [`SMALL_PAGES`]); a file that exists keeps its own.
    pub sqlite_page_size: u32,
    /// Whether SQLite checks the schema's foreign keys (PostgreSQL always
    /// does). Checked, a multi-row insert into a table with one looks up
    /// each row's parent and keeps a statement journal, so that a missing
    /// parent can undo the statement alone.
    pub sqlite_foreign_keys: bool,
    /// How long PostgreSQL keeps a transaction whose client has sent
    /// nothing (`idle_in_transaction_session_timeout`): a process cut off
    /// from the database mid-transaction, or paused, would otherwise hold
    /// the transaction's locks (and the turns services take with advisory
    /// locks) until the server finds the connection dead, hours later.
    pub idle_in_transaction: std::time::Duration,
}

impl Connections {
    /// `max_connections` writers, reads on the writers' pool, SQLite's own
    /// page size, foreign keys checked.
    pub fn new(max_connections: u32) -> Self {
        Self {
            max_connections,
            readers: 0,
            sqlite_page_size: DEFAULT_PAGES,
            sqlite_foreign_keys: true,
            idle_in_transaction: IDLE_IN_TRANSACTION,
        }
    }
}

impl Database {
    /// A pool that connects on first use, so a service can listen (NOT_SERVING)
    /// before its database answers. SQLite files, and their folder, are
    /// created when missing.
    pub fn connect_lazy(url: &str, max_connections: u32) -> Result<Self> {
        Self::connect_lazy_with(url, Connections::new(max_connections))
    }

    /// [`Database::connect_lazy`], with the pools and the SQLite settings of `connections`.
    pub fn connect_lazy_with(url: &str, connections: Connections) -> Result<Self> {
        let Connections { max_connections, readers, .. } = connections;
        sqlx::any::install_default_drivers();
        let backend: Backend = url.parse()?;
        if backend == Backend::Sqlite {
            create_sqlite_folder(url)?;
            if let Some(path) = native::file_of(url) {
                create_private_file(&path)?;
            }
        }
        let (url, max_connections) = match backend {
            // One connection: SQLite serialises writers anyway, and a single
            // connection avoids SQLITE_BUSY on read-to-write upgrades.
            Backend::Sqlite => (with_create_mode(url), 1),
            Backend::Postgres => (url.to_owned(), max_connections),
        };
        let file = match backend {
            Backend::Sqlite => native::file_of(&url),
            Backend::Postgres => None,
        };
        // The checkpointer takes the writers' turn (their pool's one
        // connection) for its checkpoints that hold writers back.
        let writers = Arc::new(std::sync::OnceLock::new());
        let checkpointer = file.clone().and_then(|path| native::spawn_checkpointer(path, writers.clone()));
        let checkpointed = checkpointer.is_some();
        let settings = match backend {
            Backend::Sqlite => sqlite_settings(&connections),
            Backend::Postgres => format!(
                "SET idle_in_transaction_session_timeout = {}",
                connections.idle_in_transaction.as_millis().max(1)
            )
            .into(),
        };
        let pool = pool_options(backend, max_connections, &settings, false, checkpointed).connect_lazy(&url)?;
        let _ = writers.set(pool.clone());
        // Reads get connections of their own, so that a flood of reads
        // cannot take the connections the writers need.
        let reads = if readers > 0 {
            pool_options(backend, readers, &settings, backend == Backend::Sqlite, checkpointed).connect_lazy(&url)?
        } else {
            pool.clone()
        };
        let native = file.map(|path| Arc::new(NativeSqlite::new(path, settings, checkpointed)));
        Ok(Self { pool, reads, backend, native, _checkpointer: checkpointer })
    }

    /// Begins a transaction that writes, on [`Database::pool`]. On SQLite it
    /// is `BEGIN IMMEDIATE`, which takes the file's write lock first (waiting
    /// for it as `busy_timeout` says): a deferred transaction that read
    /// before it wrote is refused at once as busy when another connection to
    /// the file (another replica's, or this process's native one) committed
    /// since its read.
    pub async fn begin_write(&self) -> std::result::Result<sqlx::Transaction<'static, sqlx::Any>, sqlx::Error> {
        match self.backend {
            Backend::Sqlite => self.pool.begin_with("BEGIN IMMEDIATE").await,
            Backend::Postgres => self.pool.begin().await,
        }
    }

    /// The native connection of a SQLite file, for write transactions that
    /// should not pay a thread hand-off per statement; `None` on PostgreSQL
    /// and for a SQLite database in memory.
    pub fn native(&self) -> Option<&NativeSqlite> {
        self.native.as_deref()
    }

    /// Runs the migrations of this backend.
    pub async fn migrate(&self, migrations: &Migrations) -> Result<()> {
        let steps = match self.backend {
            Backend::Sqlite => migrations.sqlite,
            Backend::Postgres => migrations.postgres,
        };
        let migrator = Migrator::with_migrations(
            steps
                .iter()
                .map(|(version, description, sql)| {
                    Migration::new(
                        *version,
                        Cow::Borrowed(*description),
                        MigrationType::Simple,
                        sql.into_sql_str(),
                        false,
                    )
                })
                .collect(),
        );
        migrator.run(&self.pool).await?;
        Ok(())
    }
}

/// Pool settings: connections opened with `settings` (SQLite's pragmas,
/// PostgreSQL's session settings); SQLite's read-only ones refuse writes; with `checkpointed`, no commit
/// checkpoints). A SQLite connection is not tested before it is handed
/// out: it cannot have been cut, and the test is a round trip to its
/// thread.
fn pool_options(
    backend: Backend,
    max_connections: u32,
    settings: &Arc<str>,
    read_only: bool,
    checkpointed: bool,
) -> AnyPoolOptions {
    let options =
        AnyPoolOptions::new().max_connections(max_connections).test_before_acquire(backend == Backend::Postgres);
    let settings = settings.clone();
    options.after_connect(move |connection, _| {
        let settings = settings.clone();
        Box::pin(async move {
            connection.execute(sqlx::AssertSqlSafe(&*settings)).await?;
            if backend == Backend::Sqlite {
                if checkpointed {
                    connection.execute(NO_CHECKPOINT_ON_COMMIT).await?;
                }
                if read_only {
                    connection.execute("PRAGMA query_only = ON;").await?;
                }
            }
            Ok(())
        })
    })
}

use sqlx::SqlSafeStr as _;

fn create_sqlite_folder(url: &str) -> Result<()> {
    let path = url.trim_start_matches("sqlite://").trim_start_matches("sqlite:");
    let path = path.split('?').next().unwrap_or_default();
    if path.is_empty() || path == ":memory:" {
        return Ok(());
    }
    if let Some(folder) = std::path::Path::new(path).parent().filter(|folder| !folder.as_os_str().is_empty()) {
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, crate::files::PRIVATE_FOLDER);
        builder
            .create(folder)
            .map_err(|source| Error::Io { context: format!("creating {}", folder.display()), source })?;
    }
    Ok(())
}

/// Creates the SQLite file at `path` empty (a valid database) and its
/// owner's alone (0600) when missing, so that SQLite, which creates its
/// `-wal` and `-shm` with the mode of the database file, makes them 0600
/// too whatever the umask; narrows the three to 0600 when they exist.
fn create_private_file(path: &std::path::Path) -> Result<()> {
    let io_error = |source| Error::Io { context: format!("making {} private", path.display()), source };
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(false);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, crate::files::PRIVATE_FILE);
    options.open(path).map_err(io_error)?;
    for suffix in ["", "-wal", "-shm"] {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        crate::files::make_private(std::path::Path::new(&name)).map_err(io_error)?;
    }
    Ok(())
}

fn with_create_mode(url: &str) -> String {
    if url.contains("mode=") || url.contains(":memory:") {
        url.to_owned()
    } else if url.contains('?') {
        format!("{url}&mode=rwc")
    } else {
        format!("{url}?mode=rwc")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn rows_go_in_statements_of_the_few_sizes_prepared_largest_first_each_row_once() {
        for count in [0, 1, 3, 4, 5, 31, 32, 33, 255, 256, 257, 300, 1000, 4097] {
            let rows: Vec<usize> = (0..count).collect();
            let statements: Vec<&[usize]> = super::in_statements(&rows).collect();
            assert_eq!(statements.concat(), rows, "every row once, in order ({count})");
            assert!(statements.iter().all(|statement| super::ROW_COUNTS.contains(&statement.len())), "{count}");
            assert!(statements.windows(2).all(|pair| pair[0].len() >= pair[1].len()), "largest first ({count})");
            // Fewer than 8 of each smaller size: the next larger one takes 8.
            for size in &super::ROW_COUNTS[1..] {
                assert!(statements.iter().filter(|statement| statement.len() == *size).count() < 8, "{count}");
            }
        }
    }
}
