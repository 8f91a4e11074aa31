//! The subcommands.

pub(crate) mod act;
pub(crate) mod agent;
pub(crate) mod demo;
pub(crate) mod roster;
pub(crate) mod run;
pub(crate) mod up;
