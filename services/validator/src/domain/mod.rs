//! The validator's rules, free of gRPC: the YAML reader with positions, the
//! process rules, role definitions and the permission matrix.

mod budget;
pub(crate) mod diagnostic;
mod emi;
mod fields;
pub(crate) mod formats;
mod graph;
mod markdown;
pub(crate) mod matrix;
pub(crate) mod model;
pub(crate) mod process;
mod references;
pub(crate) mod role;
pub(crate) mod yaml;

pub use diagnostic::{Diagnostic, Severity};

#[cfg(test)]
mod tests;
