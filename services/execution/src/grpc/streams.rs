//! The long-lived streams: a worker's connection and an execution's events.

use muster_proto::{common::v1 as common, execution::v1 as wire};
use tokio::sync::{broadcast, mpsc};
use tonic::{Status, Streaming};

use crate::{
    engine::{Control, Engine},
    workers::{Outcome, WorkerSender, Workers},
};

/// Reads a worker's messages until it leaves.
pub(super) async fn serve_worker(
    worker_id: u64,
    inbound: &mut Streaming<wire::ConnectWorkerRequest>,
    sender: &WorkerSender,
    engine: &Engine,
) {
    use wire::connect_worker_request::Message;
    let workers: &Workers = &engine.workers;
    loop {
        let message = match inbound.message().await {
            Ok(Some(message)) => {
                workers.touch(worker_id);
                message
            }
            Ok(None) => return,
            Err(status) => {
                tracing::info!(worker_id, error = %status.message(), "worker stream ended");
                return;
            }
        };
        match message.message {
            Some(Message::Result(result)) => {
                let id = result.assignment_id.clone();
                workers.complete(worker_id, &id, Outcome::Completed(result));
            }
            Some(Message::Failure(failure)) => {
                let id = failure.assignment_id.clone();
                workers.complete(worker_id, &id, Outcome::Failed(failure));
            }
            Some(Message::Delegate(request)) => {
                let assignment_id = request.assignment_id.clone();
                let outcome = delegate_onward(engine, request).await.unwrap_or_else(|reason| wire::DelegationOutcome {
                    assignment_id,
                    accepted: false,
                    decision: None,
                    reason,
                });
                let answer = wire::ConnectWorkerResponse {
                    message: Some(wire::connect_worker_response::Message::Delegation(outcome)),
                };
                let _ = sender.send(Ok(answer)).await;
            }
            Some(Message::Progress(progress)) => {
                tracing::debug!(worker_id, assignment = %progress.assignment_id, message = %progress.message, "step progress");
            }
            Some(Message::ToolResult(result)) => {
                let output = result.output.unwrap_or_default();
                workers.complete_tool_call(worker_id, &result.call_id, output);
            }
            Some(Message::Heartbeat(_)) => {}
            Some(Message::Hello(_)) | None => {
                let _ = sender.send(Err(Status::invalid_argument("a worker says hello once, first"))).await;
                return;
            }
        }
    }
}

/// Hands a worker's DelegateStep to the driver of the step's execution.
async fn delegate_onward(engine: &Engine, request: wire::DelegateStep) -> Result<wire::DelegationOutcome, String> {
    let execution_id = request.assignment_id.split('/').next().unwrap_or_default().to_owned();
    let (reply, answer) = tokio::sync::oneshot::channel();
    if !engine.control(&execution_id, Control::DelegateOnward { request, reply }) {
        return Err(format!("execution '{execution_id}' is not running"));
    }
    match tokio::time::timeout(std::time::Duration::from_secs(30), answer).await {
        Ok(Ok(outcome)) => Ok(outcome),
        _ => Err("the execution did not answer the delegation in time; the step stays with you".to_owned()),
    }
}

/// Sends an execution's stored events after a sequence, then live ones, until it finishes.
pub(super) async fn stream_events(
    engine: &Engine,
    execution_id: &str,
    after_sequence: u64,
    mut live: broadcast::Receiver<common::StepEvent>,
    sender: &mpsc::Sender<Result<wire::WatchExecutionResponse, Status>>,
) -> Result<(), Status> {
    let mut last = after_sequence;
    loop {
        for event in engine.store.events_after(execution_id, last).await? {
            last = event.sequence;
            let finished = event.r#type == common::EventType::ExecutionFinished as i32;
            if sender.send(Ok(wire::WatchExecutionResponse { event: Some(event) })).await.is_err() || finished {
                return Ok(());
            }
        }
        loop {
            match live.recv().await {
                Ok(event) if event.execution_id == execution_id && event.sequence > last => {
                    if event.sequence != last + 1 {
                        break; // A gap: read it from the store.
                    }
                    last = event.sequence;
                    let finished = event.r#type == common::EventType::ExecutionFinished as i32;
                    if sender.send(Ok(wire::WatchExecutionResponse { event: Some(event) })).await.is_err() || finished {
                        return Ok(());
                    }
                }
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(_)) => break,
                Err(broadcast::error::RecvError::Closed) => return Err(Status::unavailable("the service is stopping")),
            }
        }
    }
}
