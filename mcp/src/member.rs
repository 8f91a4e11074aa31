//! One agent served over MCP: its clients of the cluster (each call carries
//! its token), its worker session (opened by its first `next_assignment`,
//! held as any worker's is: heartbeats, lease), and the steps it holds.
//! Dropping a member closes its worker session: the execution service takes
//! back the steps it held and assigns them again.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use muster_agent::cluster::StepNotes;
use muster_client::auth::AuthChannel;
use muster_proto::{
    execution::v1::{Assignment, execution_service_client::ExecutionServiceClient},
    notifier::v1::notifier_service_client::NotifierServiceClient,
    roster::v1::{AuthenticateRequest, roster_service_client::RosterServiceClient},
};
use muster_worker::{AgentCredential, Behaviour, Endpoint, Notice, Step, StepOutcome, WithoutTools};
use tokio::sync::{mpsc, oneshot};

use crate::Settings;

/// Steps offered to a member and not yet taken, most.
const OFFERED: usize = 16;
/// Steps one member may hold at once, most.
const MAX_HELD: usize = 64;

/// A step offered by the execution service, waiting for `next_assignment`.
struct Offer {
    assignment: Assignment,
    step: Step,
    reply: oneshot::Sender<StepOutcome>,
}

/// A step the member took and has not ended.
pub(crate) struct Held {
    /// The assignment as the worker received it.
    pub(crate) assignment: Assignment,
    /// The step, for progress, delegation and calls as its agent.
    pub(crate) step: Step,
    /// Where its end is reported.
    reply: oneshot::Sender<StepOutcome>,
    /// What the cluster's tools left on it (notes, skip_triggers).
    pub(crate) notes: StepNotes,
}

impl Held {
    /// Ends the step with `outcome`; `false` when the service had already
    /// withdrawn it (cancelled, timed out, reassigned).
    pub(crate) fn end(self, outcome: StepOutcome) -> bool {
        self.reply.send(outcome).is_ok()
    }
}

/// Hands each assignment to the member's client and waits for its end. A
/// step whose client went away is never reported: it waits until the worker
/// session closes with the member, and the service takes it back then.
struct Hand(mpsc::Sender<Offer>);

impl Behaviour for Hand {
    async fn run(&self, mut assignment: Assignment, step: Step) -> StepOutcome {
        // The member's client reads the assignment whole: its shared memory
        // goes back into it, decoded.
        match step.shared_memory().decode() {
            Ok(memory) => assignment.shared_memory = Some(memory),
            Err(error) => {
                return StepOutcome::Failed {
                    error_code: "SHARED_MEMORY_UNREADABLE".to_owned(),
                    message: format!("the assignment's shared memory could not be read: {error}"),
                    retryable: true,
                };
            }
        }
        let (reply, answer) = oneshot::channel();
        if self.0.send(Offer { assignment, step, reply }).await.is_ok()
            && let Ok(outcome) = answer.await
        {
            return outcome;
        }
        std::future::pending().await
    }
}

/// The worker session of a member.
struct Work {
    offered: tokio::sync::Mutex<mpsc::Receiver<Offer>>,
    serving: tokio::task::JoinHandle<()>,
}

impl Drop for Work {
    fn drop(&mut self) {
        self.serving.abort();
    }
}

/// One agent, as MCP clients act for it.
pub(crate) struct Member {
    /// The agent's id, as the roster knows the token.
    pub(crate) agent_id: String,
    token: String,
    settings: Arc<Settings>,
    /// The execution service, as the agent.
    pub(crate) execution: ExecutionServiceClient<AuthChannel>,
    /// The roster, as the agent.
    pub(crate) roster: RosterServiceClient<AuthChannel>,
    /// The notifier, as the agent.
    pub(crate) notifier: NotifierServiceClient<AuthChannel>,
    work: tokio::sync::OnceCell<Work>,
    held: Mutex<HashMap<String, Held>>,
    last_used: Mutex<Instant>,
    /// Subscriptions open now.
    pub(crate) subscriptions: std::sync::atomic::AtomicUsize,
}

