//! The cluster end to end: four real service processes over real gRPC, on
//! SQLite and on PostgreSQL, driven by the `muster` command, the Rust
//! clients, the Python client, grpcurl and `buf curl`.
//!
//! One test binary for all of them, so the end-to-end tests build once and
//! run side by side (`cargo test -p muster-tests --test e2e -- replicas::`
//! runs one module). The read flood (`load`) and the soak (`soak`) are
//! binaries of their own: they want the machine to themselves.

mod agent_contexts;
mod agent_memory;
mod agents;
mod authority;
mod budgets;
mod chaos;
mod cli;
mod clients;
mod console;
mod data_at_rest;
mod delegation_notice;
mod examples;
mod execution;
mod go_client;
mod inbox;
mod inbox_folders;
mod limits;
mod mcp;
mod memory_release;
mod metrics;
mod model_clients;
mod page_tokens;
mod partitions;
mod payloads;
mod progress;
mod replicas;
mod restarts;
mod roles;
mod roster_cli;
mod sample_process;
mod schedules;
mod sessions;
mod slow_clients;
mod strangers;
mod supervision;
mod tls;
mod tools;
mod tracing;
mod windows;
mod workers;
