//! Large values kept out of assignments: a step's merged inputs and the
//! outputs of the steps it depends on travel inline while small, and as a
//! [`PayloadRef`] otherwise — stored once (outputs in their step, inputs
//! recomputed from the execution's and the step's own), read in chunks with
//! `ReadPayload`. So an assignment stays small however large the data a
//! step works on.

use std::sync::Arc;

use serde_json::{Map, Value};

/// The largest value carried inline.
pub const INLINE_BYTES: usize = 64 * 1024;
/// The most bytes of upstream outputs carried inline in one assignment.
pub const INLINE_TOTAL_BYTES: usize = 1024 * 1024;
/// The largest chunk of a `ReadPayload` answer.
pub const CHUNK_BYTES: usize = 256 * 1024;

/// Which value of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadKind {
    Output,
    Inputs,
}

/// A value left out of an assignment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PayloadRef {
    pub step_id: String,
    pub kind: PayloadKind,
    pub size_bytes: u64,
}

/// A step's inputs: the execution's overlaid with the step's own, as JSON text.
pub fn merge_inputs(execution_inputs: &Map<String, Value>, step_inputs: &str) -> String {
    match serde_json::from_str::<Value>(step_inputs) {
        Ok(Value::Object(own)) if !own.is_empty() => {
            let mut merged = execution_inputs.clone();
            merged.extend(own);
            Value::Object(merged).to_string()
        }
        _ => Value::Object(execution_inputs.clone()).to_string(),
    }
}

/// An execution's inputs as a map (an empty one when they are not an object).
pub fn execution_inputs(inputs_json: &str) -> Map<String, Value> {
    match serde_json::from_str(inputs_json) {
        Ok(Value::Object(map)) => map,
        _ => Map::new(),
    }
}

/// What an assignment carries of a step's inputs and upstream outputs.
#[derive(Debug, PartialEq)]
pub struct Carried {
    /// The inputs when small enough; empty otherwise.
    pub inputs_json: String,
    /// The upstream outputs that travel inline, by step id.
    pub upstream_outputs: Vec<(String, Arc<str>)>,
    /// The rest.
    pub payload_refs: Vec<PayloadRef>,
}

/// Splits a step's inputs and upstream outputs into what travels inline and
/// what goes by reference.
pub fn split(step_id: &str, inputs: String, upstream: Vec<(String, Arc<str>)>) -> Carried {
    let mut refs = Vec::new();
    let inputs = if inputs.len() > INLINE_BYTES {
        refs.push(PayloadRef {
            step_id: step_id.to_owned(),
            kind: PayloadKind::Inputs,
            size_bytes: inputs.len() as u64,
        });
        String::new()
    } else {
        inputs
    };
    let mut room = INLINE_TOTAL_BYTES;
    let mut inline = Vec::with_capacity(upstream.len());
    for (step_id, output) in upstream {
        if output.len() <= INLINE_BYTES && output.len() <= room {
            room -= output.len();
            inline.push((step_id, output));
        } else {
            refs.push(PayloadRef { step_id, kind: PayloadKind::Output, size_bytes: output.len() as u64 });
        }
    }
    Carried { inputs_json: inputs, upstream_outputs: inline, payload_refs: refs }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_values_travel_inline_and_large_ones_by_reference() {
        let small: Arc<str> = Arc::from("{\"a\":1}");
        let large: Arc<str> = Arc::from(format!("\"{}\"", "x".repeat(INLINE_BYTES)));
        let carried = split(
            "join",
            "{}".to_owned(),
            vec![("small".to_owned(), small.clone()), ("large".to_owned(), large.clone())],
        );
        assert_eq!(carried.inputs_json, "{}");
        assert_eq!(carried.upstream_outputs, [("small".to_owned(), small)]);
        assert_eq!(
            carried.payload_refs,
            [PayloadRef { step_id: "large".to_owned(), kind: PayloadKind::Output, size_bytes: large.len() as u64 }]
        );

        let big_inputs = format!("{{\"text\":\"{}\"}}", "y".repeat(INLINE_BYTES));
        let size = big_inputs.len() as u64;
        let carried = split("join", big_inputs, Vec::new());
        assert_eq!(carried.inputs_json, "");
        assert_eq!(
            carried.payload_refs,
            [PayloadRef { step_id: "join".to_owned(), kind: PayloadKind::Inputs, size_bytes: size }]
        );
    }

    #[test]
    fn outputs_inline_together_stay_within_the_total() {
        let output: Arc<str> = Arc::from("z".repeat(INLINE_BYTES));
        let upstream: Vec<_> = (0..40).map(|index| (format!("s{index}"), output.clone())).collect();
        let Carried { upstream_outputs: inline, payload_refs: refs, .. } = split("join", "{}".to_owned(), upstream);
        assert_eq!(inline.len(), INLINE_TOTAL_BYTES / INLINE_BYTES);
        assert_eq!(refs.len(), 40 - inline.len());
        assert_eq!(refs[0].step_id, format!("s{}", inline.len()), "the first outputs go inline, in order");
    }

    #[test]
    fn a_steps_own_inputs_overlay_the_executions() {
        let execution = execution_inputs("{\"topic\":\"a\",\"depth\":1}");
        assert_eq!(merge_inputs(&execution, "{\"depth\":2}"), "{\"depth\":2,\"topic\":\"a\"}");
        assert_eq!(merge_inputs(&execution, ""), "{\"depth\":1,\"topic\":\"a\"}");
        assert!(execution_inputs("[1]").is_empty());
    }
}
