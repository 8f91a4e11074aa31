//! What a worker says on its stream (a result or a failure, progress, a
//! hand-off, a tool call's answer, a heartbeat), acted on alike for a worker
//! connected here and for one another replica relays.

use std::{ops::ControlFlow, sync::Arc};

use muster_proto::execution::v1 as wire;

use crate::{
    domain::model::{HandOff, HandOffAnswer, Outcome},
    engine::{Control, Engine, workers::ToWorker},
    grpc::convert::{progress_from_wire, tool_output_from_wire},
};

/// How long a hand-off may wait for the execution's answer.
const HAND_OFF_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Acts on a message of a worker (or of a relay, for another replica's
/// workers); `Break` ends the connection.
pub(super) async fn handle_worker_message(
    worker_id: u64,
    message: wire::ConnectWorkerRequest,
    engine: &Arc<Engine>,
) -> ControlFlow<()> {
    use wire::connect_worker_request::Message;
    let workers = &engine.workers;
    match message.message {
        Some(Message::Result(result)) => {
            let (output_json, duration_ms) = match (
                muster_runtime::json::value_to_text(result.output.as_ref()),
                muster_runtime::time::from_duration(result.duration.as_ref()),
            ) {
                (Ok(output), Ok(duration)) => (output, duration),
                (Err(problem), _) | (_, Err(problem)) => {
                    let outcome = Outcome::Failed {
                        error_code: "INVALID_RESULT".to_owned(),
                        message: format!("the result's output or duration {problem}"),
                        retryable: false,
                    };
                    workers.complete(worker_id, &result.assignment_id, outcome);
                    return ControlFlow::Continue(());
                }
            };
            let outcome = Outcome::Completed {
                output_json,
                output_value: result.output.as_ref().map(|value| prost::Message::encode_to_vec(value).into()),
                tokens_used: result.tokens_used,
                cost: result.cost,
                duration_ms,
                iterations: result.iterations,
                post_to_inbox: result.post_to_inbox,
                skip_triggers: result.skip_triggers,
                remember: result
                    .remember
                    .into_iter()
                    .map(|note| {
                        let global = match wire::MemoryScope::try_from(note.scope) {
                            Ok(wire::MemoryScope::Global) => Some(true),
                            Ok(wire::MemoryScope::Role) => Some(false),
                            _ => None,
                        };
                        (global, note.text)
                    })
                    .collect(),
            };
            workers.complete(worker_id, &result.assignment_id, outcome);
        }
        Some(Message::Failure(failure)) => {
            let outcome = Outcome::Failed {
                error_code: failure.error_code,
                message: failure.message,
                retryable: failure.retryable,
            };
            workers.complete(worker_id, &failure.assignment_id, outcome);
        }
        Some(Message::Delegate(request)) => {
            let request = HandOff {
                assignment_id: request.assignment_id,
                to_agent_id: request.to_agent_id,
                required_expertise: request.required_expertise,
                required_role: request.required_role,
                reason: request.reason,
            };
            let assignment_id = request.assignment_id.clone();
            // Only the worker holding the assignment may hand its step onward.
            let answer = if workers.holds(worker_id, &assignment_id) {
                hand_off(engine, request).await
            } else {
                Err(format!("this worker does not hold assignment '{assignment_id}'"))
            };
            let answer = answer.unwrap_or_else(|reason| HandOffAnswer {
                assignment_id,
                accepted: false,
                decision: None,
                reason,
            });
            workers.send_to(worker_id, ToWorker::HandOffAnswer(answer));
        }
        Some(Message::Progress(mut progress)) => {
            tracing::debug!(worker_id, assignment = %progress.assignment_id, message = %progress.message, tokens_used = progress.tokens_used, "step progress");
            let assignment_id = std::mem::take(&mut progress.assignment_id);
            workers.progress(worker_id, &assignment_id, progress_from_wire(progress));
        }
        Some(Message::ToolResult(result)) => {
            let output = tool_output_from_wire(result.output.unwrap_or_default());
            workers.complete_tool_call(worker_id, &result.call_id, output);
        }
        Some(Message::Heartbeat(_)) => {}
        Some(Message::Hello(_)) | None => {
            tracing::info!(worker_id, "a worker said hello twice; disconnecting it");
            return ControlFlow::Break(());
        }
    }
    ControlFlow::Continue(())
}

/// Hands a worker's hand-off to the driver of the step's execution.
async fn hand_off(engine: &Engine, request: HandOff) -> std::result::Result<HandOffAnswer, String> {
    let execution_id = request.assignment_id.split('/').next().unwrap_or_default().to_owned();
    let (reply, answer) = tokio::sync::oneshot::channel();
    if !engine.control(&execution_id, Control::HandOff { request, reply }) {
        return Err(format!("execution '{execution_id}' is not running"));
    }
    match tokio::time::timeout(HAND_OFF_WAIT, answer).await {
        Ok(Ok(answer)) => Ok(answer),
        _ => Err("the execution did not answer the delegation in time; the step stays with you".to_owned()),
    }
}
