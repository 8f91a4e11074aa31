//! The tower layer that authenticates every call and applies each method's
//! coarse [`Access`] rule before the handler runs.
//!
//! Health, reflection and `/metrics` are open. Every method of a registered
//! service needs a rule: a method without one is refused (fail closed), so a
//! new RPC cannot slip through unguarded.

use std::{
    collections::HashMap,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use super::{Authenticator, Caller, CallerKind, Pending, permission_denied};

/// Which kinds of caller a method admits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access(u8);

impl Access {
    /// Operators.
    pub const OPERATOR: Self = Self(1);
    /// Agents.
    pub const AGENT: Self = Self(2);
    /// The cluster's services.
    pub const SERVICE: Self = Self(4);
    /// Any authenticated caller.
    pub const ANYONE: Self = Self(7);

    /// Both sets.
    pub const fn or(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }

    /// Whether a caller of `kind` is admitted.
    pub fn allows(self, kind: CallerKind) -> bool {
        let bit = match kind {
            CallerKind::Operator => Self::OPERATOR.0,
            CallerKind::Agent => Self::AGENT.0,
            CallerKind::Service => Self::SERVICE.0,
        };
        self.0 & bit != 0
    }

    /// For people: `operators`, `operators and agents`, ...
    pub fn describe(self) -> String {
        if self == Self::ANYONE {
            return "any authenticated caller".to_owned();
        }
        let names: Vec<&str> =
            [(Self::OPERATOR, "operators"), (Self::AGENT, "agents"), (Self::SERVICE, "the cluster's services")]
                .into_iter()
                .filter(|(access, _)| self.0 & access.0 != 0)
                .map(|(_, name)| name)
                .collect();
        match names.as_slice() {
            [] => "nobody".to_owned(),
            [one] => (*one).to_owned(),
            [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
        }
    }
}

/// A method and who may call it.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    /// The method's name, as in the proto (`RegisterAgent`).
    pub method: &'static str,
    /// Who may call it.
    pub access: Access,
}

/// A rule, for the tables services declare.
pub const fn rule(method: &'static str, access: Access) -> Rule {
    Rule { method, access }
}

/// The methods of `service` (`muster.roster.v1.RosterService`) in the
/// contract that `rules` has no rule for, and rules that name no method of
/// it: both empty when the table is complete.
pub fn rule_gaps(service: &str, rules: &[Rule]) -> (Vec<String>, Vec<String>) {
    use prost::Message as _;
    let set =
        prost_types::FileDescriptorSet::decode(muster_proto::FILE_DESCRIPTOR_SET).expect("the contract's descriptors");
    let methods: Vec<String> = set
        .file
        .iter()
        .flat_map(|file| {
            file.service.iter().filter(move |candidate| format!("{}.{}", file.package(), candidate.name()) == service)
        })
        .flat_map(|found| found.method.iter().map(|method| method.name().to_owned()))
        .collect();
    let unruled = methods.iter().filter(|method| !rules.iter().any(|rule| rule.method == *method)).cloned().collect();
    let unknown = rules
        .iter()
        .filter(|rule| !methods.iter().any(|method| method == rule.method))
        .map(|rule| rule.method.to_owned())
        .collect();
    (unruled, unknown)
}

/// The rules of the services one server serves, by path.
#[derive(Debug, Clone, Default)]
pub struct Rules {
    by_path: HashMap<String, Access>,
    services: Vec<String>,
}

impl Rules {
    /// Adds the rules of `service` (`muster.roster.v1.RosterService`).
    pub fn add(&mut self, service: &str, rules: &[Rule]) {
        self.services.push(format!("/{service}/"));
        for rule in rules {
            self.by_path.insert(format!("/{service}/{}", rule.method), rule.access);
        }
    }
}

/// Authenticates calls and applies the rules; see the module's doc.
#[derive(Debug, Clone)]
pub struct AuthLayer {
    authenticator: Arc<Authenticator>,
    rules: Arc<Rules>,
}

impl AuthLayer {
    /// The layer for these rules.
    pub fn new(authenticator: Arc<Authenticator>, rules: Rules) -> Self {
        Self { authenticator, rules: Arc::new(rules) }
    }

    /// Whether the rules let `caller` call `path`.
    fn allow(&self, path: &str, caller: Caller) -> Result<Caller, tonic::Status> {
        let method = path.trim_start_matches('/');
        match self.rules.by_path.get(path) {
            Some(access) if access.allows(caller.kind()) => Ok(caller),
            Some(access) => Err(permission_denied(
                &caller,
                &format!("call {method}"),
                "CALLER_KIND_NOT_ALLOWED",
                format!("it is for {}", access.describe()),
                &[("method", method.to_owned())],
            )),
            None if self.rules.services.iter().any(|service| path.starts_with(service.as_str())) => {
                tracing::error!(method, "a method has no access rule; refused");
                Err(permission_denied(
                    &caller,
                    &format!("call {method}"),
                    "NO_ACCESS_RULE",
                    "the method has no access rule on this server",
                    &[("method", method.to_owned())],
                ))
            }
            // Not one of ours: the router answers UNIMPLEMENTED.
            None => Ok(caller),
        }
    }
}

/// Paths anyone may call: health, reflection, metrics.
fn is_open(path: &str) -> bool {
    path.starts_with("/grpc.health.v1.Health/")
        || path.starts_with("/grpc.reflection.v1.ServerReflection/")
        || path.starts_with("/grpc.reflection.v1alpha.ServerReflection/")
        || path == "/metrics"
}

impl<S> tower::Layer<S> for AuthLayer {
    type Service = AuthService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AuthService { layer: self.clone(), inner }
    }
}

