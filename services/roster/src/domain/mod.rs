//! The roster's logic: the delegation decision framework and system prompts,
//! over the entities, their validation and roster import that the format
//! library holds (re-exported here as [`model`] and [`import`]). No tonic, no sqlx.

pub mod delegation;
pub mod prompt;

/// Roster import, from the format library.
pub use muster_format::roster::import;
/// The roster's entities and their rules, from the format library.
pub use muster_format::roster::model;
