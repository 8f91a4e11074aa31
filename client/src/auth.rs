//! What outgoing calls carry: a credential in `authorization`, and the
//! current trace context; and what a refusal's `ErrorInfo` says.

use std::collections::HashMap;

use tonic::metadata::{Ascii, MetadataValue};
use tonic_types::StatusExt as _;

/// A client interceptor adding a bearer credential (unless the request
/// carries one already) and the caller's W3C trace context to every call.
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    authorization: Option<MetadataValue<Ascii>>,
}

impl Credentials {
    /// Calls without a credential (health checks, tests of refusals).
    pub fn none() -> Self {
        Self::default()
    }

    /// Calls with `authorization: Bearer <token>`.
    pub fn bearer(token: &str) -> Result<Self, crate::Error> {
        let value = format!("Bearer {}", token.trim())
            .parse()
            .map_err(|_| crate::Error::Config("a token may hold only visible ASCII characters".to_owned()))?;
        Ok(Self { authorization: Some(value) })
    }

    /// The credential, if any, as metadata text.
    pub fn authorization(&self) -> Option<&MetadataValue<Ascii>> {
        self.authorization.as_ref()
    }
}

impl tonic::service::Interceptor for Credentials {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.authorization
            && !request.metadata().contains_key("authorization")
        {
            request.metadata_mut().insert("authorization", value.clone());
        }
        crate::trace::TraceContextInterceptor.call(request)
    }
}

/// A channel (balanced over a service's replicas: [`crate::balance`])
/// whose calls carry [`Credentials`].
pub type AuthChannel = tonic::service::interceptor::InterceptedService<crate::balance::Balanced, Credentials>;

/// Wraps `channel` so its calls carry `credentials` and the trace context.
pub fn with_credentials(channel: impl Into<crate::balance::Balanced>, credentials: Credentials) -> AuthChannel {
    tonic::service::interceptor::InterceptedService::new(channel.into(), credentials)
}

/// The reason and metadata of a refusal's `ErrorInfo` detail, when it has one.
pub fn error_info(status: &tonic::Status) -> Option<(String, HashMap<String, String>)> {
    let info = status.get_details_error_info()?;
    Some((info.reason, info.metadata))
}
