//! Credentials on this machine: the local operator and service secret that
//! `muster up` keeps in its data folder, the credential a command runs with,
//! and channels whose calls carry it (over TLS for `https://` URLs).

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use muster_runtime::{
    auth::{operators, token},
    files::write_private,
};

/// The local operator's token, in the data folder (mode 0600).
pub const OPERATOR_TOKEN_FILE: &str = "operator.token";
/// The operators file the local services read: names and hashes.
pub const OPERATORS_FILE: &str = "operators";
/// The cluster's service secret (mode 0600).
pub const SERVICE_SECRET_FILE: &str = "service.secret";
/// The name of the local operator.
pub const LOCAL_OPERATOR: &str = "local";

/// The credentials of a cluster on this machine.
#[derive(Debug, Clone)]
pub struct LocalCredentials {
    /// The local operator's token.
    pub operator_token: String,
    /// The operators file, for `MUSTER_OPERATORS_FILE`.
    pub operators_file: PathBuf,
    /// The service secret's file, for `MUSTER_SERVICE_SECRET_FILE`.
    pub service_secret_file: PathBuf,
}

impl LocalCredentials {
    /// The local operator and service secret of `data_dir`, made on first use.
    pub fn ensure(data_dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(data_dir).with_context(|| format!("creating {}", data_dir.display()))?;
        let service_secret_file = data_dir.join(SERVICE_SECRET_FILE);
        if !service_secret_file.exists() {
            write_private(&service_secret_file, token::generate_secret()?.as_bytes())
                .with_context(|| format!("writing {}", service_secret_file.display()))?;
        }
        let operators_file = data_dir.join(OPERATORS_FILE);
        let token_file = data_dir.join(OPERATOR_TOKEN_FILE);
        let operator_token = match std::fs::read_to_string(&token_file) {
            Ok(text) if !text.trim().is_empty() => text.trim().to_owned(),
            _ => {
                // A new local operator; an old entry of that name goes.
                let kept: String = std::fs::read_to_string(&operators_file)
                    .unwrap_or_default()
                    .lines()
                    .filter(|line| line.split_whitespace().next() != Some(LOCAL_OPERATOR))
                    .map(|line| format!("{line}\n"))
                    .collect();
                write_private(&operators_file, kept.as_bytes())?;
                let operator_token = operators::add_to_file(&operators_file, LOCAL_OPERATOR)?;
                write_private(&token_file, format!("{operator_token}\n").as_bytes())
                    .with_context(|| format!("writing {}", token_file.display()))?;
                operator_token
            }
        };
        Ok(Self { operator_token, operators_file, service_secret_file })
    }

    /// The services' environment for these credentials.
    pub fn environment(&self) -> Vec<(String, String)> {
        vec![
            ("MUSTER_OPERATORS_FILE".to_owned(), self.operators_file.display().to_string()),
            ("MUSTER_SERVICE_SECRET_FILE".to_owned(), self.service_secret_file.display().to_string()),
        ]
    }
}

/// The data folder of the cluster on this machine: `MUSTER_DATA_DIR`, else
/// the selected cluster context's ([`crate::context`]), else `muster-data`.
pub fn default_data_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("MUSTER_DATA_DIR") {
        return PathBuf::from(dir);
    }
    crate::context::selected().map_or_else(|| PathBuf::from("muster-data"), |context| context.data_dir.clone())
}

/// The credential a command runs with: the one given (`--token` or
/// `MUSTER_TOKEN`), else the local operator's token that `muster up` keeps.
pub fn resolve(given: Option<&str>) -> anyhow::Result<String> {
    if let Some(token) = given.map(str::trim).filter(|token| !token.is_empty()) {
        return Ok(token.to_owned());
    }
    let file = default_data_dir().join(OPERATOR_TOKEN_FILE);
    match std::fs::read_to_string(&file) {
        Ok(text) if !text.trim().is_empty() => Ok(text.trim().to_owned()),
        _ => anyhow::bail!(
            "no credential: pass --token or set MUSTER_TOKEN (an operator's token, or an agent's roster token); \
             on the machine that runs `muster up`, the local operator's token in {} is used by itself",
            file.display()
        ),
    }
}

pub use muster_worker::Endpoint;
