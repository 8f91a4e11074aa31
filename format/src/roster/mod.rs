//! The roster's documents: its entities and the rules each obeys
//! ([`model`]), and the files a roster is imported from ([`import`]): a YAML
//! roster of teams, agents and roles, and Markdown role definitions, read
//! with a diagnostic (file, path, line and column) for everything wrong —
//! and an agent's model settings ([`llm_config`]).
//! The roster service imports with it; `muster validate` checks the same
//! files offline.

pub mod import;
pub mod llm_config;
pub mod model;
