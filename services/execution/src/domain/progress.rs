//! What a worker reports of an attempt while it runs: the attempt's use so
//! far, a running total that only grows (a figure below one seen before is
//! ignored), and, from a model-driven agent, each call of its model, kept
//! for audit as a one-line summary.

/// Most tool names a model call's summary lists; the others are counted.
const SUMMARY_TOOLS: usize = 16;
/// Most bytes of a name in a summary.
const SUMMARY_NAME_BYTES: usize = 128;

/// Progress on an attempt.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Progress {
    /// The attempt's tokens so far.
    pub tokens_used: u64,
    /// The attempt's cost so far, in US dollars (not a finite, non-negative
    /// number: none reported).
    pub cost: f64,
    /// One model call's record, when the report carries one.
    pub model_call: Option<ModelCall>,
}

/// One call of a model by an agent's loop.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelCall {
    pub iteration: u32,
    pub model: String,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub latency_ms: u64,
    /// The tools the model asked for, by name.
    pub tool_calls: Vec<String>,
    pub cost: f64,
}

/// An attempt's use so far, as its reports add up.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AttemptUse {
    pub tokens: u64,
    pub cost: f64,
}

impl AttemptUse {
    /// Takes a report's running totals, each only where it grew; whether
    /// either did.
    pub fn take(&mut self, progress: &Progress) -> bool {
        let mut grew = false;
        if progress.tokens_used > self.tokens {
            self.tokens = progress.tokens_used;
            grew = true;
        }
        if progress.cost.is_finite() && progress.cost > self.cost {
            self.cost = progress.cost;
            grew = true;
        }
        grew
    }
}

impl ModelCall {
    /// One line for people: `model call 2 (gpt-x): 700 in + 112 out
    /// tokens, 340 ms, $0.0031, tools: read_file, write_file`.
    pub fn summary(&self) -> String {
        let mut line = format!("model call {}", self.iteration);
        let model = one_line(&self.model);
        if !model.is_empty() {
            line.push_str(&format!(" ({model})"));
        }
        line.push_str(&format!(
            ": {} in + {} out tokens, {} ms",
            self.input_tokens, self.output_tokens, self.latency_ms
        ));
        if self.cost.is_finite() && self.cost > 0.0 {
            line.push_str(&format!(", {}", dollars(self.cost)));
        }
        if !self.tool_calls.is_empty() {
            let named: Vec<String> = self.tool_calls.iter().take(SUMMARY_TOOLS).map(|tool| one_line(tool)).collect();
            line.push_str(&format!(", tools: {}", named.join(", ")));
            if self.tool_calls.len() > SUMMARY_TOOLS {
                line.push_str(&format!(" and {} more", self.tool_calls.len() - SUMMARY_TOOLS));
            }
        }
        line
    }
}

/// A name as a summary shows it: on one line, trimmed, at most
/// [`SUMMARY_NAME_BYTES`] (never splitting a character).
fn one_line(name: &str) -> String {
    let flat: String =
        name.trim().chars().map(|character| if character.is_control() { ' ' } else { character }).collect();
    if flat.len() <= SUMMARY_NAME_BYTES {
        return flat;
    }
    let mut end = SUMMARY_NAME_BYTES - '…'.len_utf8();
    while !flat.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &flat[..end])
}

/// US dollars: two decimals, more for amounts under a cent (`$0.0042`).
fn dollars(amount: f64) -> String {
    if amount >= 0.01 { format!("${amount:.2}") } else { format!("${}", format!("{amount:.6}").trim_end_matches('0')) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call() -> ModelCall {
        ModelCall {
            iteration: 2,
            model: "gpt-x".to_owned(),
            input_tokens: 700,
            output_tokens: 112,
            latency_ms: 340,
            tool_calls: vec!["read_file".to_owned(), "write_file".to_owned()],
            cost: 0.0,
        }
    }

    #[test]
    fn a_model_call_is_summed_up_on_one_line() {
        assert_eq!(
            call().summary(),
            "model call 2 (gpt-x): 700 in + 112 out tokens, 340 ms, tools: read_file, write_file"
        );
        let plain = ModelCall { model: String::new(), tool_calls: Vec::new(), cost: 0.0042, ..call() };
        assert_eq!(plain.summary(), "model call 2: 700 in + 112 out tokens, 340 ms, $0.0042");
        let many = ModelCall {
            model: "evil\nmodel".to_owned(),
            tool_calls: (0..20).map(|index| format!("tool{index}")).collect(),
            cost: 1.5,
            ..call()
        };
        let summary = many.summary();
        assert!(
            summary.starts_with("model call 2 (evil model): 700 in + 112 out tokens, 340 ms, $1.50, tools: tool0,")
        );
        assert!(summary.ends_with("tool15 and 4 more"), "{summary}");
        let long = ModelCall { model: "é".repeat(200), ..call() };
        assert!(long.summary().len() < 300 && !long.summary().contains('\n'));
    }

    #[test]
    fn an_attempts_use_only_grows() {
        let mut used = AttemptUse::default();
        assert!(used.take(&Progress { tokens_used: 100, cost: 0.5, model_call: None }));
        assert!(!used.take(&Progress { tokens_used: 90, cost: f64::NAN, model_call: None }), "smaller: ignored");
        assert!(used.take(&Progress { tokens_used: 90, cost: 0.75, model_call: None }), "the cost grew");
        assert_eq!(used, AttemptUse { tokens: 100, cost: 0.75 });
        assert!(!used.take(&Progress { tokens_used: 0, cost: -1.0, model_call: None }));
    }
}
