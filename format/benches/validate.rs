//! Validator throughput: generated processes of 100, 1,000 and 10,000 steps,
//! each step with EMI roles, inputs and dependencies on earlier steps.
//!
//! Run with `cargo bench -p muster-format --bench validate`; prints one line
//! per size with the document size, the best time of a full validation and its
//! MB/s, and, for comparison, the best time of the YAML parser alone (events)
//! and of the parser building the validator's node tree.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use muster_format::{Context, validate_process};

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

/// The fastest of at least five calls of `work` over about a second, in
/// seconds: on a shared machine the minimum is the least disturbed figure.
fn time(mut work: impl FnMut()) -> (f64, u32) {
    work();
    let mut runs = 0u32;
    let mut fastest = f64::INFINITY;
    let started = Instant::now();
    while runs < 5 || started.elapsed() < Duration::from_secs(1) {
        let run_started = Instant::now();
        work();
        fastest = fastest.min(run_started.elapsed().as_secs_f64());
        runs += 1;
    }
    (fastest, runs)
}

fn main() {
    println!(
        "{:>7} {:>10} {:>12} {:>8} {:>14} {:>14} {:>6}",
        "steps", "bytes", "ms/validate", "MB/s", "ms/yaml-events", "ms/yaml-tree", "runs"
    );
    for steps in [100, 1_000, 10_000] {
        let source = generate(steps);
        let context = Context::default();
        let report = validate_process(&source, &context);
        assert!(report.process.is_some(), "generated process is valid: {:?}", report.diagnostics.first());
        // The parser alone (events only), and the parser with the node tree.
        let (events, _) = time(|| {
            let count = saphyr_parser::Parser::new_from_str(&source).count();
            std::hint::black_box(count);
        });
        let (tree, _) = time(|| {
            std::hint::black_box(muster_format::detect_yaml_kind(&source));
        });
        let (full, runs) = time(|| {
            std::hint::black_box(validate_process(&source, &context));
        });
        let megabytes_per_second = source.len() as f64 / full / 1_000_000.0;
        println!(
            "{steps:>7} {:>10} {:>12.2} {megabytes_per_second:>8.1} {:>14.2} {:>14.2} {runs:>6}",
            source.len(),
            full * 1000.0,
            events * 1000.0,
            tree * 1000.0
        );
    }
}
