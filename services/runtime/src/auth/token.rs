//! The three kinds of bearer token and what is kept of them.
//!
//! - operator tokens, `mop_` and 64 hex digits, listed by their SHA-256 in the
//!   operators file;
//! - agent tokens, `mst_` and 64 hex digits, issued by the roster, which keeps
//!   only their SHA-256;
//! - service credentials, `msv_<service>_` and 64 hex digits: the HMAC-SHA256
//!   of the service's name under the cluster's service secret, so every
//!   service can both present its own and check the others' from one secret.

use std::fmt;

use hmac::{KeyInit as _, Mac as _};
use sha2::Digest as _;

/// Prefix of operator tokens.
pub const OPERATOR_PREFIX: &str = "mop_";
/// Prefix of agent tokens.
pub const AGENT_PREFIX: &str = "mst_";
/// Prefix of service credentials.
pub const SERVICE_PREFIX: &str = "msv_";

/// Hex digits after a token's prefix.
const SECRET_HEX: usize = 64;

/// The SHA-256 of a token: all that is stored of it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TokenHash(pub [u8; 32]);

impl TokenHash {
    /// The hash of `token`.
    pub fn of(token: &str) -> Self {
        Self(sha2::Sha256::digest(token.as_bytes()).into())
    }

    /// From 32 raw bytes; `None` for any other length.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(Self)
    }

    /// From 64 hex digits.
    pub fn from_hex(text: &str) -> Option<Self> {
        let bytes = hex::decode(text.trim()).ok()?;
        Self::from_bytes(&bytes)
    }

    /// 64 lowercase hex digits.
    pub fn to_hex(self) -> String {
        hex::encode(self.0)
    }
}

impl fmt::Debug for TokenHash {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Enough to tell hashes apart in logs, not the whole hash.
        write!(formatter, "TokenHash({}…)", &self.to_hex()[..12])
    }
}

/// A bearer token as presented, sorted by kind; nothing is verified yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Presented<'a> {
    /// An operator's token.
    Operator(&'a str),
    /// An agent's roster token.
    Agent(&'a str),
    /// A service credential naming its service.
    Service {
        /// The service it claims to be.
        name: &'a str,
        /// The whole credential.
        token: &'a str,
    },
}

/// Why a token is malformed, for people.
pub fn classify(token: &str) -> Result<Presented<'_>, String> {
    let hex_secret = |secret: &str| secret.len() == SECRET_HEX && secret.bytes().all(|byte| byte.is_ascii_hexdigit());
    if let Some(secret) = token.strip_prefix(OPERATOR_PREFIX) {
        return if hex_secret(secret) {
            Ok(Presented::Operator(token))
        } else {
            Err(format!("an operator token is `{OPERATOR_PREFIX}` and {SECRET_HEX} hex digits"))
        };
    }
    if let Some(secret) = token.strip_prefix(AGENT_PREFIX) {
        return if hex_secret(secret) {
            Ok(Presented::Agent(token))
        } else {
            Err(format!("an agent token is `{AGENT_PREFIX}` and {SECRET_HEX} hex digits"))
        };
    }
    if let Some(rest) = token.strip_prefix(SERVICE_PREFIX) {
        return match rest.split_once('_') {
            Some((name, secret)) if is_service_name(name) && hex_secret(secret) => {
                Ok(Presented::Service { name, token })
            }
            _ => Err(format!("a service credential is `{SERVICE_PREFIX}<service>_` and {SECRET_HEX} hex digits")),
        };
    }
    Err(format!(
        "not a muster token: it starts with none of `{OPERATOR_PREFIX}` (operator), `{AGENT_PREFIX}` (agent), `{SERVICE_PREFIX}` (service)"
    ))
}

/// Service names: lowercase letters, 1 to 32 of them.
pub fn is_service_name(name: &str) -> bool {
    (1..=32).contains(&name.len()) && name.bytes().all(|byte| byte.is_ascii_lowercase())
}

/// A new random token with `prefix` (`mop_` or `mst_`).
pub fn generate(prefix: &str) -> std::io::Result<String> {
    let mut bytes = [0_u8; 32];
    getrandom::fill(&mut bytes).map_err(|error| std::io::Error::other(format!("random source: {error}")))?;
    Ok(format!("{prefix}{}", hex::encode(bytes)))
}

/// A new service secret: 64 random hex digits.
pub fn generate_secret() -> std::io::Result<String> {
    generate("")
}

/// The cluster's service secret, from which every service credential derives.
#[derive(Clone)]
pub struct ServiceSecret(Vec<u8>);

impl fmt::Debug for ServiceSecret {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("ServiceSecret(***)")
    }
}

/// Fewest bytes a service secret may have.
pub const MIN_SECRET_BYTES: usize = 32;

impl ServiceSecret {
    /// A secret from its text; leading and trailing whitespace is ignored.
    pub fn new(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.len() < MIN_SECRET_BYTES {
            return Err(format!(
                "the service secret has {} bytes; it needs at least {MIN_SECRET_BYTES} (`muster up` makes one of 64 hex digits)",
                text.len()
            ));
        }
        Ok(Self(text.as_bytes().to_vec()))
    }

    fn mac(&self, name: &str) -> hmac::Hmac<sha2::Sha256> {
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        mac.update(b"muster service credential:");
        mac.update(name.as_bytes());
        mac
    }

    /// The credential service `name` presents.
    pub fn credential(&self, name: &str) -> String {
        format!("{SERVICE_PREFIX}{name}_{}", hex::encode(self.mac(name).finalize().into_bytes()))
    }

    /// Whether `token` is the credential of service `name`, in constant time.
    pub fn verify(&self, name: &str, token: &str) -> bool {
        let Some(secret) = token.strip_prefix(SERVICE_PREFIX).and_then(|rest| rest.strip_prefix(name)) else {
            return false;
        };
        let Some(Ok(tag)) = secret.strip_prefix('_').map(hex::decode) else { return false };
        self.mac(name).verify_slice(&tag).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_classified_by_prefix_and_shape() {
        let agent = generate(AGENT_PREFIX).unwrap();
        assert_eq!(classify(&agent), Ok(Presented::Agent(&agent)));
        let operator = generate(OPERATOR_PREFIX).unwrap();
        assert_eq!(classify(&operator), Ok(Presented::Operator(&operator)));
        assert!(classify("mst_abc").unwrap_err().contains("agent token"));
        assert!(classify("hello").unwrap_err().contains("not a muster token"));
        assert!(classify(&format!("msv_Bad_{}", "0".repeat(64))).is_err());
    }

    #[test]
    fn service_credentials_verify_only_for_their_service_and_secret() {
        let secret = ServiceSecret::new(&"s".repeat(40)).unwrap();
        let credential = secret.credential("execution");
        assert!(matches!(classify(&credential), Ok(Presented::Service { name: "execution", .. })));
        assert!(secret.verify("execution", &credential));
        assert!(!secret.verify("notifier", &credential));
        let other = ServiceSecret::new(&"t".repeat(40)).unwrap();
        assert!(!other.verify("execution", &credential));
        let mut tampered = credential.clone();
        let last = tampered.pop().unwrap();
        tampered.push(if last == '0' { '1' } else { '0' });
        assert!(!secret.verify("execution", &tampered));
        assert!(ServiceSecret::new("short").is_err());
    }

    #[test]
    fn hashes_round_trip_through_hex() {
        let hash = TokenHash::of("mst_x");
        assert_eq!(TokenHash::from_hex(&hash.to_hex()), Some(hash));
        assert_eq!(TokenHash::from_bytes(&[0; 31]), None);
    }
}
