//! Agents' tokens: authenticating one, rotating and revoking it, and the log
//! of credential changes the other services follow. The trait methods in
//! `mod.rs` call these.

use muster_proto::roster::v1::{self as pb};
use muster_runtime::auth::{
    Caller, TokenHash,
    directory::{CredentialChange, Position},
    only_for_itself, permission_denied,
};
use tonic::{Request, Response, Status as GrpcStatus};

use super::convert::{agent_to_wire, required_id};
use super::{RosterGrpc, new_token};
use crate::error::{Error, Result};
use crate::store::Store;

impl<S: Store> RosterGrpc<S> {
    pub(super) async fn serve_authenticate(
        &self,
        request: Request<pb::AuthenticateRequest>,
    ) -> Result<Response<pb::AuthenticateResponse>, GrpcStatus> {
        let caller = Caller::of(&request)?;
        let token = request.into_inner().token;
        let token = token.trim();
        if token.is_empty() {
            return Err(Error::invalid("token", "token: required").into());
        }
        let agent = self.inner.store.agent_by_token(&TokenHash::of(token)).await?;
        // An agent learns who it is, and nothing of other tokens: another
        // agent's token and an unknown one get the same refusal.
        if let Some(own) = caller.agent_id()
            && agent.as_ref().is_none_or(|agent| agent.id != own)
        {
            return Err(permission_denied(
                &caller,
                "authenticate a token",
                "NOT_THE_AGENT",
                "an agent may authenticate only its own token".to_owned(),
                &[],
            ));
        }
        match agent {
            Some(agent) => Ok(Response::new(pb::AuthenticateResponse { agent: Some(agent_to_wire(&agent)) })),
            None => Err(Error::Unauthenticated {
                reason: "CREDENTIAL_UNKNOWN",
                message: "the token is not valid: unknown, rotated or revoked".into(),
            }
            .into()),
        }
    }

    pub(super) async fn serve_rotate_token(
        &self,
        request: Request<pb::RotateTokenRequest>,
    ) -> Result<Response<pb::RotateTokenResponse>, GrpcStatus> {
        let caller = Caller::of(&request)?;
        let agent_id = required_id("agent_id", &request.into_inner().agent_id)?;
        only_for_itself(&caller, &agent_id, "rotate the token of another agent")?;
        let token = new_token()?;
        self.inner.store.replace_token(&agent_id, Some(&TokenHash::of(&token)), self.now()).await?;
        self.credentials_changed().await;
        tracing::info!(agent_id = %agent_id, "token rotated");
        Ok(Response::new(pb::RotateTokenResponse { token }))
    }

    pub(super) async fn serve_revoke_token(
        &self,
        request: Request<pb::RevokeTokenRequest>,
    ) -> Result<Response<pb::RevokeTokenResponse>, GrpcStatus> {
        let caller = Caller::of(&request)?;
        let agent_id = required_id("agent_id", &request.into_inner().agent_id)?;
        only_for_itself(&caller, &agent_id, "revoke the token of another agent")?;
        self.inner.store.replace_token(&agent_id, None, self.now()).await?;
        self.credentials_changed().await;
        tracing::info!(agent_id = %agent_id, "token revoked");
        Ok(Response::new(pb::RevokeTokenResponse {}))
    }
}

impl<S: Store> muster_runtime::auth::watch::CredentialLog for RosterGrpc<S> {
    async fn changes_after(&self, position: Position, limit: usize) -> Result<Vec<CredentialChange>, GrpcStatus> {
        Ok(self.inner.store.credential_changes_after(position, limit).await?)
    }

    fn changed(&self) -> &tokio::sync::Notify {
        &self.inner.credentials_changed
    }
}
