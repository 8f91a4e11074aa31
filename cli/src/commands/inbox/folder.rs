//! The folder side of `muster inbox watch`: which files are ready to post,
//! the `.error` notes beside those refused, the moves to `processed/` and
//! `archive/`, and the small state file that remembers which file follows
//! which message. No gRPC here.
//!
//! Hidden contract: every change on disk is one `rename` (a move, or the
//! state file replaced whole), and the state is written after the move it
//! records, so a watcher killed at any point finds, on its next start,
//! each tracked file where the state says or one step further along
//! ([`Folder::open`] follows it there).

use std::{
    collections::HashMap,
    io::ErrorKind,
    path::{Path, PathBuf},
    time::SystemTime,
};

use anyhow::Context as _;
use serde_json::{Value, json};

/// The state file, in the watched folder (a dotfile: never an inbox).
pub(super) const STATE_FILE: &str = ".muster-inbox-watch.json";
/// The folder of files whose messages were processed.
pub(super) const PROCESSED: &str = "processed";
/// The folder of files whose messages were archived.
pub(super) const ARCHIVE: &str = "archive";
/// The suffix of the note beside a file that could not be posted.
pub(super) const ERROR_SUFFIX: &str = ".error";

/// Where a posted file is: beside the unprocessed message's siblings, or in
/// `processed/` (archived files are no longer tracked).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Place {
    /// `DIR/<inbox>/`: its message is unprocessed.
    Inbox,
    /// `DIR/<inbox>/processed/`.
    Processed,
}

impl Place {
    fn name(self) -> &'static str {
        match self {
            Self::Inbox => "inbox",
            Self::Processed => PROCESSED,
        }
    }
}

/// A posted file and the message it follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Tracked {
    /// The inbox (its folder's name).
    pub(super) inbox: String,
    /// The file's name in its folder.
    pub(super) file: String,
    /// Where it is.
    pub(super) place: Place,
    /// The message posted from it.
    pub(super) message_id: String,
}

/// A file in an inbox folder that has not been posted.
#[derive(Debug)]
pub(super) struct Candidate {
    /// The inbox (its folder's name).
    pub(super) inbox: String,
    /// The file's name.
    pub(super) file: String,
    /// Its path.
    pub(super) path: PathBuf,
    /// Its size and modification time when seen.
    seen: (u64, SystemTime),
}

/// The watched folder and what the watcher knows of it.
pub(super) struct Folder {
    root: PathBuf,
    /// The posted files that still follow a message.
    pub(super) tracked: Vec<Tracked>,
    /// Each unposted file's size and modification time at the last poll.
    last_seen: HashMap<PathBuf, (u64, SystemTime)>,
}

/// Where a move took a file.
pub(super) enum Moved {
    /// Moved, under this name.
    To(String),
    /// The file was gone (someone moved or deleted it): no longer tracked.
    Gone,
    /// The destination's names are taken: it stays, with a note saying so.
    Blocked(String),
}

impl Folder {
    /// Opens the folder (which must exist) and its state, and finds each
    /// tracked file where it is: where the state says, else one step
    /// further along (a move the last watcher made but did not record);
    /// files no longer found are forgotten.
    pub(super) fn open(root: &Path) -> anyhow::Result<Self> {
        let metadata = std::fs::metadata(root).with_context(|| format!("watching {}", root.display()))?;
        anyhow::ensure!(metadata.is_dir(), "{} is not a folder", root.display());
        let mut folder =
            Self { root: root.to_owned(), tracked: read_state(&root.join(STATE_FILE))?, last_seen: HashMap::new() };
        let mut found = Vec::new();
        for tracked in std::mem::take(&mut folder.tracked) {
            if folder.path_of(&tracked).is_file() {
                found.push(tracked);
                continue;
            }
            let further: &[&str] = match tracked.place {
                Place::Inbox => &[PROCESSED, ARCHIVE],
                Place::Processed => &[ARCHIVE],
            };
            let moved = further.iter().find_map(|folder_name| {
                [tracked.file.clone(), unique_name(&tracked.file, &tracked.message_id)]
                    .into_iter()
                    .find(|name| folder.root.join(&tracked.inbox).join(folder_name).join(name).is_file())
                    .map(|name| (*folder_name, name))
            });
            // Found in processed/: followed there; in archive/ (done with) or gone: no longer.
            if let Some((PROCESSED, file)) = moved {
                found.push(Tracked { file, place: Place::Processed, ..tracked });
            }
        }
        folder.tracked = found;
        folder.save()?;
        Ok(folder)
    }

    /// The path of a tracked file.
    pub(super) fn path_of(&self, tracked: &Tracked) -> PathBuf {
        let inbox = self.root.join(&tracked.inbox);
        match tracked.place {
            Place::Inbox => inbox.join(&tracked.file),
            Place::Processed => inbox.join(PROCESSED).join(&tracked.file),
        }
    }