impl Member {
    /// The agent whose token `token` is, as the roster says.
    pub(crate) async fn sign_in(settings: Arc<Settings>, token: &str) -> anyhow::Result<Self> {
        let channel = |url: &str| Endpoint::new(url, token).channel();
        let mut roster = RosterServiceClient::new(channel(&settings.roster_url)?);
        let agent = roster
            .authenticate(AuthenticateRequest { token: token.to_owned() })
            .await
            .map_err(|status| anyhow::anyhow!("the roster refused the token: {}", status.message()))?
            .into_inner()
            .agent
            .context("the roster named no agent for the token")?;
        Ok(Self {
            agent_id: agent.id,
            token: token.to_owned(),
            execution: ExecutionServiceClient::new(channel(&settings.execution_url)?),
            notifier: NotifierServiceClient::new(channel(&settings.notifier_url)?),
            roster,
            settings,
            work: tokio::sync::OnceCell::new(),
            held: Mutex::new(HashMap::new()),
            last_used: Mutex::new(Instant::now()),
            subscriptions: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    /// Marks the member as used now.
    pub(crate) fn touch(&self) {
        *self.last_used.lock().unwrap_or_else(PoisonError::into_inner) = Instant::now();
    }

    /// How long since the member was last used (a call under way keeps it: [`Members::expire`]).
    pub(crate) fn idle_for(&self) -> Duration {
        self.last_used.lock().unwrap_or_else(PoisonError::into_inner).elapsed()
    }

    /// The next step offered to the agent, waiting up to `wait`; `None`
    /// when none came. Opens the agent's worker session on first use.
    pub(crate) async fn next_assignment(&self, wait: Duration) -> anyhow::Result<Option<Assignment>> {
        if self.held.lock().unwrap_or_else(PoisonError::into_inner).len() >= MAX_HELD {
            anyhow::bail!("the agent already holds {MAX_HELD} steps: end one first");
        }
        let work = self.work.get_or_try_init(|| self.open_work()).await?;
        let mut offered = work.offered.lock().await;
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let offer = match tokio::time::timeout_at(deadline, offered.recv()).await {
                Ok(Some(offer)) => offer,
                Ok(None) => anyhow::bail!("the agent's worker session ended"),
                Err(_) => return Ok(None),
            };
            // A step withdrawn before it was taken is not offered.
            if offer.reply.is_closed() {
                continue;
            }
            let assignment = offer.assignment.clone();
            let held = Held {
                assignment: offer.assignment,
                step: offer.step,
                reply: offer.reply,
                notes: StepNotes::default(),
            };
            self.held.lock().unwrap_or_else(PoisonError::into_inner).insert(assignment.assignment_id.clone(), held);
            return Ok(Some(assignment));
        }
    }

    async fn open_work(&self) -> anyhow::Result<Work> {
        let (offers, offered) = mpsc::channel(OFFERED);
        let (welcomed, welcome) = oneshot::channel();
        let mut welcomed = Some(welcomed);
        let execution = Endpoint::new(self.settings.execution_url.clone(), self.token.clone());
        let agents = vec![AgentCredential { agent_id: self.agent_id.clone(), token: self.token.clone() }];
        let name = format!("muster-mcp-{}", self.agent_id);
        let notify = move |notice: Notice| {
            if let Notice::Connected { .. } = notice
                && let Some(welcomed) = welcomed.take()
            {
                let _ = welcomed.send(());
            }
        };
        let behaviour = Arc::new(WithoutTools(Hand(offers)));
        let serving = tokio::spawn(async move {
            let served =
                muster_worker::serve_reporting(execution, name, agents, behaviour, notify, std::future::pending());
            if let Err(error) = served.await {
                tracing::warn!(error = %format!("{error:#}"), "the agent's worker session ended");
            }
        });
        let work = Work { offered: tokio::sync::Mutex::new(offered), serving };
        // The service knows the worker before the first wait counts.
        match tokio::time::timeout(Duration::from_secs(10), welcome).await {
            Ok(Ok(())) => Ok(work),
            _ => anyhow::bail!("the execution service did not welcome the agent's worker session"),
        }
    }

    /// Takes the held step `assignment_id` out, to end it.
    pub(crate) fn take(&self, assignment_id: &str) -> Result<Held, String> {
        let taken = self.held.lock().unwrap_or_else(PoisonError::into_inner).remove(assignment_id);
        taken.ok_or_else(|| self.not_held(assignment_id))
    }

    /// Puts a step taken out back (its end was refused before it was sent).
    pub(crate) fn put_back(&self, held: Held) {
        self.held.lock().unwrap_or_else(PoisonError::into_inner).insert(held.assignment.assignment_id.clone(), held);
    }

    fn not_held(&self, assignment_id: &str) -> String {
        let held: Vec<String> = self.held.lock().unwrap_or_else(PoisonError::into_inner).keys().cloned().collect();
        if held.is_empty() {
            format!("you hold no step '{assignment_id}': you hold none (take one with next_assignment)")
        } else {
            format!("you hold no step '{assignment_id}'; you hold {}", held.join(", "))
        }
    }
}

/// The members of a streamable HTTP server, one per token presented, each
/// dropped after the idle timeout (its held steps go back to the service).
#[derive(Default)]
pub(crate) struct Members(tokio::sync::Mutex<HashMap<[u8; 32], Arc<Member>>>);

/// Most agents one HTTP server serves at once.
const MAX_MEMBERS: usize = 1000;

impl Members {
    /// The member whose token `token` is, signing it in on first use.
    pub(crate) async fn get(&self, settings: &Arc<Settings>, token: &str) -> anyhow::Result<Arc<Member>> {
        use sha2::Digest as _;
        let key: [u8; 32] = sha2::Sha256::digest(token.as_bytes()).into();
        let mut members = self.0.lock().await;
        if let Some(member) = members.get(&key) {
            member.touch();
            return Ok(member.clone());
        }
        if members.len() >= MAX_MEMBERS {
            anyhow::bail!("this server already serves {MAX_MEMBERS} agents");
        }
        let member = Arc::new(Member::sign_in(settings.clone(), token).await?);
        members.insert(key, member.clone());
        Ok(member)
    }

    /// Drops the members idle longer than `timeout` whose calls have all
    /// ended; their worker sessions close.
    pub(crate) async fn expire(&self, timeout: Duration) {
        self.0.lock().await.retain(|_, member| Arc::strong_count(member) > 1 || member.idle_for() < timeout);
    }
}
