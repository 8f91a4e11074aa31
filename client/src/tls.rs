//! TLS for every gRPC client (rustls with ring), configured by certificate
//! files and reloaded when they change; the settings are shared with the
//! server side, which is `muster-runtime`'s.
//!
//! - A client connects with TLS to `https://` URLs, checking the server
//!   against `MUSTER_TLS_CA_FILE`, and presents the certificate and key of
//!   `MUSTER_TLS_CERT_FILE` and `MUSTER_TLS_KEY_FILE` as its own when the
//!   server asks for one.
//! - The files are looked at every `MUSTER_TLS_RELOAD_SECONDS`; new
//!   connections use the new certificates, open ones keep theirs
//!   ([`Reloading`], which the server side uses too).

use std::{
    io,
    path::{Path, PathBuf},
    sync::{Arc, RwLock},
    time::{Duration, SystemTime},
};

use rustls::{
    RootCertStore,
    pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject as _},
};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::{Error, Result};

/// Whether a TLS server asks its clients for a certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ClientAuth {
    /// No client certificate.
    #[default]
    None,
    /// A client certificate, if given, must be valid; callers without one still connect.
    Optional,
    /// Every client must present a valid certificate (mutual TLS).
    Required,
}

/// TLS settings, shared by the server and the clients of a process.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TlsArgs {
    /// PEM certificate chain of this process: served to its clients, and
    /// presented to servers that ask for a client certificate.
    #[arg(long, env = "MUSTER_TLS_CERT_FILE")]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of that certificate.
    #[arg(long, env = "MUSTER_TLS_KEY_FILE")]
    pub tls_key_file: Option<PathBuf>,
    /// PEM certificate authorities that sign the cluster's certificates:
    /// clients check servers against them, servers check client certificates.
    #[arg(long, env = "MUSTER_TLS_CA_FILE")]
    pub tls_ca_file: Option<PathBuf>,
    /// Whether the server asks clients for a certificate.
    #[arg(long, env = "MUSTER_TLS_CLIENT_AUTH", value_enum, default_value_t = ClientAuth::None)]
    pub tls_client_auth: ClientAuth,
    /// How often, in seconds, the certificate files are checked for changes.
    #[arg(long, env = "MUSTER_TLS_RELOAD_SECONDS", default_value_t = 10)]
    pub tls_reload_seconds: u64,
}

impl TlsArgs {
    /// Whether the server side speaks TLS.
    pub fn serves_tls(&self) -> bool {
        self.tls_cert_file.is_some() || self.tls_key_file.is_some()
    }

    /// Whether servers demand client certificates, so a certificate can
    /// identify a service.
    pub fn mutual(&self) -> bool {
        self.serves_tls() && self.tls_client_auth == ClientAuth::Required
    }

    fn reload_every(&self) -> Duration {
        Duration::from_secs(self.tls_reload_seconds.max(1))
    }

    fn files(&self) -> Vec<PathBuf> {
        [&self.tls_cert_file, &self.tls_key_file, &self.tls_ca_file].into_iter().flatten().cloned().collect()
    }
}

/// The cryptography of every muster TLS configuration, server or client: ring.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The error of a TLS setting that cannot be used: `TLS: <what>: <error>`.
pub fn config_error(what: &str, error: impl std::fmt::Display) -> Error {
    Error::Config(format!("TLS: {what}: {error}"))
}

/// The PEM certificates of a file; a file without one is refused.
pub fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let certificates = CertificateDer::pem_file_iter(path)
        .and_then(|items| items.collect::<std::result::Result<Vec<_>, _>>())
        .map_err(|error| config_error(&format!("reading certificates from {}", path.display()), error))?;
    if certificates.is_empty() {
        return Err(Error::Config(format!("TLS: {} holds no PEM certificate", path.display())));
    }
    Ok(certificates)
}

/// The PEM private key of a file.
pub fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path)
        .map_err(|error| config_error(&format!("reading the private key from {}", path.display()), error))
}

/// The certificate authorities of a PEM file, as trust roots.
pub fn read_roots(path: &Path) -> Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for certificate in read_certificates(path)? {
        roots.add(certificate).map_err(|error| config_error(&format!("a CA of {}", path.display()), error))?;
    }
    Ok(roots)
}

