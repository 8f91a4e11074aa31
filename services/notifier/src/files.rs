//! The NDJSON memory files on disk, written exactly once per notification.
//!
//! The scheme (see docs/notifier.md):
//! 1. The ingest transaction stores the notifications as *pending* together
//!    with, for every file about to be appended, its length before the append.
//! 2. After the commit, the lines are appended, one write per file, and
//!    fsync'd; then one small transaction advances the *written-through* mark
//!    past the batch, records each file's length after the append, and marks
//!    lines whose append failed as *failed*.
//! 3. At start, pending notifications above the mark (a crash between 1 and 2)
//!    are rewritten: each of their files is first cut back to its recorded
//!    length, which removes whatever part of the batch reached the disk, then
//!    their lines are appended. Failed ones are appended again.
//!
//! One process writes a memory root at a time, and appends one batch after
//! the other. The next batch may be stored (step 1) while the previous one
//! is in step 2: it leaves the recorded length of a file the previous batch
//! appends to as it is, so at most two batches are unconfirmed, and a cut
//! back removes both batches' lines, which step 3 rewrites in cursor order.

use std::{
    collections::{BTreeMap, HashSet},
    fs::{File, OpenOptions},
    io::Write as _,
    path::{Path, PathBuf},
};

use crate::{
    Error, Result,
    domain::memory::{ndjson_line, relative_file_path, utc_day},
    grpc::decode_event,
    store::{MemoryProgress, MemoryState, Store},
};

/// How many threads append to memory files at once.
const APPENDING_THREADS: usize = 4;

/// The lines to append to one file.
#[derive(Debug, Default)]
pub(crate) struct FileAppend {
    /// Relative to the memory root, `/`-separated.
    pub(crate) path: String,
    /// The notifications whose lines these are.
    pub(crate) cursors: Vec<u64>,
    /// The lines, each ending with a newline.
    pub(crate) text: String,
}

/// The memory root.
#[derive(Debug, Clone)]
pub(crate) struct MemoryFiles {
    root: PathBuf,
}

impl MemoryFiles {
    pub(crate) fn new(root: PathBuf) -> Self {
        Self { root }
    }

    /// The folder beneath which every memory file is.
    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    fn absolute(&self, relative: &str) -> PathBuf {
        relative.split('/').fold(self.root.clone(), |path, component| path.join(component))
    }

    /// The current length of each file (0 when missing), `None` for a file
    /// that cannot be examined, so no cut-back length is recorded for it.
    /// Blocking.
    pub(crate) fn lengths(&self, paths: impl IntoIterator<Item = String>) -> Vec<(String, Option<u64>)> {
        paths
            .into_iter()
            .map(|path| match std::fs::metadata(self.absolute(&path)) {
                Ok(metadata) => (path, Some(metadata.len())),
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => (path, Some(0)),
                Err(error) => {
                    tracing::warn!(path = %path, %error, "cannot examine a memory file");
                    (path, None)
                }
            })
            .collect()
    }

    /// Appends each group with one write and an fsync. Returns the cursors of
    /// the groups that failed (a failed file is cut back to its length
    /// before) and the length of every other file after its append.
    /// Blocking. Many files are appended by [`APPENDING_THREADS`] threads
    /// at once: most of an append is waiting for its fsync, and the disk
    /// takes several at a time.
    pub(crate) fn append_all(&self, appends: &[FileAppend]) -> Appended {
        let append_some = |appends: &[FileAppend]| {
            let mut appended = Appended::default();
            for append in appends {
                let path = self.absolute(&append.path);
                match append_and_sync(&path, append.text.as_bytes()) {
                    Ok(length) => appended.lengths.push((append.path.clone(), length)),
                    Err(error) => {
                        tracing::error!(path = %path.display(), %error, lines = append.cursors.len(), "appending memory lines failed");
                        appended.failed.extend_from_slice(&append.cursors);
                    }
                }
            }
            appended
        };
        if appends.len() < 2 * APPENDING_THREADS {
            return append_some(appends);
        }
        let share = appends.len().div_ceil(APPENDING_THREADS);
        std::thread::scope(|scope| {
            let others: Vec<_> =
                appends[share..].chunks(share).map(|appends| scope.spawn(move || append_some(appends))).collect();
            let mut appended = append_some(&appends[..share]);
            for (other, appends) in others.into_iter().zip(appends[share..].chunks(share)) {
                match other.join() {
                    Ok(more) => {
                        appended.failed.extend(more.failed);
                        appended.lengths.extend(more.lengths);
                    }
                    // A thread that panicked: its files count as failed (cut back and rewritten at start).
                    Err(_) => appended.failed.extend(appends.iter().flat_map(|append| append.cursors.iter().copied())),
                }
            }
            appended
        })
    }

