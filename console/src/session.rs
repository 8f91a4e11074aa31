//! Who is signed in: the session lives in the browser only, as a cookie
//! sealed with ChaCha20-Poly1305 under the console's key (so it is both
//! secret and tamper-proof, and any console replica with the same key
//! reads it). It holds the caller's token, who the token belongs to, the
//! CSRF token every change must carry, and when it was last used: a
//! session unused for longer than the idle limit is over.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use ring::{
    aead::{Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey},
    rand::{SecureRandom as _, SystemRandom},
};

/// The cookie's name.
pub(crate) const COOKIE: &str = "muster_session";

/// Who signed in.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) enum Identity {
    /// An operator of the cluster.
    Operator,
    /// An agent of the roster, by id.
    Agent(String),
}

/// A signed-in session.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct Session {
    /// The bearer token every call to the cluster carries.
    pub(crate) token: String,
    /// Who the token belongs to, as the cluster answered at sign-in.
    pub(crate) identity: Identity,
    /// The token forms and scripts send back with every change.
    pub(crate) csrf: String,
    /// When the session was last used, in seconds since the Unix epoch.
    seen: u64,
}

impl Session {
    /// A new session for `token`, used now.
    pub(crate) fn new(token: String, identity: Identity) -> Self {
        Self { token, identity, csrf: random_text(24), seen: now() }
    }

    /// The agent's id, for an agent's session.
    pub(crate) fn agent_id(&self) -> Option<&str> {
        match &self.identity {
            Identity::Agent(id) => Some(id),
            Identity::Operator => None,
        }
    }

    /// Who signed in, for the page's header.
    pub(crate) fn who(&self) -> String {
        match &self.identity {
            Identity::Operator => "operator".to_owned(),
            Identity::Agent(id) => format!("agent {id}"),
        }
    }
}

/// The key sessions are sealed with.
pub(crate) struct Keys {
    key: LessSafeKey,
    random: SystemRandom,
    idle: Duration,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Keys").field("idle", &self.idle).finish_non_exhaustive()
    }
}

/// A key that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("the session key must be 32 bytes, or 64 hexadecimal digits; it has {0} bytes")]
pub(crate) struct BadKey(usize);

impl Keys {
    /// Keys from `material`: 32 raw bytes, or 64 hexadecimal digits (with
    /// surrounding whitespace, as a Secret's file may have).
    pub(crate) fn from_material(material: &[u8], idle: Duration) -> Result<Self, BadKey> {
        let text = std::str::from_utf8(material).map(str::trim).ok();
        let decoded = text.filter(|text| text.len() == 64).and_then(|text| {
            (0..32)
                .map(|index| u8::from_str_radix(&text[2 * index..2 * index + 2], 16).ok())
                .collect::<Option<Vec<u8>>>()
        });
        let bytes = decoded.as_deref().unwrap_or(material);
        let key = UnboundKey::new(&CHACHA20_POLY1305, bytes).map_err(|_| BadKey(bytes.len()))?;
        Ok(Self { key: LessSafeKey::new(key), random: SystemRandom::new(), idle })
    }

    /// Keys made up now: sessions end when the process does.
    pub(crate) fn random(idle: Duration) -> Self {
        let mut bytes = [0; 32];
        SystemRandom::new().fill(&mut bytes).expect("the system's random source works");
        Self::from_material(&bytes, idle).expect("32 bytes make a key")
    }

    /// How long a session may go unused.
    pub(crate) fn idle(&self) -> Duration {
        self.idle
    }

    /// `session`, marked used now, as a cookie value.
    pub(crate) fn seal(&self, session: &Session) -> String {
        let mut session = session.clone();
        session.seen = now();
        let mut nonce = [0; NONCE_LEN];
        self.random.fill(&mut nonce).expect("the system's random source works");
        let mut sealed = serde_json::to_vec(&session).expect("a session serialises");
        self.key
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(COOKIE), &mut sealed)
            .expect("a session fits the cipher's limits");
        let mut bytes = nonce.to_vec();
        bytes.extend_from_slice(&sealed);
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    }

    /// The session a cookie value holds, if it was sealed with this key and
    /// has not been idle too long.
    pub(crate) fn open(&self, value: &str) -> Option<Session> {
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(value).ok()?;
        if bytes.len() < NONCE_LEN || bytes.len() > 8 * 1024 {
            return None;
        }
        let (nonce, sealed) = bytes.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut sealed = sealed.to_vec();
        let plain = self.key.open_in_place(nonce, Aad::from(COOKIE), &mut sealed).ok()?;
        let session: Session = serde_json::from_slice(plain).ok()?;
        (now().saturating_sub(session.seen) <= self.idle.as_secs()).then_some(session)
    }
}

/// `bytes` random bytes as URL-safe text.
fn random_text(bytes: usize) -> String {
    let mut buffer = vec![0; bytes];
    SystemRandom::new().fill(&mut buffer).expect("the system's random source works");
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(buffer)
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_secs())
}

/// Compares two secrets in time that does not depend on where they differ.
pub(crate) fn same_secret(left: &str, right: &str) -> bool {
    left.len() == right.len() && left.bytes().zip(right.bytes()).fold(0, |differ, (a, b)| differ | (a ^ b)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> Keys {
        Keys::from_material(&[7; 32], Duration::from_secs(60)).unwrap()
    }

    #[test]
    fn a_sealed_session_opens_with_its_key_only() {
        let session = Session::new("secret-token".into(), Identity::Agent("alice".into()));
        let sealed = keys().seal(&session);
        assert!(!sealed.contains("secret-token"));
        let opened = keys().open(&sealed).unwrap();
        assert_eq!((opened.token.as_str(), opened.identity), ("secret-token", Identity::Agent("alice".into())));
        assert_eq!(opened.csrf, session.csrf);
        let other = Keys::from_material(&[8; 32], Duration::from_secs(60)).unwrap();
        assert!(other.open(&sealed).is_none());
    }

    #[test]
    fn a_tampered_or_idle_session_does_not_open() {
        let sealed = keys().seal(&Session::new("t".into(), Identity::Operator));
        let mut bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(&sealed).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        assert!(keys().open(&base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)).is_none());
        assert!(keys().open("not a cookie").is_none());
        let mut stale = Session::new("t".into(), Identity::Operator);
        stale.seen = now() - 120;
        let mut plain = serde_json::to_vec(&stale).unwrap();
        let key = keys();
        key.key.seal_in_place_append_tag(Nonce::assume_unique_for_key([0; 12]), Aad::from(COOKIE), &mut plain).unwrap();
        let mut bytes = vec![0; 12];
        bytes.extend_from_slice(&plain);
        assert!(key.open(&base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)).is_none());
    }

    #[test]
    fn keys_come_as_raw_bytes_or_hexadecimal() {
        assert!(Keys::from_material(format!("{}\n", "ab".repeat(32)).as_bytes(), Duration::ZERO).is_ok());
        assert_eq!(
            Keys::from_material(b"short", Duration::ZERO).unwrap_err().to_string(),
            "the session key must be 32 bytes, or 64 hexadecimal digits; it has 5 bytes"
        );
    }
}
