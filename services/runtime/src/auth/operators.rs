//! Operator credentials: named, stored as the SHA-256 of each token, from a
//! file (reread when it changes, so operators can be added or removed
//! without a restart) and from `MUSTER_OPERATORS`.
//!
//! The file holds one operator per line, `NAME SHA256`; blank lines and
//! lines starting with `#` are ignored:
//!
//! ```text
//! # muster operators: name, then the SHA-256 of the token
//! local  9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
//! ```

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Arc, RwLock},
    time::{Duration, Instant, SystemTime},
};

use super::{AuthArgs, TokenHash, token};

/// How often the file's modification time is looked at, at most.
const RECHECK: Duration = Duration::from_secs(1);

/// The operators a service accepts.
#[derive(Debug, Clone)]
pub struct Operators {
    inner: Arc<RwLock<State>>,
}

#[derive(Debug)]
struct State {
    inline: HashMap<TokenHash, Arc<str>>,
    file: Option<PathBuf>,
    from_file: HashMap<TokenHash, Arc<str>>,
    modified: Option<SystemTime>,
    checked_at: Instant,
}

impl Operators {
    /// The operators of the settings; a file that cannot be read or parsed is an error.
    pub fn load(args: &AuthArgs) -> crate::Result<Self> {
        let inline = match &args.operators {
            Some(list) => parse_inline(&list.0).map_err(crate::Error::Config)?,
            None => HashMap::new(),
        };
        let (from_file, modified) = match &args.operators_file {
            Some(path) => {
                let modified = modified_time(path);
                (read_file(path).map_err(crate::Error::Config)?, modified)
            }
            None => (HashMap::new(), None),
        };
        Ok(Self {
            inner: Arc::new(RwLock::new(State {
                inline,
                file: args.operators_file.clone(),
                from_file,
                modified,
                checked_at: Instant::now(),
            })),
        })
    }

    /// The name of the operator whose token has this hash.
    pub fn find(&self, hash: &TokenHash) -> Option<Arc<str>> {
        {
            let state = self.inner.read().unwrap_or_else(std::sync::PoisonError::into_inner);
            if state.file.is_none() || state.checked_at.elapsed() < RECHECK {
                return state.inline.get(hash).or_else(|| state.from_file.get(hash)).cloned();
            }
        }
        let mut state = self.inner.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if state.checked_at.elapsed() >= RECHECK {
            state.reload_if_changed();
        }
        state.inline.get(hash).or_else(|| state.from_file.get(hash)).cloned()
    }
}

impl State {
    fn reload_if_changed(&mut self) {
        self.checked_at = Instant::now();
        let Some(path) = &self.file else { return };
        let modified = modified_time(path);
        if modified == self.modified {
            return;
        }
        match read_file(path) {
            Ok(operators) => {
                tracing::info!(path = %path.display(), operators = operators.len(), "operators file reloaded");
                self.from_file = operators;
                self.modified = modified;
            }
            // A file caught half-written, or broken: keep the operators known.
            Err(error) => tracing::warn!(path = %path.display(), %error, "operators file not reloaded"),
        }
    }
}

fn modified_time(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|metadata| metadata.modified()).ok()
}

fn read_file(path: &Path) -> Result<HashMap<TokenHash, Arc<str>>, String> {
    let text = std::fs::read_to_string(path).map_err(|error| format!("reading {}: {error}", path.display()))?;
    parse_file(&text).map_err(|error| format!("{}:{error}", path.display()))
}

/// Parses the file format; errors say `LINE: what`.
pub fn parse_file(text: &str) -> Result<HashMap<TokenHash, Arc<str>>, String> {
    let mut operators = HashMap::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut fields = line.split_whitespace();
        let (Some(name), Some(hash), None) = (fields.next(), fields.next(), fields.next()) else {
            return Err(format!("{}: expected `NAME SHA256`", index + 1));
        };
        add(&mut operators, name, hash).map_err(|error| format!("{}: {error}", index + 1))?;
    }
    Ok(operators)
}

fn parse_inline(text: &str) -> Result<HashMap<TokenHash, Arc<str>>, String> {
    let mut operators = HashMap::new();
    for entry in text.split(',').map(str::trim).filter(|entry| !entry.is_empty()) {
        let (name, hash) =
            entry.split_once(':').ok_or_else(|| "MUSTER_OPERATORS: each entry is `NAME:SHA256`".to_owned())?;
        add(&mut operators, name, hash).map_err(|error| format!("MUSTER_OPERATORS: {error}"))?;
    }
    Ok(operators)
}

fn add(operators: &mut HashMap<TokenHash, Arc<str>>, name: &str, hash: &str) -> Result<(), String> {
    if !is_operator_name(name) {
        return Err(format!("operator name {name:?} must be 1 to 64 of A-Z a-z 0-9 . _ @ -"));
    }
    let hash =
        TokenHash::from_hex(hash).ok_or_else(|| format!("operator '{name}': the SHA-256 must be 64 hex digits"))?;
    operators.insert(hash, name.into());
    Ok(())
}

/// Operator names: 1 to 64 of `A-Z a-z 0-9 . _ @ -`.
pub fn is_operator_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name.bytes().all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'@' | b'-'))
}

/// Adds an operator named `name` to the file at `path` (created with mode
/// 0600 when missing) and returns its new token, which is stored nowhere.
pub fn add_to_file(path: &Path, name: &str) -> crate::Result<String> {
    if !is_operator_name(name) {
        return Err(crate::Error::Config(format!("operator name {name:?} must be 1 to 64 of A-Z a-z 0-9 . _ @ -")));
    }
    let io_error = |source| crate::Error::Io { context: format!("writing {}", path.display()), source };
    let existing = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(source) => return Err(io_error(source)),
    };
    if parse_file(&existing).map_err(crate::Error::Config)?.values().any(|known| &**known == name) {
        return Err(crate::Error::Config(format!("{} already has an operator named '{name}'", path.display())));
    }
    let token = token::generate(token::OPERATOR_PREFIX).map_err(io_error)?;
    let mut text = if existing.is_empty() {
        "# muster operators: one per line, the name and the SHA-256 of the token\n".to_owned()
    } else {
        existing
    };
    if !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&format!("{name} {}\n", TokenHash::of(&token).to_hex()));
    crate::files::write_private(path, text.as_bytes()).map_err(io_error)?;
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_format_names_operators_by_their_hash() {
        let hash = TokenHash::of("mop_x");
        let text = format!("# comment\n\nlocal {}\n", hash.to_hex());
        let operators = parse_file(&text).unwrap();
        assert_eq!(operators.get(&hash).map(|name| &**name), Some("local"));
        assert_eq!(parse_file("local nothex\n").unwrap_err(), "1: operator 'local': the SHA-256 must be 64 hex digits");
        assert_eq!(parse_file("a b c\n").unwrap_err(), "1: expected `NAME SHA256`");
        assert!(parse_inline(&format!("ci:{}", hash.to_hex())).unwrap().contains_key(&hash));
        assert!(parse_inline("ci").is_err());
    }
}
