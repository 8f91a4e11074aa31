//! What one statement costs through the shared database layer (sqlx, SQLite
//! WAL, `synchronous = NORMAL`), with nothing else running: a `SELECT 1` on
//! the pool (a connection taken and given back each time), and a
//! transaction of one small write (`BEGIN`, `INSERT`, `COMMIT` on one
//! connection). sqlx runs SQLite on a thread of its own: each statement is
//! handed to that thread and its answer handed back, so these figures are
//! mostly that hand-off. The same transaction through the native
//! connection (`NativeSqlite`: run whole on the calling thread, holding the
//! pool's connection for its turn) shows what is left without it.
//!
//! `cargo bench -p muster-runtime --bench statements`

use std::time::Instant;

use muster_runtime::db::Database;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let path = std::env::temp_dir().join(format!("muster-statements-bench-{}.db", std::process::id()));
    let database = Database::connect_lazy(&format!("sqlite://{}", path.display()), 1).expect("database");
    sqlx::query("CREATE TABLE rows (id INTEGER PRIMARY KEY, value INTEGER NOT NULL)")
        .execute(&database.pool)
        .await
        .expect("table");
    const STATEMENTS: u32 = 5_000;
    for round in 1..=3 {
        let started = Instant::now();
        for _ in 0..STATEMENTS {
            sqlx::query("SELECT 1").fetch_one(&database.pool).await.expect("select");
        }
        let select = started.elapsed() / STATEMENTS;
        let started = Instant::now();
        for id in 0..STATEMENTS / 5 {
            let mut transaction = database.pool.begin().await.expect("begin");
            sqlx::query("INSERT OR REPLACE INTO rows (id, value) VALUES ($1, 1)")
                .bind(i64::from(id))
                .execute(&mut *transaction)
                .await
                .expect("insert");
            transaction.commit().await.expect("commit");
        }
        let write = started.elapsed() / (STATEMENTS / 5);
        let native = database.native().expect("a SQLite file");
        let started = Instant::now();
        for id in 0..STATEMENTS {
            native
                .write(&database.pool, |transaction| {
                    transaction
                        .prepare_cached("INSERT OR REPLACE INTO rows (id, value) VALUES (?1, 2)")?
                        .execute([i64::from(id)])?;
                    Ok::<_, muster_runtime::Error>(())
                })
                .await
                .expect("native write");
        }
        let native_write = started.elapsed() / STATEMENTS;
        println!(
            "round {round}: SELECT 1 on the pool {select:>9.1?}   BEGIN + INSERT + COMMIT {write:>9.1?}   \
             the same, native {native_write:>9.1?}"
        );
    }
    database.pool.close().await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}
