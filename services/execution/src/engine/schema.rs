//! JSON schemas the engine applies: a tool's input schema, and a role's
//! input and output schemas. Each distinct schema is compiled once per
//! driver.

use std::{collections::HashMap, sync::Arc};

use jsonschema::Validator;

/// A schema compiled from its JSON text; `None` for an empty text, which
/// accepts anything.
pub(crate) fn compile(schema_json: &str) -> Result<Option<Validator>, String> {
    if schema_json.trim().is_empty() {
        return Ok(None);
    }
    let schema: serde_json::Value =
        serde_json::from_str(schema_json).map_err(|error| format!("the schema is not JSON: {error}"))?;
    jsonschema::validator_for(&schema).map(Some).map_err(|error| format!("the schema is not valid: {error}"))
}

/// Where and how a value breaks a schema, one entry per violation
/// (`at /path: ...`); empty when it matches.
pub(crate) fn violations(validator: &Validator, value: &serde_json::Value) -> Vec<String> {
    validator
        .iter_errors(value)
        .map(|error| {
            let at = error.instance_path().to_string();
            format!("at {}: {error}", if at.is_empty() { "/" } else { &at })
        })
        .collect()
}

/// Schemas compiled so far, by their text.
#[derive(Default)]
pub(crate) struct Compiled {
    known: HashMap<String, Result<Option<Arc<Validator>>, String>>,
}

impl Compiled {
    /// Most schemas kept: a driver sees the roles of its executors.
    const KEPT: usize = 256;

    /// Checks `value` against the schema in `schema_json`; `Err` says why
    /// it does not match, or why the schema cannot be used.
    pub(crate) fn check(&mut self, schema_json: &str, value: &serde_json::Value) -> Result<(), String> {
        if schema_json.trim().is_empty() {
            return Ok(());
        }
        if !self.known.contains_key(schema_json) {
            if self.known.len() >= Self::KEPT {
                self.known.clear();
            }
            self.known.insert(schema_json.to_owned(), compile(schema_json).map(|compiled| compiled.map(Arc::new)));
        }
        match &self.known[schema_json] {
            Ok(Some(validator)) => {
                let found = violations(validator, value);
                if found.is_empty() { Ok(()) } else { Err(found.join("; ")) }
            }
            Ok(None) => Ok(()),
            Err(reason) => Err(reason.clone()),
        }
    }
}
