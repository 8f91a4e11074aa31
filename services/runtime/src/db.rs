//! Database pools and migrations. The URL chooses the backend: `sqlite://`
//! (the embedded default) or `postgres://`. Services use sqlx's `Any` driver
//! with portable SQL; each ships one migration set per backend.

use std::{borrow::Cow, str::FromStr};

use sqlx::{
    AnyPool, Executor,
    any::AnyPoolOptions,
    migrate::{Migration, MigrationType, Migrator},
};

use crate::{Error, Result};

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
    /// The pool.
    pub pool: AnyPool,
    /// Which backend.
    pub backend: Backend,
}

impl Database {
    /// A pool that connects on first use, so a service can listen (NOT_SERVING)
    /// before its database answers. SQLite files, and their folder, are
    /// created when missing.
    pub fn connect_lazy(url: &str, max_connections: u32) -> Result<Self> {
        sqlx::any::install_default_drivers();
        let backend: Backend = url.parse()?;
        if backend == Backend::Sqlite {
            create_sqlite_folder(url)?;
        }
        let (url, max_connections) = match backend {
            // One connection: SQLite serialises writers anyway, and a single
            // connection avoids SQLITE_BUSY on read-to-write upgrades.
            Backend::Sqlite => (with_create_mode(url), 1),
            Backend::Postgres => (url.to_owned(), max_connections),
        };
        let pool = AnyPoolOptions::new()
            .max_connections(max_connections)
            .after_connect(move |connection, _| {
                Box::pin(async move {
                    if backend == Backend::Sqlite {
                        connection
                            .execute(
                                "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; \
                                 PRAGMA foreign_keys = ON; PRAGMA busy_timeout = 5000;",
                            )
                            .await?;
                    }
                    Ok(())
                })
            })
            .connect_lazy(&url)?;
        Ok(Self { pool, backend })
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

use sqlx::SqlSafeStr as _;

fn create_sqlite_folder(url: &str) -> Result<()> {
    let path = url.trim_start_matches("sqlite://").trim_start_matches("sqlite:");
    let path = path.split('?').next().unwrap_or_default();
    if path.is_empty() || path == ":memory:" {
        return Ok(());
    }
    if let Some(folder) = std::path::Path::new(path).parent().filter(|folder| !folder.as_os_str().is_empty()) {
        std::fs::create_dir_all(folder)
            .map_err(|source| Error::Io { context: format!("creating {}", folder.display()), source })?;
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
