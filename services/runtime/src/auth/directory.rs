//! A service's copy of the agents' credentials: the SHA-256 of every token
//! the roster issued, the agent it belongs to, and whether it is still good.
//!
//! The roster feeds its own copy from its database; every other service
//! feeds one from the roster's `WatchCredentials` stream ([`super::watch`]).
//! Checking a token is a hash and a map lookup. The copy trusts itself only
//! while its source keeps in touch: past the staleness bound without word,
//! agents are refused with UNAVAILABLE, so a revocation never goes unseen
//! for longer than that bound.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, RwLock,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use tokio::sync::broadcast;

use super::{Caller, TokenHash, unauthenticated};

/// One credential as the roster records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CredentialChange {
    /// The token's SHA-256.
    pub token: TokenHash,
    /// Its agent.
    pub agent_id: String,
    /// The agent's role at the change.
    pub role: String,
    /// False once rotated, revoked or its agent removed.
    pub active: bool,
    /// Position in the roster's credential history.
    pub revision: u64,
}

/// A token that stopped being good.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revocation {
    /// Its agent.
    pub agent_id: Arc<str>,
    /// The token's SHA-256.
    pub token: TokenHash,
}

/// Where a copy stands in the roster's credential history: the last change applied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Position {
    /// Its revision (0 before any).
    pub revision: u64,
    /// Its token, within the revision.
    pub token: Option<TokenHash>,
}

#[derive(Debug, Clone)]
struct Entry {
    agent_id: Arc<str>,
    role: Arc<str>,
    active: bool,
    revision: u64,
}

/// The copy; clones share it.
#[derive(Debug, Clone)]
pub struct AgentDirectory {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    tokens: RwLock<HashMap<TokenHash, Entry>>,
    position: Mutex<Position>,
    /// When the source last said the copy was complete, in milliseconds
    /// since `epoch` plus one (0: never).
    contact: AtomicU64,
    epoch: Instant,
    max_staleness: Duration,
    revocations: broadcast::Sender<Revocation>,
    /// Woken after every batch applied.
    applied: tokio::sync::Notify,
}

/// How long a check waits for an unknown agent token to arrive from the
/// roster: a token issued a moment ago may not have reached this copy yet.
const NEW_TOKEN_GRACE: Duration = Duration::from_secs(1);

/// What a copy knows of a token.
enum Known {
    Answer(Result<Caller, tonic::Status>),
    Unknown,
}

impl AgentDirectory {
    /// An empty copy that trusts itself for `max_staleness` after each word from its source.
    pub fn new(max_staleness: Duration) -> Self {
        let (revocations, _) = broadcast::channel(1024);
        Self {
            inner: Arc::new(Inner {
                tokens: RwLock::new(HashMap::new()),
                position: Mutex::new(Position::default()),
                contact: AtomicU64::new(0),
                epoch: Instant::now(),
                max_staleness,
                revocations,
                applied: tokio::sync::Notify::new(),
            }),
        }
    }

    /// Applies changes; tokens that stop being good are announced to
    /// [`Self::revocations`] subscribers. A change older than what the copy
    /// holds for its token is ignored, so readers racing each other (a
    /// follower and a refresh after a local change) never undo a newer change.
    pub fn apply(&self, changes: &[CredentialChange]) {
        let Some(last) = changes.iter().max_by_key(|change| (change.revision, change.token)) else { return };
        let mut revoked = Vec::new();
        {
            let mut tokens = self.inner.tokens.write().unwrap_or_else(std::sync::PoisonError::into_inner);
            for change in changes {
                let newer = tokens.get(&change.token).is_none_or(|entry| change.revision >= entry.revision);
                if !newer {
                    continue;
                }
                let entry = Entry {
                    agent_id: change.agent_id.as_str().into(),
                    role: change.role.as_str().into(),
                    active: change.active,
                    revision: change.revision,
                };
                let previous = tokens.insert(change.token, entry);
                if !change.active && previous.is_some_and(|previous| previous.active) {
                    revoked.push(Revocation { agent_id: change.agent_id.as_str().into(), token: change.token });
                }
            }
        }
        {
            let mut position = self.inner.position.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let reached = Position { revision: last.revision, token: Some(last.token) };
            if (reached.revision, reached.token) > (position.revision, position.token) {
                *position = reached;
            }
        }
        self.inner.applied.notify_waiters();
        for revocation in revoked {
            tracing::info!(agent_id = %revocation.agent_id, "agent token revoked");
            let _ = self.inner.revocations.send(revocation);
        }
    }

    /// Records that the source confirmed the copy complete, now.
    pub fn caught_up(&self) {
        let now = self.inner.epoch.elapsed().as_millis() as u64 + 1;
        self.inner.contact.store(now, Ordering::Release);
    }

