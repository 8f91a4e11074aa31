//! Who is calling, and whether it may: the one authentication layer of every
//! muster service.
//!
//! Three kinds of caller present a bearer token in the `authorization`
//! metadata (`Bearer <token>`, see [`token`]):
//! - **operators**, people and automation that run the cluster, listed by
//!   name and the SHA-256 of their token in an operators file or variable
//!   ([`operators`]);
//! - **agents**, with the token the roster issued them, checked against an
//!   in-memory copy of the roster's credentials ([`directory`]) that the
//!   roster's change stream keeps current ([`watch`]): no roster round trip
//!   per call, and a revocation reaches every service within a second or two
//!   (five at most: a copy that has not heard from the roster for longer
//!   refuses agents with UNAVAILABLE rather than trust stale credentials);
//! - **services**, the cluster's own, with a credential derived from the
//!   cluster's service secret or, with mutual TLS, their certificate.
//!
//! The [`layer`] authenticates every call but health, reflection and
//! `/metrics`, refuses what a method's [`Access`] rule does not allow, and
//! puts the [`Caller`] into the request's extensions; handlers read it with
//! [`Caller::of`] and make the finer checks (the agent itself, the step's
//! executor, the lead) with [`permission_denied`] for refusals.

/// What outgoing calls carry, a credential and the trace context: the
/// client side, which lives in [`muster_client::auth`].
pub mod client {
    pub use muster_client::auth::{AuthChannel, Credentials, with_credentials};
}
pub mod directory;
mod errors;
pub mod layer;
pub mod operators;
pub mod token;
pub mod watch;

use std::{fmt, path::PathBuf, sync::Arc};

pub use directory::AgentDirectory;
pub use errors::{DOMAIN, only_for_itself, permission_denied, unauthenticated, unauthenticated_with};
pub use layer::{Access, AuthLayer, Rule, rule};
pub use muster_client::auth::error_info;
pub use token::{ServiceSecret, TokenHash};

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// A person or automation running the cluster.
    Operator {
        /// The operator's name, from the operators file.
        name: Arc<str>,
    },
    /// An agent of the roster.
    Agent {
        /// The agent's id.
        id: Arc<str>,
        /// Its roster role when its credential last changed (may be empty).
        role: Arc<str>,
        /// The token it presented, to notice when that token is revoked.
        token: TokenHash,
    },
    /// One of the cluster's services.
    Service {
        /// `execution`, `roster`, `validator` or `notifier`.
        name: Arc<str>,
    },
}

/// The kind of a caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallerKind {
    /// An operator.
    Operator,
    /// An agent.
    Agent,
    /// A service.
    Service,
}

impl CallerKind {
    /// `operator`, `agent` or `service`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Operator => "operator",
            Self::Agent => "agent",
            Self::Service => "service",
        }
    }
}

impl Caller {
    /// The caller the authentication layer put into a request.
    pub fn of<T>(request: &tonic::Request<T>) -> Result<Self, tonic::Status> {
        request.extensions().get::<Self>().cloned().ok_or_else(|| {
            tracing::error!("a request reached a handler without an authenticated caller");
            tonic::Status::unauthenticated("the call was not authenticated")
        })
    }

    /// Its kind.
    pub fn kind(&self) -> CallerKind {
        match self {
            Self::Operator { .. } => CallerKind::Operator,
            Self::Agent { .. } => CallerKind::Agent,
            Self::Service { .. } => CallerKind::Service,
        }
    }

    /// The agent's id, for an agent.
    pub fn agent_id(&self) -> Option<&str> {
        match self {
            Self::Agent { id, .. } => Some(id),
            _ => None,
        }
    }

    /// Whether the caller is an operator.
    pub fn is_operator(&self) -> bool {
        matches!(self, Self::Operator { .. })
    }

    /// Whether the caller is the service `name`.
    pub fn is_service(&self, name: &str) -> bool {
        matches!(self, Self::Service { name: own } if &**own == name)
    }

    /// Whether the caller is the agent `agent_id`.
    pub fn is_agent(&self, agent_id: &str) -> bool {
        self.agent_id() == Some(agent_id)
    }