/// The service [`AuthLayer`] makes.
#[derive(Debug, Clone)]
pub struct AuthService<S> {
    layer: AuthLayer,
    inner: S,
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, RequestBody> tower::Service<http::Request<RequestBody>> for AuthService<S>
where
    S: tower::Service<http::Request<RequestBody>, Response = http::Response<tonic::body::Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    RequestBody: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, context: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(context)
    }

    fn call(&mut self, mut request: http::Request<RequestBody>) -> Self::Future {
        let path = request.uri().path().to_owned();
        if is_open(&path) {
            return Box::pin(self.inner.call(request));
        }
        let refused = |status: tonic::Status| -> Self::Future { Box::pin(std::future::ready(Ok(status.into_http()))) };
        match self.layer.authenticator.authenticate(request.headers(), request.extensions()) {
            Ok(caller) => match self.layer.allow(&path, caller) {
                Ok(caller) => {
                    request.extensions_mut().insert(caller);
                    Box::pin(self.inner.call(request))
                }
                Err(status) => refused(status),
            },
            Err(Pending::Refused(status)) => refused(status),
            // A token the roster may have issued a moment ago: wait for it
            // (the service that was made ready goes with the call).
            Err(Pending::NewAgentToken(token)) => {
                let ready = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, ready);
                let layer = self.layer.clone();
                Box::pin(async move {
                    let admitted = layer
                        .authenticator
                        .agents()
                        .authenticate_new(token)
                        .await
                        .and_then(|caller| layer.allow(&path, caller));
                    match admitted {
                        Ok(caller) => {
                            request.extensions_mut().insert(caller);
                            inner.call(request).await
                        }
                        Err(status) => Ok(status.into_http()),
                    }
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_sets_admit_their_kinds_and_describe_themselves() {
        let rule = Access::OPERATOR.or(Access::SERVICE);
        assert!(rule.allows(CallerKind::Operator));
        assert!(!rule.allows(CallerKind::Agent));
        assert_eq!(rule.describe(), "operators and the cluster's services");
        assert_eq!(Access::ANYONE.describe(), "any authenticated caller");
        assert_eq!(Access::AGENT.describe(), "agents");
    }
}