    /// Writes the state: a new file renamed over the old, so it is whole.
    pub(super) fn save(&self) -> anyhow::Result<()> {
        let tracked: Vec<Value> = self
            .tracked
            .iter()
            .map(|tracked| {
                json!({"inbox": tracked.inbox, "file": tracked.file, "place": tracked.place.name(),
                       "message_id": tracked.message_id})
            })
            .collect();
        let text = serde_json::to_string_pretty(&json!({"version": 1, "tracked": tracked}))?;
        let path = self.root.join(STATE_FILE);
        let partial = self.root.join(format!("{STATE_FILE}.partial"));
        std::fs::write(&partial, text).with_context(|| format!("writing {}", partial.display()))?;
        std::fs::rename(&partial, &path).with_context(|| format!("writing {}", path.display()))
    }

    /// The inbox folders: the subfolders whose names are inbox names.
    pub(super) fn inboxes(&self) -> anyhow::Result<Vec<String>> {
        let mut inboxes = Vec::new();
        for entry in std::fs::read_dir(&self.root).with_context(|| format!("reading {}", self.root.display()))? {
            let entry = entry?;
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else { continue };
            if entry.file_type()?.is_dir() && muster_format::is_identifier(&name) {
                inboxes.push(name);
            }
        }
        inboxes.sort();
        Ok(inboxes)
    }

    /// The files of `inbox` ready to post: not tracked, not hidden, not
    /// notes, not refused since they last changed, and the same size and
    /// modification time as at the last poll (so a file still being
    /// written waits). Every poll calls this for every inbox: what it saw
    /// is what the next poll compares with.
    pub(super) fn ready(&mut self, inbox: &str, seen_now: &mut HashMap<PathBuf, (u64, SystemTime)>) -> Vec<Candidate> {
        let folder = self.root.join(inbox);
        let Ok(entries) = std::fs::read_dir(&folder) else { return Vec::new() };
        let mut ready = Vec::new();
        for entry in entries.flatten() {
            let Some(file) = entry.file_name().to_str().map(str::to_owned) else { continue };
            if file.starts_with('.') || file.ends_with('~') || file.ends_with(ERROR_SUFFIX) {
                continue;
            }
            let tracked = self
                .tracked
                .iter()
                .any(|tracked| tracked.inbox == inbox && tracked.place == Place::Inbox && tracked.file == file);
            let Ok(metadata) = entry.metadata() else { continue };
            if tracked || !metadata.is_file() {
                continue;
            }
            let modified = metadata.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            let path = entry.path();
            if note_is_current(&path, modified) {
                continue;
            }
            let seen = (metadata.len(), modified);
            seen_now.insert(path.clone(), seen);
            if self.last_seen.get(&path) == Some(&seen) {
                ready.push(Candidate { inbox: inbox.to_owned(), file, path, seen });
            }
        }
        ready.sort_by(|left, right| left.file.cmp(&right.file));
        ready
    }

    /// Ends a poll's scan: what it saw is what the next one compares with.
    pub(super) fn seen(&mut self, seen_now: HashMap<PathBuf, (u64, SystemTime)>) {
        self.last_seen = seen_now;
    }

    /// Starts following `message_id` with a posted file; removes an old
    /// note beside it.
    pub(super) fn track(&mut self, candidate: &Candidate, message_id: &str) -> anyhow::Result<()> {
        let _ = std::fs::remove_file(note_path(&candidate.path));
        self.tracked.push(Tracked {
            inbox: candidate.inbox.clone(),
            file: candidate.file.clone(),
            place: Place::Inbox,
            message_id: message_id.to_owned(),
        });
        self.last_seen.remove(&candidate.path);
        self.save()
    }

    /// Moves the tracked file at `index` to `processed/` (it stays tracked)
    /// or `archive/` (it no longer is), and records that.
    pub(super) fn advance(&mut self, index: usize, to: &str) -> anyhow::Result<Moved> {
        let tracked = self.tracked[index].clone();
        let from = self.path_of(&tracked);
        let destination = self.root.join(&tracked.inbox).join(to);
        std::fs::create_dir_all(&destination).with_context(|| format!("creating {}", destination.display()))?;
        let name = [tracked.file.clone(), unique_name(&tracked.file, &tracked.message_id)]
            .into_iter()
            .find(|name| std::fs::symlink_metadata(destination.join(name)).is_err());
        let moved = match name {
            None => {
                let reason = format!(
                    "cannot move it to {to}/: {to}/{} and {to}/{} exist; move one of them away",
                    tracked.file,
                    unique_name(&tracked.file, &tracked.message_id)
                );
                write_note(&from, &reason);
                return Ok(Moved::Blocked(reason));
            }
            Some(name) => match std::fs::rename(&from, destination.join(&name)) {
                Ok(()) => Moved::To(name),
                Err(error) if error.kind() == ErrorKind::NotFound => Moved::Gone,
                Err(error) => return Err(error).with_context(|| format!("moving {}", from.display())),
            },
        };
        let _ = std::fs::remove_file(note_path(&from));
        match (&moved, to) {
            (Moved::To(name), PROCESSED) => {
                self.tracked[index] = Tracked { file: name.clone(), place: Place::Processed, ..tracked };
            }
            _ => {
                self.tracked.remove(index);
            }
        }
        self.save()?;
        Ok(moved)
    }

