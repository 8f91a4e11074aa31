//! The library behind the `muster` command line: starting and supervising a
//! cluster of the four service processes ([`cluster`]), the credentials of a
//! cluster on this machine and the channels that carry them
//! ([`credentials`]), where a cluster is ([`context`]), the Rust agent worker library (the `muster-worker`
//! crate, as [`worker`]), reading
//! agents' inboxes ([`inbox`]), with the deterministic sample behaviour the
//! CLI's sample agents use ([`sample`]).
//!
//! The behaviour `muster agent` serves (model-driven agents beside sample
//! ones) is [`agents`].
//!
//! It holds no service logic: everything goes through the services' gRPC APIs.
#![forbid(unsafe_code)]

pub mod agents;
pub mod cluster;
pub mod context;
pub mod credentials;
pub mod inbox;
pub mod sample;
pub use muster_worker as worker;
