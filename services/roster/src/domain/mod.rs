//! The roster's logic: entities and their validation, the delegation decision
//! framework, roster import and system prompts. No tonic, no sqlx.

pub mod delegation;
pub mod import;
pub mod model;
pub mod prompt;