    /// Leaves a refused file where it is with a note saying why; it is not
    /// tried again until it changes (or the note is removed).
    pub(super) fn refuse(&mut self, candidate: &Candidate, reason: &str) {
        write_note(&candidate.path, reason);
        self.last_seen.remove(&candidate.path);
    }

    /// Whether a candidate changed since the scan that found it ready.
    pub(super) fn changed_since_seen(candidate: &Candidate) -> bool {
        std::fs::metadata(&candidate.path)
            .map(|metadata| (metadata.len(), metadata.modified().unwrap_or(SystemTime::UNIX_EPOCH)) != candidate.seen)
            .unwrap_or(true)
    }
}

/// The name a file takes in `processed/` or `archive/` when its own is
/// taken there: the message id before the extension (`note.<id>.md`).
fn unique_name(file: &str, message_id: &str) -> String {
    match file.rsplit_once('.') {
        Some((stem, extension)) if !stem.is_empty() => format!("{stem}.{message_id}.{extension}"),
        _ => format!("{file}.{message_id}"),
    }
}

fn note_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(ERROR_SUFFIX);
    path.with_file_name(name)
}

/// A note newer than the file (or as new) says the file, as it is, was refused.
fn note_is_current(path: &Path, file_modified: SystemTime) -> bool {
    std::fs::metadata(note_path(path))
        .and_then(|metadata| metadata.modified())
        .is_ok_and(|note_modified| note_modified >= file_modified)
}

fn write_note(path: &Path, reason: &str) {
    let note = note_path(path);
    if let Err(error) = std::fs::write(&note, format!("{reason}\n")) {
        eprintln!("could not write {}: {error}", note.display());
    }
}

fn read_state(path: &Path) -> anyhow::Result<Vec<Tracked>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) if error.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(error).with_context(|| format!("reading {}", path.display())),
    };
    let broken = || format!("{} is not a state file of `muster inbox watch`; move it away", path.display());
    let state: Value = serde_json::from_str(&text).with_context(broken)?;
    let mut tracked = Vec::new();
    for entry in state["tracked"].as_array().with_context(broken)? {
        let field = |name: &str| entry[name].as_str().map(str::to_owned).with_context(broken);
        let place = match field("place")?.as_str() {
            "inbox" => Place::Inbox,
            PROCESSED => Place::Processed,
            _ => anyhow::bail!(broken()),
        };
        tracked.push(Tracked { inbox: field("inbox")?, file: field("file")?, place, message_id: field("message_id")? });
    }
    Ok(tracked)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taken_name_gets_the_message_id_before_its_extension() {
        assert_eq!(unique_name("late.md", "m1"), "late.m1.md");
        assert_eq!(unique_name("notes", "m1"), "notes.m1");
        assert_eq!(unique_name(".hidden", "m1"), ".hidden.m1");
    }

    #[test]
    fn a_move_recorded_or_not_is_found_on_the_next_start() {
        let root = std::env::temp_dir().join(format!("muster-inbox-watch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("risk/processed")).unwrap();
        std::fs::write(root.join("risk/a.md"), "a").unwrap();
        std::fs::write(root.join("risk/processed/b.md"), "b").unwrap();
        let mut folder = Folder::open(&root).unwrap();
        for (file, message_id) in [("a.md", "m1"), ("b.md", "m2"), ("c.md", "m3")] {
            folder.tracked.push(Tracked {
                inbox: "risk".into(),
                file: file.into(),
                place: Place::Inbox,
                message_id: message_id.into(),
            });
        }
        folder.save().unwrap();
        // b.md was moved by a watcher that was killed before it saved; c.md is gone.
        let reopened = Folder::open(&root).unwrap();
        let places: Vec<(&str, Place)> =
            reopened.tracked.iter().map(|tracked| (tracked.file.as_str(), tracked.place)).collect();
        assert_eq!(places, [("a.md", Place::Inbox), ("b.md", Place::Processed)]);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