    /// An agent's roster role (possibly empty); empty for other callers.
    pub fn roster_role(&self) -> &str {
        match self {
            Self::Agent { role, .. } => role,
            _ => "",
        }
    }

    /// Its role, as refusals name it: an agent's roster role (or `agent`
    /// when it has none), else `operator` or `service`.
    pub fn role(&self) -> &str {
        match self {
            Self::Agent { role, .. } if !role.is_empty() => role,
            other => other.kind().as_str(),
        }
    }

    /// How records name it: an agent by its id, others as `operator:<name>`
    /// or `service:<name>`.
    pub fn audit_name(&self) -> String {
        match self {
            Self::Operator { name } => format!("operator:{name}"),
            Self::Agent { id, .. } => id.to_string(),
            Self::Service { name } => format!("service:{name}"),
        }
    }
}

impl fmt::Display for Caller {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Operator { name } => write!(formatter, "operator '{name}'"),
            Self::Agent { id, role, .. } if role.is_empty() => write!(formatter, "agent '{id}' (no role)"),
            Self::Agent { id, role, .. } => write!(formatter, "agent '{id}' (role {role})"),
            Self::Service { name } => write!(formatter, "service '{name}'"),
        }
    }
}

/// A secret given on the command line or in the environment; never printed.
#[derive(Clone)]
pub struct Secret(pub String);

impl fmt::Debug for Secret {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("***")
    }
}

impl std::str::FromStr for Secret {
    type Err = std::convert::Infallible;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Ok(Self(text.to_owned()))
    }
}

/// Where credentials come from; part of every service's settings.
#[derive(Debug, Clone, clap::Args)]
pub struct AuthArgs {
    /// File of operator credentials, one `NAME SHA256` per line (`#` starts a
    /// comment); reread when it changes. `muster operator add` writes it.
    #[arg(long, env = "MUSTER_OPERATORS_FILE")]
    pub operators_file: Option<PathBuf>,
    /// Operator credentials inline: `NAME:SHA256[,NAME:SHA256...]`.
    #[arg(long, env = "MUSTER_OPERATORS", hide_env_values = true)]
    pub operators: Option<Secret>,
    /// File holding the cluster's service secret (at least 32 bytes), from
    /// which the services' credentials derive.
    #[arg(long, env = "MUSTER_SERVICE_SECRET_FILE")]
    pub service_secret_file: Option<PathBuf>,
    /// The cluster's service secret itself (prefer the file).
    #[arg(long, env = "MUSTER_SERVICE_SECRET", hide_env_values = true)]
    pub service_secret: Option<Secret>,
    /// The roster, where agent credentials come from (the roster itself
    /// reads its own database).
    #[arg(long, env = "MUSTER_ROSTER_URL", default_value = "http://127.0.0.1:50052")]
    pub roster_url: String,
    /// Longest time, in milliseconds, a service trusts its copy of the agent
    /// credentials without word from the roster; past it agents are refused
    /// with UNAVAILABLE until the roster answers again.
    #[arg(long, env = "MUSTER_CREDENTIALS_MAX_STALENESS_MS", default_value_t = 5000)]
    pub credentials_max_staleness_ms: u64,
}

impl Default for AuthArgs {
    fn default() -> Self {
        Self {
            operators_file: None,
            operators: None,
            service_secret_file: None,
            service_secret: None,
            roster_url: "http://127.0.0.1:50052".to_owned(),
            credentials_max_staleness_ms: 5000,
        }
    }
}

impl AuthArgs {
    /// The service secret, from the variable or the file; `None` when neither is set.
    pub fn load_service_secret(&self) -> crate::Result<Option<ServiceSecret>> {
        let text = match (&self.service_secret, &self.service_secret_file) {
            (Some(secret), _) => secret.0.clone(),
            (None, Some(path)) => std::fs::read_to_string(path)
                .map_err(|source| crate::Error::Io { context: format!("reading {}", path.display()), source })?,
            (None, None) => return Ok(None),
        };
        ServiceSecret::new(&text).map(Some).map_err(crate::Error::Config)
    }
}

