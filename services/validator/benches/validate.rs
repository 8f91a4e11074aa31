//! Validator throughput: generated processes of 100, 1,000 and 10,000 steps,
//! each step with EMI roles, inputs and dependencies on earlier steps.
//!
//! Run with `cargo bench -p muster-validator --bench validate`; prints one line
//! per size with the document size, milliseconds per validation and MB/s.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use muster_validator::{Context, validate_process};

fn generate(steps: usize) -> String {
    let mut source = String::with_capacity(steps * 400);
    source
        .push_str("name: generated\ndescription: A generated process for the benchmark\nlead: manager-agent\nsteps:\n");
    for index in 0..steps {
        let _ = write!(
            source,
            "  - id: step-{index}\n    name: Step number {index}\n    type: agent_task\n    agent: agent-{agent}\n    \
             message: Do part {index} of the work and report what you found\n    inputs: {{topic: t{index}, depth: 2, \
             tags: [a, b]}}\n    timeout_seconds: 300\n    retries: 2\n    roles:\n      executor: agent-{agent}\n      \
             monitors: [monitor-{monitor}, manager-agent]\n      informed: [learner-{monitor}]\n",
            agent = index % 50,
            monitor = index % 7,
        );
        if index > 0 {
            let _ = write!(source, "    depends_on: [step-{}", index - 1);
            if index > 10 {
                let _ = write!(source, ", step-{}", index - 10);
            }
            source.push_str("]\n");
        }
    }
    source
}

fn main() {
    println!("{:>7} {:>10} {:>12} {:>10} {:>8}", "steps", "bytes", "ms/validate", "MB/s", "runs");
    for steps in [100, 1_000, 10_000] {
        let source = generate(steps);
        let context = Context::default();
        // Warm up, and check the generated document is valid.
        let report = validate_process(&source, &context);
        assert!(report.process.is_some(), "generated process is valid: {:?}", report.diagnostics.first());
        let mut runs = 0u32;
        let started = Instant::now();
        while runs < 5 || started.elapsed() < Duration::from_secs(2) {
            let report = validate_process(&source, &context);
            std::hint::black_box(&report);
            runs += 1;
        }
        let per_run = started.elapsed().as_secs_f64() / f64::from(runs);
        let megabytes_per_second = source.len() as f64 / per_run / 1_000_000.0;
        println!("{steps:>7} {:>10} {:>12.2} {megabytes_per_second:>10.1} {runs:>8}", source.len(), per_run * 1000.0);
    }
}