    /// The last change applied.
    pub fn position(&self) -> Position {
        *self.inner.position.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Token revocations from now on.
    pub fn revocations(&self) -> broadcast::Receiver<Revocation> {
        self.inner.revocations.subscribe()
    }

    /// Resolves once `token` is no longer good (at once if it is not now).
    pub async fn until_revoked(&self, token: TokenHash) {
        let mut revocations = self.revocations();
        loop {
            if !self.is_active(&token) {
                return;
            }
            match revocations.recv().await {
                Ok(revocation) if revocation.token == token => return,
                // Another token, or missed announcements: look again.
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => std::future::pending().await,
            }
        }
    }

    /// Whether the token is known and good.
    pub fn is_active(&self, token: &TokenHash) -> bool {
        self.inner
            .tokens
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(token)
            .is_some_and(|entry| entry.active)
    }

    /// The agent a token authenticates.
    ///
    /// UNAUTHENTICATED for an unknown or revoked token; UNAVAILABLE while
    /// the copy cannot be trusted (never complete, or stale).
    pub fn authenticate(&self, token: TokenHash) -> Result<Caller, tonic::Status> {
        match self.known(token) {
            Known::Answer(answer) => answer,
            Known::Unknown => Err(unknown_token()),
        }
    }

    /// As [`Self::authenticate`], waiting a moment for a token this copy does
    /// not know yet: one the roster just issued may still be on its way.
    pub async fn authenticate_new(&self, token: TokenHash) -> Result<Caller, tonic::Status> {
        let deadline = tokio::time::Instant::now() + NEW_TOKEN_GRACE;
        loop {
            let applied = self.inner.applied.notified();
            if let Known::Answer(answer) = self.known(token) {
                return answer;
            }
            if tokio::time::timeout_at(deadline, applied).await.is_err() {
                return Err(unknown_token());
            }
        }
    }

    /// Whether a token is one this copy has never heard of (it may be new).
    pub fn is_unknown(&self, token: &TokenHash) -> bool {
        matches!(self.known(*token), Known::Unknown)
    }

    fn known(&self, token: TokenHash) -> Known {
        let contact = self.inner.contact.load(Ordering::Acquire);
        if contact == 0 {
            return Known::Answer(Err(crate::status::retry_later(
                "agent credentials have not arrived from the roster yet; try again shortly",
                "CREDENTIALS_NOT_LOADED",
                &[],
            )));
        }
        let silent = self.inner.epoch.elapsed().saturating_sub(Duration::from_millis(contact - 1));
        if silent > self.inner.max_staleness {
            return Known::Answer(Err(crate::status::retry_later(
                format!(
                    "agent credentials cannot be checked: no word from the roster for {} s; try again shortly",
                    silent.as_secs()
                ),
                "CREDENTIALS_STALE",
                &[("dependency", "roster")],
            )));
        }
        let tokens = self.inner.tokens.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        match tokens.get(&token) {
            Some(entry) if entry.active => {
                Known::Answer(Ok(Caller::Agent { id: entry.agent_id.clone(), role: entry.role.clone(), token }))
            }
            Some(entry) => Known::Answer(Err(unauthenticated(
                "CREDENTIAL_REVOKED",
                format!(
                    "the agent token of '{}' was revoked (rotated, revoked, or its agent removed); ask an operator for a new one",
                    entry.agent_id
                ),
            ))),
            None => Known::Unknown,
        }
    }
}

fn unknown_token() -> tonic::Status {
    unauthenticated("CREDENTIAL_UNKNOWN", "unknown agent token: the roster never issued it")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(token: &str, agent: &str, active: bool, revision: u64) -> CredentialChange {
        CredentialChange {
            token: TokenHash::of(token),
            agent_id: agent.to_owned(),
            role: "writer".to_owned(),
            active,
            revision,
        }
    }

    #[test]
    fn tokens_authenticate_until_revoked_and_revocations_are_announced() {
        let directory = AgentDirectory::new(Duration::from_secs(5));
        directory.apply(&[change("a", "alice", true, 1)]);
        assert_eq!(directory.authenticate(TokenHash::of("a")).unwrap_err().code(), tonic::Code::Unavailable);
        directory.caught_up();
        let caller = directory.authenticate(TokenHash::of("a")).unwrap();
        assert!(caller.is_agent("alice"));
        assert_eq!(caller.role(), "writer");
        let mut revocations = directory.revocations();
        directory.apply(&[change("a", "alice", false, 2)]);
        let refused = directory.authenticate(TokenHash::of("a")).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unauthenticated);
        assert!(refused.message().contains("revoked"), "{}", refused.message());
        assert_eq!(revocations.try_recv().unwrap().agent_id.as_ref(), "alice");
        let unknown = directory.authenticate(TokenHash::of("b")).unwrap_err();
        assert!(unknown.message().contains("unknown"));
        assert!(directory.is_unknown(&TokenHash::of("b")));
        assert_eq!(directory.position().revision, 2);
        // A late reader applying an older state changes nothing.
        directory.apply(&[change("a", "alice", true, 1)]);
        assert!(!directory.is_active(&TokenHash::of("a")));
        assert_eq!(directory.position().revision, 2);
    }

    #[tokio::test]
    async fn a_new_token_is_waited_for_a_moment() {
        let directory = AgentDirectory::new(Duration::from_secs(5));
        directory.caught_up();
        let waiting = {
            let directory = directory.clone();
            tokio::spawn(async move { directory.authenticate_new(TokenHash::of("fresh")).await })
        };
        tokio::task::yield_now().await;
        directory.apply(&[change("fresh", "carol", true, 1)]);
        assert!(waiting.await.unwrap().unwrap().is_agent("carol"));
        let started = tokio::time::Instant::now();
        assert!(directory.authenticate_new(TokenHash::of("never")).await.is_err());
        assert!(started.elapsed() >= NEW_TOKEN_GRACE);
    }

    #[expect(clippy::disallowed_methods, reason = "a synchronous test that needs real time to pass, on no runtime")]
    #[test]
    fn a_stale_copy_refuses_agents() {
        let directory = AgentDirectory::new(Duration::from_millis(0));
        directory.apply(&[change("a", "alice", true, 1)]);
        directory.caught_up();
        std::thread::sleep(Duration::from_millis(5));
        let refused = directory.authenticate(TokenHash::of("a")).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unavailable);
    }
}
