//! A service's security as a whole: how it authenticates its callers (its
//! [`Authenticator`] and its copy of the agent credentials), how it proves
//! itself to the services it calls (its service credential, or its
//! certificate under mutual TLS), and the TLS of its server and clients.

use std::{sync::Arc, time::Duration};

use crate::{
    Error, Result,
    auth::{AgentDirectory, Authenticator, client},
    config::ServerArgs,
    tls::{ClientTls, ServerTls},
};

/// Everything a service needs to authenticate and be authenticated.
#[derive(Debug, Clone)]
pub struct Security {
    /// Checks the callers of this service.
    pub authenticator: Arc<Authenticator>,
    /// TLS of this service's server, when it serves TLS.
    pub server_tls: Option<ServerTls>,
    client_tls: ClientTls,
    own: client::Credentials,
}

impl Security {
    /// The security of service `name` (`execution`, `validator`,
    /// `notifier`), whose copy of the agent credentials follows the
    /// roster's stream. Call inside the Tokio runtime.
    pub fn following_roster(name: &str, args: &ServerArgs) -> Result<Self> {
        let directory = AgentDirectory::new(Duration::from_millis(args.auth.credentials_max_staleness_ms));
        let security = Self::with_directory(name, args, directory.clone())?;
        crate::auth::watch::spawn_follower(directory, security.channel(&args.auth.roster_url)?);
        Ok(security)
    }

    /// The security of service `name` with a copy of the agent credentials
    /// that the caller keeps current (the roster, from its own database).
    pub fn with_directory(name: &str, args: &ServerArgs, directory: AgentDirectory) -> Result<Self> {
        let authenticator = Authenticator::new(&args.auth, directory, args.tls.mutual())?;
        let own = match authenticator.service_credential(name) {
            Some(credential) => client::Credentials::bearer(&credential)?,
            // Under mutual TLS the certificate speaks for the service.
            None if args.tls.mutual() => client::Credentials::none(),
            None => {
                return Err(Error::Config(
                    "no service credential: set MUSTER_SERVICE_SECRET_FILE (the cluster's shared service secret) or turn on mutual TLS (MUSTER_TLS_CLIENT_AUTH=required with MUSTER_TLS_CERT_FILE, MUSTER_TLS_KEY_FILE and MUSTER_TLS_CA_FILE)".to_owned(),
                ));
            }
        };
        Ok(Self {
            authenticator: Arc::new(authenticator),
            server_tls: ServerTls::load(&args.tls)?,
            client_tls: ClientTls::load(&args.tls)?,
            own,
        })
    }

    /// A lazily connecting channel to another service (`http://` or
    /// `https://`; several URLs comma-separated, or a name with several
    /// addresses, are balanced: [`crate::balance`]), whose calls carry this
    /// service's credential and trace context.
    pub fn channel(&self, url: &str) -> Result<client::AuthChannel> {
        let channel = crate::balance::Balanced::connect(url, Some(&self.client_tls))?;
        Ok(client::with_credentials(channel, self.own.clone()))
    }

    /// Like [`Security::channel`], to one replica of a service at `address`
    /// (an IP address; the port is the URL's), verifying under TLS that it
    /// is the URL's host; `address` empty: like [`Security::channel`].
    pub fn channel_at(&self, url: &str, address: &str) -> Result<client::AuthChannel> {
        if address.is_empty() {
            return self.channel(url);
        }
        let invalid = |what: &str| Error::Config(format!("cannot reach {url} at {address:?}: {what}"));
        let ip: std::net::IpAddr = address.parse().map_err(|_| invalid("not an IP address"))?;
        let uri: http::Uri = url.parse().map_err(|_| invalid("not a URL"))?;
        let port = uri.port_u16().unwrap_or(if uri.scheme_str() == Some("https") { 443 } else { 80 });
        let channel = crate::tls::lazy_channel_to(url, std::net::SocketAddr::new(ip, port), Some(&self.client_tls))?;
        Ok(client::with_credentials(channel, self.own.clone()))
    }

    /// The copy of the agent credentials.
    pub fn agents(&self) -> &AgentDirectory {
        self.authenticator.agents()
    }
}
