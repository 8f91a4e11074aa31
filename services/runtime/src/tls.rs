//! TLS and mutual TLS for every gRPC server (rustls with ring), configured
//! by certificate files and reloaded when they change. The settings and the
//! client side (TLS to `https://` URLs) are [`muster_client::tls`],
//! re-exported here.
//!
//! - A server with `MUSTER_TLS_CERT_FILE` and `MUSTER_TLS_KEY_FILE` speaks
//!   TLS only; with `MUSTER_TLS_CLIENT_AUTH=required` it also demands a
//!   client certificate signed by `MUSTER_TLS_CA_FILE` (mutual TLS).
//! - A client connects with TLS to `https://` URLs, checking the server
//!   against `MUSTER_TLS_CA_FILE`, and presents the same certificate and key
//!   as its own when the server asks for one.
//! - The files are looked at every `MUSTER_TLS_RELOAD_SECONDS`; new
//!   connections use the new certificates, open ones keep theirs.
//!
//! Under mutual TLS a certificate whose DNS name starts with
//! `muster-<service>` (`muster-execution`, `muster-roster.muster.svc`, ...)
//! identifies that service ([`peer_service`]).

use std::{io, net::SocketAddr, sync::Arc, time::Duration};

pub use muster_client::tls::{ClientAuth, ClientTls, TlsArgs, lazy_channel, lazy_channel_to};
use muster_client::tls::{Reloading, config_error, provider, read_certificates, read_key, read_roots};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, server::TlsStream};
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

use crate::Result;

fn server_config(args: &TlsArgs) -> muster_client::Result<rustls::ServerConfig> {
    let (Some(cert_file), Some(key_file)) = (&args.tls_cert_file, &args.tls_key_file) else {
        return Err(muster_client::Error::Config(
            "TLS: set both MUSTER_TLS_CERT_FILE and MUSTER_TLS_KEY_FILE".to_owned(),
        ));
    };
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|error| config_error("protocol versions", error))?;
    let builder = match args.tls_client_auth {
        ClientAuth::None => builder.with_no_client_auth(),
        client_auth => {
            let ca_file = args.tls_ca_file.as_ref().ok_or_else(|| {
                muster_client::Error::Config(
                    "TLS: client certificates need MUSTER_TLS_CA_FILE to check them against".to_owned(),
                )
            })?;
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(read_roots(ca_file)?), provider());
            let verifier =
                if client_auth == ClientAuth::Optional { verifier.allow_unauthenticated() } else { verifier };
            builder.with_client_cert_verifier(verifier.build().map_err(|error| config_error("client verifier", error))?)
        }
    };
    let mut config = builder
        .with_single_cert(read_certificates(cert_file)?, read_key(key_file)?)
        .map_err(|error| config_error("the certificate and key", error))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// The server side: TLS connections accepted on a listener.
#[derive(Debug, Clone)]
pub struct ServerTls {
    config: Arc<Reloading<rustls::ServerConfig>>,
}

impl ServerTls {
    /// The server's TLS, or `None` when the settings name no certificate.
    pub fn load(args: &TlsArgs) -> Result<Option<Self>> {
        if !args.serves_tls() {
            return Ok(None);
        }
        Ok(Some(Self { config: Reloading::start(args, server_config)? }))
    }

    /// The TLS streams of the connections accepted on `listener`, each
    /// handshaken in a task of its own; failed handshakes are logged and dropped.
    pub fn incoming(
        &self,
        listener: TcpListener,
    ) -> tokio_stream::wrappers::ReceiverStream<io::Result<TlsStream<TcpStream>>> {
        let (sender, receiver) = tokio::sync::mpsc::channel(64);
        let config = self.config.clone();
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    accepted = listener.accept() => accepted,
                    () = sender.closed() => return,
                };
                let (stream, peer): (TcpStream, SocketAddr) = match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        tracing::warn!(%error, "accepting a connection failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let acceptor = TlsAcceptor::from(config.get());
                let sender = sender.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = sender.send(Ok(tls)).await;
                        }
                        Ok(Err(error)) => tracing::info!(%peer, %error, "TLS handshake refused"),
                        Err(_) => tracing::info!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        tokio_stream::wrappers::ReceiverStream::new(receiver)
    }
}

/// The service a mutual-TLS client certificate names (`muster-execution`,
/// `muster-roster.muster.svc`, ...), if any.
pub fn peer_service(extensions: &http::Extensions) -> Option<&'static str> {
    let certificates = extensions.get::<TlsConnectInfo<TcpConnectInfo>>()?.peer_certs()?;
    let leaf = webpki::EndEntityCert::try_from(certificates.first()?).ok()?;
    leaf.valid_dns_names().find_map(|name| {
        let first_label = name.split('.').next()?;
        ["execution", "roster", "validator", "notifier"]
            .into_iter()
            .find(|service| first_label.strip_prefix("muster-") == Some(*service))
    })
}
