//! Cluster contexts: where a cluster is, so that every `muster` command
//! finds it. `muster up` writes one (its services' addresses and data
//! folder) and makes it the current one; a command reads the context that
//! `--cluster NAME` or `MUSTER_CLUSTER` names, else the current one.
//! A flag or a `MUSTER_*_URL` variable still wins over the context, and
//! without any context the defaults are the ports `muster up` uses by
//! default.
//!
//! Contexts live in `MUSTER_CONFIG_DIR`, else `$XDG_CONFIG_HOME/muster`,
//! else `~/.config/muster`: `clusters/NAME.json`, and `current` holding the
//! current one's name. `MUSTER_CONFIG_DIR` set to an empty value turns
//! contexts off (nothing is read or written).

use std::{
    path::{Path, PathBuf},
    sync::OnceLock,
};

use anyhow::Context as _;

/// The context `muster up` writes unless told another name.
pub const DEFAULT_NAME: &str = "local";

/// Where one cluster is.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClusterContext {
    /// Its name (`local` unless `muster up` was given another).
    pub name: String,
    /// The data folder of `muster up`: the local operator's token is there.
    pub data_dir: PathBuf,
    /// The execution service's URL.
    pub execution: String,
    /// The roster's URL.
    pub roster: String,
    /// The validator's URL.
    pub validator: String,
    /// The notifier's URL.
    pub notifier: String,
    /// The console's URL, when it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub console: Option<String>,
}

/// One of the cluster's services, for [`default_url`].
#[derive(Debug, Clone, Copy)]
pub enum Service {
    /// The execution service.
    Execution,
    /// The roster.
    Roster,
    /// The validator.
    Validator,
    /// The notifier.
    Notifier,
}

/// The folder of the contexts; `None` when contexts are off or there is no
/// home folder.
pub fn config_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("MUSTER_CONFIG_DIR") {
        return (!dir.is_empty()).then(|| PathBuf::from(dir));
    }
    if let Some(dir) = std::env::var_os("XDG_CONFIG_HOME").filter(|dir| !dir.is_empty()) {
        return Some(PathBuf::from(dir).join("muster"));
    }
    std::env::var_os("HOME").filter(|dir| !dir.is_empty()).map(|home| PathBuf::from(home).join(".config/muster"))
}

/// Whether `name` can name a context (it becomes a file name).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        && !name.starts_with('.')
}

fn file_of(dir: &Path, name: &str) -> PathBuf {
    dir.join("clusters").join(format!("{name}.json"))
}

/// Stores `context` and makes it the current one; the file written, or
/// `None` when contexts are off.
pub fn save(context: &ClusterContext) -> anyhow::Result<Option<PathBuf>> {
    let Some(dir) = config_dir() else { return Ok(None) };
    anyhow::ensure!(
        valid_name(&context.name),
        "'{}' cannot name a cluster: letters, digits, '-', '_' and '.', at most 64",
        context.name
    );
    let file = file_of(&dir, &context.name);
    let parent = file.parent().unwrap_or(&dir);
    std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    let text = serde_json::to_string_pretty(context)?;
    std::fs::write(&file, format!("{text}\n")).with_context(|| format!("writing {}", file.display()))?;
    let current = dir.join("current");
    std::fs::write(&current, format!("{}\n", context.name))
        .with_context(|| format!("writing {}", current.display()))?;
    Ok(Some(file))
}

/// The name asked for with `--cluster NAME` (or `--cluster=NAME`) among
/// `arguments`, else `MUSTER_CLUSTER`.
fn asked_name(arguments: &[String]) -> Option<String> {
    let mut given = None;
    let mut rest = arguments.iter();
    while let Some(argument) = rest.next() {
        if argument == "--" {
            break;
        }
        if argument == "--cluster" {
            given = rest.next().cloned();
        } else if let Some(name) = argument.strip_prefix("--cluster=") {
            given = Some(name.to_owned());
        }
    }
    given.or_else(|| std::env::var("MUSTER_CLUSTER").ok()).filter(|name| !name.is_empty())
}

/// The context a command uses: the one named (an error when there is no
/// such context), else the current one, else none.
pub fn load(named: Option<&str>) -> anyhow::Result<Option<ClusterContext>> {
    let Some(dir) = config_dir() else {
        anyhow::ensure!(named.is_none(), "cluster contexts are off (MUSTER_CONFIG_DIR is empty)");
        return Ok(None);
    };
    let name = match named {
        Some(name) => name.to_owned(),
        None => match std::fs::read_to_string(dir.join("current")) {
            Ok(name) if valid_name(name.trim()) => name.trim().to_owned(),
            _ => return Ok(None),
        },
    };
    anyhow::ensure!(valid_name(&name), "'{name}' cannot name a cluster");
    let file = file_of(&dir, &name);
    let text = match std::fs::read_to_string(&file) {
        Ok(text) => text,
        Err(_) if named.is_none() => return Ok(None),
        Err(_) => anyhow::bail!("no cluster '{name}' ({} does not exist); known: {}", file.display(), known(&dir)),
    };
    let context = serde_json::from_str(&text).with_context(|| format!("reading {}", file.display()))?;
    Ok(Some(context))
}

/// The names of the stored contexts, for messages.
fn known(dir: &Path) -> String {
    let mut names: Vec<String> = std::fs::read_dir(dir.join("clusters"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.strip_suffix(".json").map(str::to_owned))
        .collect();
    names.sort();
    if names.is_empty() { "none (`muster up` writes one)".to_owned() } else { names.join(", ") }
}

/// The context this command uses, read once: the one `--cluster` or
/// `MUSTER_CLUSTER` names, else the current one. Check [`selection`] for
/// errors first.
pub fn selected() -> Option<&'static ClusterContext> {
    selection().as_ref().ok().and_then(Option::as_ref)
}

/// The context this command uses, or why the one named cannot be used.
pub fn selection() -> &'static Result<Option<ClusterContext>, String> {
    static SELECTED: OnceLock<Result<Option<ClusterContext>, String>> = OnceLock::new();
    SELECTED.get_or_init(|| {
        let arguments: Vec<String> = std::env::args().skip(1).collect();
        load(asked_name(&arguments).as_deref()).map_err(|error| format!("{error:#}"))
    })
}

/// The URL of `service` when no flag or variable gives one: the selected
/// context's, else the default port of `muster up`.
pub fn default_url(service: Service) -> String {
    let context = selected();
    let (from_context, port) = match service {
        Service::Execution => (context.map(|context| &context.execution), 50051),
        Service::Roster => (context.map(|context| &context.roster), 50052),
        Service::Validator => (context.map(|context| &context.validator), 50053),
        Service::Notifier => (context.map(|context| &context.notifier), 50054),
    };
    from_context.cloned().unwrap_or_else(|| format!("http://127.0.0.1:{port}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cluster_is_named_by_its_flag_before_the_variable() {
        let arguments = |text: &str| text.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(asked_name(&arguments("roster list --cluster staging")), Some("staging".to_owned()));
        assert_eq!(asked_name(&arguments("--cluster=prod roster list")), Some("prod".to_owned()));
        assert_eq!(asked_name(&arguments("inbox post -- --cluster x")), std::env::var("MUSTER_CLUSTER").ok());
    }

    #[test]
    fn names_are_file_names() {
        for good in ["local", "staging-2", "team_a", "eu.west"] {
            assert!(valid_name(good), "{good}");
        }
        for bad in ["", "../etc", ".hidden", "a/b", "x y", &"n".repeat(65)] {
            assert!(!valid_name(bad), "{bad}");
        }
    }
}