fn client_config(args: &TlsArgs) -> Result<rustls::ClientConfig> {
    let roots = match &args.tls_ca_file {
        Some(ca_file) => read_roots(ca_file)?,
        None => RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() },
    };
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|error| config_error("protocol versions", error))?
        .with_root_certificates(roots);
    let mut config = match (&args.tls_cert_file, &args.tls_key_file) {
        (Some(cert_file), Some(key_file)) => builder
            .with_client_auth_cert(read_certificates(cert_file)?, read_key(key_file)?)
            .map_err(|error| config_error("the client certificate and key", error))?,
        _ => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// A configuration rebuilt from its files when they change (the clients'
/// here, the server's in `muster-runtime`).
#[derive(Debug)]
pub struct Reloading<T> {
    current: RwLock<Arc<T>>,
}

impl<T: Send + Sync + 'static> Reloading<T> {
    /// Builds the configuration, then checks the files every reload period
    /// for as long as the configuration is in use.
    pub fn start(args: &TlsArgs, build: fn(&TlsArgs) -> Result<T>) -> Result<Arc<Self>> {
        let reloading = Arc::new(Self { current: RwLock::new(Arc::new(build(args)?)) });
        let watched = Arc::downgrade(&reloading);
        let args = args.clone();
        if args.files().is_empty() {
            return Ok(reloading);
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let mut seen = modification_times(&args.files());
                loop {
                    tokio::time::sleep(args.reload_every()).await;
                    let Some(reloading) = watched.upgrade() else { return };
                    let now = modification_times(&args.files());
                    if now == seen {
                        continue;
                    }
                    match build(&args) {
                        Ok(config) => {
                            *reloading.current.write().unwrap_or_else(std::sync::PoisonError::into_inner) =
                                Arc::new(config);
                            seen = now;
                            tracing::info!("TLS certificates reloaded");
                        }
                        // Files caught half-written: try again next time.
                        Err(error) => tracing::warn!(%error, "TLS certificates changed but could not be loaded"),
                    }
                }
            });
        }
        Ok(reloading)
    }

    /// The configuration as it is now, for a new connection.
    pub fn get(&self) -> Arc<T> {
        self.current.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

fn modification_times(files: &[PathBuf]) -> Vec<Option<SystemTime>> {
    files.iter().map(|file| std::fs::metadata(file).and_then(|metadata| metadata.modified()).ok()).collect()
}

/// The client side: TLS for `https://` URLs.
#[derive(Debug, Clone)]
pub struct ClientTls {
    config: Arc<Reloading<rustls::ClientConfig>>,
}

impl ClientTls {
    /// The clients' TLS for these settings.
    pub fn load(args: &TlsArgs) -> Result<Self> {
        Ok(Self { config: Reloading::start(args, client_config)? })
    }

    /// Connects to `host` (at `address` when given, else where its name
    /// leads), verifying that its certificate names `host`.
    async fn connect(
        &self,
        host: String,
        port: u16,
        address: Option<std::net::SocketAddr>,
    ) -> io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let stream = match address {
            Some(address) => TcpStream::connect(address).await?,
            None => TcpStream::connect((host.as_str(), port)).await?,
        };
        stream.set_nodelay(true)?;
        let name = ServerName::try_from(host.clone())
            .map_err(|error| io::Error::new(io::ErrorKind::InvalidInput, format!("server name {host:?}: {error}")))?;
        TlsConnector::from(self.config.get()).connect(name, stream).await
    }
}

/// A channel to `url` that connects on first use and again after failures:
/// plain for `http://`, TLS for `https://` (with `tls`, or the public roots).
pub fn lazy_channel(url: &str, tls: Option<&ClientTls>) -> Result<tonic::transport::Channel> {
    channel_to(url, None, tls)
}

/// Like [`lazy_channel`], to one of the addresses of the URL's host name
/// (TLS still verifies the name).
pub fn lazy_channel_to(
    url: &str,
    address: std::net::SocketAddr,
    tls: Option<&ClientTls>,
) -> Result<tonic::transport::Channel> {
    channel_to(url, Some(address), tls)
}

fn channel_to(
    url: &str,
    address: Option<std::net::SocketAddr>,
    tls: Option<&ClientTls>,
) -> Result<tonic::transport::Channel> {
    let invalid = |error: &dyn std::fmt::Display| Error::Config(format!("invalid service URL {url:?}: {error}"));
    let uri: http::Uri = url.parse().map_err(|error| invalid(&error))?;
    let endpoint = |address: &str| {
        tonic::transport::Endpoint::from_shared(address.to_owned()).map(|endpoint| {
            endpoint
                .connect_timeout(Duration::from_secs(5))
                .tcp_nodelay(true)
                .http2_keep_alive_interval(Duration::from_secs(30))
                .initial_stream_window_size(Some(4 * 1024 * 1024))
                .initial_connection_window_size(Some(8 * 1024 * 1024))
        })
    };
    if uri.scheme_str() != Some("https") {
        let url = match address {
            Some(address) => format!("http://{address}"),
            None => url.to_owned(),
        };
        return Ok(endpoint(&url).map_err(|error| invalid(&error))?.connect_lazy());
    }
    let host = uri.host().ok_or_else(|| invalid(&"no host"))?.trim_matches(['[', ']']).to_owned();
    let port = uri.port_u16().unwrap_or(443);
    let tls = match tls {
        Some(tls) => tls.clone(),
        None => ClientTls::load(&TlsArgs::default())?,
    };
    // The connector makes the TLS connection itself (so certificates can be
    // reloaded); tonic sees a plain `http` endpoint over it.
    let plain = format!("http://{}", uri.authority().map(|authority| authority.as_str()).unwrap_or(&host));
    let connector = tower::service_fn(move |_: http::Uri| {
        let (tls, host) = (tls.clone(), host.clone());
        async move { tls.connect(host, port, address).await.map(hyper_util::rt::TokioIo::new) }
    });
    Ok(endpoint(&plain).map_err(|error| invalid(&error))?.connect_with_connector_lazy(connector))
}
