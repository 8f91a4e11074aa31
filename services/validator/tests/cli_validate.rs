//! Compiles and tests `cli/src/validate.rs` (the `muster validate` command)
//! against this crate, so the command's formatting is checked with the rules
//! it prints.
#![allow(dead_code, unreachable_pub, missing_docs)]

#[path = "../../../cli/src/validate.rs"]
mod validate;