    /// Writes the first half of an append and stops (the torn-append failpoint).
    pub(crate) fn append_torn(&self, append: &FileAppend) {
        // One byte past the middle, so the write ends inside a line.
        let torn_length = (append.text.len() / 2 + 1).min(append.text.len());
        let half = &append.text.as_bytes()[..torn_length];
        if let Err(error) = append_and_sync(&self.absolute(&append.path), half) {
            tracing::error!(%error, "torn append failed");
        }
    }

    /// Cuts a file back to `length` if it is longer. Blocking.
    fn cut_back(&self, relative: &str, length: u64) -> Result<()> {
        let path = self.absolute(relative);
        let io_error = |source| Error::Io { context: format!("cutting back {}", path.display()), source };
        match OpenOptions::new().write(true).open(&path) {
            Ok(file) => {
                if file.metadata().map_err(io_error)?.len() > length {
                    tracing::warn!(path = %path.display(), length, "removing an unconfirmed memory append");
                    file.set_len(length).map_err(io_error)?;
                    file.sync_all().map_err(io_error)?;
                }
                Ok(())
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(error) => Err(io_error(error)),
        }
    }
}

/// What [`MemoryFiles::append_all`] did.
#[derive(Debug, Default)]
pub(crate) struct Appended {
    /// The cursors of the lines not written.
    pub(crate) failed: Vec<u64>,
    /// Each file written, relative to the memory root, with its length after.
    pub(crate) lengths: Vec<(String, u64)>,
}

/// Appends `bytes` and syncs; on failure, cuts the file back to its length
/// before the write so no partial line stays behind. Returns the length after.
fn append_and_sync(path: &Path, bytes: &[u8]) -> std::io::Result<u64> {
    let parent = path.parent().unwrap_or(Path::new("."));
    // The memory is its owner's alone (folders 0700, files 0600), whatever the umask.
    let mut folders = std::fs::DirBuilder::new();
    std::os::unix::fs::DirBuilderExt::mode(folders.recursive(true), muster_runtime::files::PRIVATE_FOLDER);
    folders.create(parent)?;
    let existed = path.exists();
    let mut options = OpenOptions::new();
    std::os::unix::fs::OpenOptionsExt::mode(options.create(true).append(true), muster_runtime::files::PRIVATE_FILE);
    let mut file = options.open(path)?;
    let length_before = file.metadata()?.len();
    let written = file.write_all(bytes).and_then(|()| file.sync_data());
    if let Err(error) = written {
        if let Err(cut_error) = file.set_len(length_before).and_then(|()| file.sync_all()) {
            tracing::error!(path = %path.display(), error = %cut_error, "cutting back a failed memory append failed");
        }
        return Err(error);
    }
    if !existed {
        // Make the new directory entry durable too.
        File::open(parent)?.sync_all()?;
    }
    Ok(length_before + bytes.len() as u64)
}

/// Groups pending lines (path, cursor, line) by file, keeping cursor order
/// within each file.
pub(crate) fn group_by_file<'a>(lines: impl IntoIterator<Item = (&'a str, u64, &'a str)>) -> Vec<FileAppend> {
    let mut groups: BTreeMap<&str, FileAppend> = BTreeMap::new();
    for (path, cursor, line) in lines {
        let group = groups.entry(path).or_insert_with(|| FileAppend { path: path.to_owned(), ..FileAppend::default() });
        group.cursors.push(cursor);
        group.text.push_str(line);
    }
    groups.into_values().collect()
}

