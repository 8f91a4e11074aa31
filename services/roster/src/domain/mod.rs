//! The roster's logic: entities and their validation, the delegation decision
//! framework, roster import and system prompts. No tonic, no sqlx.

mod decision_text;
pub mod delegation;
pub mod import;
mod import_markdown;
mod import_yaml;
pub mod model;
pub mod prompt;