/// Why a caller is not known at once.
#[derive(Debug)]
pub enum Pending {
    /// Refused: the status says why.
    Refused(tonic::Status),
    /// An agent token this service has not heard of: it may have been issued
    /// a moment ago (see [`AgentDirectory::authenticate_new`]).
    NewAgentToken(TokenHash),
}

impl From<tonic::Status> for Pending {
    fn from(status: tonic::Status) -> Self {
        Self::Refused(status)
    }
}

/// Verifies callers: operators, agents and services.
#[derive(Debug, Clone)]
pub struct Authenticator {
    operators: operators::Operators,
    service_secret: Option<ServiceSecret>,
    agents: AgentDirectory,
    trust_service_certificates: bool,
}

impl Authenticator {
    /// An authenticator for the settings; `agents` is the service's copy of
    /// the agent credentials. With `trust_service_certificates` (mutual TLS
    /// on), a client certificate naming `muster-<service>` identifies that
    /// service when the call carries no token.
    pub fn new(args: &AuthArgs, agents: AgentDirectory, trust_service_certificates: bool) -> crate::Result<Self> {
        Ok(Self {
            operators: operators::Operators::load(args)?,
            service_secret: args.load_service_secret()?,
            agents,
            trust_service_certificates,
        })
    }

    /// The copy of the agent credentials.
    pub fn agents(&self) -> &AgentDirectory {
        &self.agents
    }

    /// The credential service `name` presents, when a service secret is set.
    pub fn service_credential(&self, name: &str) -> Option<String> {
        self.service_secret.as_ref().map(|secret| secret.credential(name))
    }

    /// The caller behind a request's metadata and connection, when it can
    /// be told at once; an agent token this service has not heard of yet is
    /// [`Pending::NewAgentToken`], for [`AgentDirectory::authenticate_new`].
    pub fn authenticate(&self, headers: &http::HeaderMap, extensions: &http::Extensions) -> Result<Caller, Pending> {
        let Some(value) = headers.get(http::header::AUTHORIZATION) else {
            if self.trust_service_certificates
                && let Some(name) = crate::tls::peer_service(extensions)
            {
                return Ok(Caller::Service { name: name.into() });
            }
            return Err(Pending::Refused(unauthenticated(
                "CREDENTIAL_MISSING",
                "no credential: send `authorization: Bearer <token>` (an operator's token, an agent's roster token, or a service credential)",
            )));
        };
        let token = value
            .to_str()
            .ok()
            .and_then(|text| text.strip_prefix("Bearer ").or_else(|| text.strip_prefix("bearer ")))
            .map(str::trim)
            .filter(|token| !token.is_empty())
            .ok_or_else(|| {
                unauthenticated(
                    "CREDENTIAL_MALFORMED",
                    "the authorization metadata is malformed: expected `Bearer <token>`",
                )
            })?;
        let presented = token::classify(token)
            .map_err(|why| unauthenticated("CREDENTIAL_MALFORMED", format!("the token is malformed: {why}")))?;
        match presented {
            token::Presented::Operator(token) => match self.operators.find(&TokenHash::of(token)) {
                Some(name) => Ok(Caller::Operator { name }),
                None => Err(Pending::Refused(unauthenticated(
                    "CREDENTIAL_UNKNOWN",
                    "unknown operator token: it is in no operators file of this cluster",
                ))),
            },
            token::Presented::Agent(token) => {
                let token = TokenHash::of(token);
                if self.agents.is_unknown(&token) {
                    return Err(Pending::NewAgentToken(token));
                }
                Ok(self.agents.authenticate(token)?)
            }
            token::Presented::Service { name, token } => match &self.service_secret {
                Some(secret) if secret.verify(name, token) => Ok(Caller::Service { name: name.into() }),
                Some(_) => Err(Pending::Refused(unauthenticated(
                    "CREDENTIAL_UNKNOWN",
                    format!(
                        "unknown service credential for '{name}': it was not made with this cluster's service secret"
                    ),
                ))),
                None => Err(Pending::Refused(unauthenticated(
                    "CREDENTIAL_UNKNOWN",
                    "this service has no service secret, so it accepts no service credential",
                ))),
            },
        }
    }
}