/// Rewrites the lines a crash or a failed append left unwritten (step 3 of the
/// scheme). Runs before ingestion starts.
pub(crate) async fn recover<S: Store>(store: &S, files: &MemoryFiles) -> Result<()> {
    const PAGE: u32 = 10_000;
    let mut after = 0;
    // Cut each file back once: a later page may append to a file an earlier one did.
    let mut already_cut: HashSet<String> = HashSet::new();
    loop {
        let page = store.unwritten_memory(after, PAGE).await?;
        let Some(last) = page.last() else { return Ok(()) };
        after = last.cursor;
        let mut progress = MemoryProgress::default();
        let mut lines = Vec::with_capacity(page.len());
        let mut cut_back_paths = Vec::new();
        for notification in &page {
            let (_, event) = decode_event(&notification.encoded)?;
            let path = relative_file_path(&notification.agent_id, &utc_day(event.occurred_at));
            match notification.memory {
                MemoryState::Failed => progress.recovered.push(notification.cursor),
                _ => {
                    progress.written_through = progress.written_through.max(notification.cursor);
                    cut_back_paths.push(path.clone());
                }
            }
            lines.push((path, notification.cursor, ndjson_line(&event, &notification.output_summary)));
        }
        cut_back_paths.retain(|path| already_cut.insert(path.clone()));
        for path in &cut_back_paths {
            if let Some(length) = store.memory_file_length(path).await? {
                let files = files.clone();
                let path = path.clone();
                tokio::task::spawn_blocking(move || files.cut_back(&path, length))
                    .await
                    .map_err(|error| Error::Corrupt(format!("memory task: {error}")))??;
            }
        }
        let appends = group_by_file(lines.iter().map(|(path, cursor, line)| (path.as_str(), *cursor, line.as_str())));
        let count = page.len();
        let files = files.clone();
        let failed = tokio::task::spawn_blocking(move || files.append_all(&appends))
            .await
            .map_err(|error| Error::Corrupt(format!("memory task: {error}")))?
            .failed;
        progress.recovered.retain(|cursor| !failed.contains(cursor));
        progress.failed = failed;
        store.record_memory_progress(&progress).await?;
        tracing::info!(lines = count, failed = progress.failed.len(), "recovered unwritten memory lines");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Many files are appended by several threads: every line lands in its
    /// file, in order, and only the files that could not be written count
    /// as failed.
    #[test]
    fn many_files_are_appended_at_once_and_failures_stay_with_their_files() {
        let root = std::env::temp_dir().join(format!("muster-notifier-memory-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&root).unwrap();
        // A file where a folder should be: appends below it fail.
        std::fs::write(root.join("blocked"), "not a folder").unwrap();
        let mut appends: Vec<FileAppend> = (0..40u64)
            .map(|agent| FileAppend {
                path: format!("agent-{agent}/2026-11-26.ndjson"),
                cursors: vec![agent * 10, agent * 10 + 1],
                text: format!("{{\"line\":1,\"agent\":{agent}}}\n{{\"line\":2,\"agent\":{agent}}}\n"),
            })
            .collect();
        appends.insert(
            17,
            FileAppend { path: "blocked/2026-11-26.ndjson".into(), cursors: vec![999], text: "x\n".into() },
        );
        let files = MemoryFiles::new(root.clone());
        let appended = files.append_all(&appends);
        let again = files.append_all(&appends[..1]);
        let contents: Vec<String> = (0..40)
            .map(|agent| std::fs::read_to_string(root.join(format!("agent-{agent}/2026-11-26.ndjson"))).unwrap())
            .collect();
        muster_runtime::testing::remove_folder(&root);
        assert_eq!(appended.failed, [999]);
        assert!(again.failed.is_empty());
        let mut lengths = appended.lengths;
        lengths.sort();
        let mut expected: Vec<(String, u64)> = appends
            .iter()
            .filter(|append| append.cursors != [999])
            .map(|append| (append.path.clone(), append.text.len() as u64))
            .collect();
        expected.sort();
        assert_eq!(lengths, expected, "each file written, with its length after");
        assert_eq!(again.lengths, [(appends[0].path.clone(), 2 * appends[0].text.len() as u64)]);
        assert_eq!(contents[0], format!("{}{}", appends[0].text, appends[0].text), "appended, not replaced");
        for (agent, content) in contents.iter().enumerate().skip(1) {
            assert_eq!(content, &format!("{{\"line\":1,\"agent\":{agent}}}\n{{\"line\":2,\"agent\":{agent}}}\n"));
        }
    }
}
