//! The agents' credentials on the move: the roster serves them from its
//! [`CredentialLog`] ([`CredentialStream`], and [`spawn_local_follower`] for
//! its own copy); the other services keep their [`AgentDirectory`] current
//! from that stream ([`spawn_follower`]), reconnecting with backoff from
//! where they stopped.

use std::time::Duration;

use muster_proto::roster::v1::{
    AgentCredential, CredentialState, WatchCredentialsRequest, WatchCredentialsResponse,
    credential_service_client::CredentialServiceClient,
};

use super::{
    AgentDirectory, TokenHash,
    client::AuthChannel,
    directory::{CredentialChange, Position},
};

/// A change from the wire; `None` for a malformed one (wrong hash length).
pub fn change_from_wire(credential: AgentCredential) -> Option<CredentialChange> {
    Some(CredentialChange {
        token: TokenHash::from_bytes(&credential.token_sha256)?,
        active: credential.state == CredentialState::Active as i32,
        agent_id: credential.agent_id,
        role: credential.role,
        revision: credential.revision,
    })
}

/// The wire form of a change.
pub fn change_to_wire(change: &CredentialChange) -> AgentCredential {
    AgentCredential {
        token_sha256: change.token.0.to_vec(),
        agent_id: change.agent_id.clone(),
        role: change.role.clone(),
        state: if change.active { CredentialState::Active } else { CredentialState::Revoked } as i32,
        revision: change.revision,
    }
}

/// Follows the roster's credentials into `directory` for as long as the task runs.
pub fn spawn_follower(directory: AgentDirectory, roster: AuthChannel) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut client = CredentialServiceClient::new(roster).max_decoding_message_size(64 * 1024 * 1024);
        let mut backoff = Duration::from_millis(100);
        loop {
            match follow(&directory, &mut client).await {
                Ok(()) => tracing::info!("the roster closed the credential stream; reconnecting"),
                Err(status) => {
                    tracing::warn!(code = ?status.code(), error = %status.message(), retry_in_ms = backoff.as_millis() as u64, "credential stream from the roster interrupted");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                    continue;
                }
            }
            backoff = Duration::from_millis(100);
        }
    })
}

async fn follow(
    directory: &AgentDirectory,
    client: &mut CredentialServiceClient<AuthChannel>,
) -> Result<(), tonic::Status> {
    let position = directory.position();
    let request = WatchCredentialsRequest {
        after_revision: position.revision,
        after_token_sha256: position.token.map(|token| token.0.to_vec()).unwrap_or_default(),
    };
    let mut stream = client.watch_credentials(request).await?.into_inner();
    while let Some(message) = stream.message().await? {
        let changes: Vec<CredentialChange> = message.changes.into_iter().filter_map(change_from_wire).collect();
        directory.apply(&changes);
        if message.caught_up {
            directory.caught_up();
        }
    }
    Ok(())
}

/// The roster's side: where credential changes are read from.
pub trait CredentialLog: Send + Sync + 'static {
    /// Changes after `position`, in (revision, token) order, at most `limit`.
    fn changes_after(
        &self,
        position: Position,
        limit: usize,
    ) -> impl std::future::Future<Output = Result<Vec<CredentialChange>, tonic::Status>> + Send;

    /// Notified after every change made by this process; changes made by
    /// others (another replica on the same database) are found by polling.
    fn changed(&self) -> &tokio::sync::Notify;
}

/// Changes sent per message.
const BATCH: usize = 1000;
/// How often a caught-up reader looks again, and a caught-up stream sends a heartbeat.
const POLL: Duration = Duration::from_secs(1);

/// The next batch of changes after `position`, which moves past them, and
/// whether the batch caught up with the log.
async fn next_batch<L: CredentialLog>(
    log: &L,
    position: &mut Position,
) -> Result<(Vec<CredentialChange>, bool), tonic::Status> {
    let changes = log.changes_after(*position, BATCH).await?;
    if let Some(last) = changes.last() {
        *position = Position { revision: last.revision, token: Some(last.token) };
    }
    let caught_up = changes.len() < BATCH;
    Ok((changes, caught_up))
}

/// Serves `WatchCredentials` from a [`CredentialLog`].
#[derive(Debug)]
pub struct CredentialStream<L> {
    log: std::sync::Arc<L>,
}

impl<L> CredentialStream<L> {
    /// The service over `log`.
    pub fn new(log: std::sync::Arc<L>) -> Self {
        Self { log }
    }
}

type WatchStream =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<WatchCredentialsResponse, tonic::Status>> + Send>>;

#[tonic::async_trait]
impl<L: CredentialLog> muster_proto::roster::v1::credential_service_server::CredentialService for CredentialStream<L> {
    type WatchCredentialsStream = WatchStream;

    async fn watch_credentials(
        &self,
        request: tonic::Request<WatchCredentialsRequest>,
    ) -> Result<tonic::Response<WatchStream>, tonic::Status> {
        let caller = super::Caller::of(&request)?;
        if caller.kind() != super::CallerKind::Service {
            return Err(super::permission_denied(
                &caller,
                "watch the agents' credentials",
                "SERVICES_ONLY",
                "only the cluster's services may",
                &[],
            ));
        }
        let request = request.into_inner();
        let after_token = if request.after_token_sha256.is_empty() {
            None
        } else {
            Some(TokenHash::from_bytes(&request.after_token_sha256).ok_or_else(|| {
                crate::status::invalid_field("after_token_sha256", "after_token_sha256 must be empty or 32 bytes")
            })?)
        };
        let mut position = Position { revision: request.after_revision, token: after_token };
        let log = self.log.clone();
        let (sender, receiver) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            loop {
                let changed = log.changed().notified();
                loop {
                    let (changes, caught_up) = match next_batch(log.as_ref(), &mut position).await {
                        Ok(batch) => batch,
                        Err(status) => {
                            let _ = sender.send(Err(status)).await;
                            return;
                        }
                    };
                    let batch =
                        WatchCredentialsResponse { changes: changes.iter().map(change_to_wire).collect(), caught_up };
                    if sender.send(Ok(batch)).await.is_err() {
                        return;
                    }
                    if caught_up {
                        break;
                    }
                }
                tokio::select! {
                    () = changed => {}
                    () = tokio::time::sleep(POLL) => {}
                    () = sender.closed() => return,
                }
            }
        });
        Ok(tonic::Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(receiver))))
    }
}

/// Applies what `log` holds beyond `directory`'s position, until caught up.
pub async fn catch_up<L: CredentialLog>(log: &L, directory: &AgentDirectory) -> Result<(), tonic::Status> {
    let mut position = directory.position();
    loop {
        let (changes, caught_up) = next_batch(log, &mut position).await?;
        directory.apply(&changes);
        if caught_up {
            directory.caught_up();
            return Ok(());
        }
    }
}

/// Keeps `directory` current from `log` in this process (the roster's own copy).
pub fn spawn_local_follower<L: CredentialLog>(
    log: std::sync::Arc<L>,
    directory: AgentDirectory,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let changed = log.changed().notified();
            if let Err(status) = catch_up(log.as_ref(), &directory).await {
                tracing::warn!(error = %status.message(), "reading the agents' credentials failed");
            }
            tokio::select! {
                () = changed => {}
                () = tokio::time::sleep(POLL) => {}
            }
        }
    })
}
