//! The workspace the file tools act in: a folder, and every path relative
//! to it. Paths are resolved by the kernel beneath the folder (`openat2`
//! with `RESOLVE_BENEATH`), so `..`, absolute paths and symbolic links that
//! lead out are refused at the moment of use, with no window between a
//! check and the open. A role may narrow what its agents read and write
//! (`read_paths`, `write_paths`); with either set, no symbolic link is
//! followed at all, so a link cannot carry a path out of its area.
//!
//! Errors are sentences the model sees; they name the path it gave and
//! never carry a file's content.

use std::{
    fs::File,
    io::{Read as _, Write as _},
    os::{
        fd::{AsFd, OwnedFd},
        unix::fs::DirBuilderExt as _,
    },
    path::{Path, PathBuf},
    sync::Arc,
};

use rustix::{
    fs::{Mode, OFlags, RenameFlags, ResolveFlags},
    io::Errno,
};
use serde_json::{Value, json};

/// Most bytes `read_file` returns; a longer file is cut there (and says so).
pub const MAX_READ_BYTES: usize = 256 * 1024;
/// Most bytes one `write_file` or `append_file` writes.
pub const MAX_WRITE_BYTES: usize = 1024 * 1024;
/// Most bytes a file may reach by appending.
pub const MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;
/// Most entries `list_files` returns.
pub const MAX_LIST_ENTRIES: usize = 1000;
/// Longest path accepted.
const MAX_PATH_BYTES: usize = 1024;

/// A refusal or failure of a file tool, as the model reads it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FileError(pub String);

/// What a role lets its agents touch: workspace-relative paths (a folder
/// covers everything under it). An empty list does not narrow.
#[derive(Debug, Clone, Copy, Default)]
pub struct Access<'a> {
    /// Where the agent may read (besides where it may write).
    pub read_paths: &'a [String],
    /// Where the agent may write.
    pub write_paths: &'a [String],
}

impl Access<'_> {
    fn narrowed(&self) -> bool {
        !self.read_paths.is_empty() || !self.write_paths.is_empty()
    }

    fn may_read(&self, path: &[&str]) -> bool {
        self.read_paths.is_empty() || covered(path, self.read_paths) || covered(path, self.write_paths)
    }

    fn may_write(&self, path: &[&str]) -> bool {
        self.write_paths.is_empty() || covered(path, self.write_paths)
    }

    fn resolve(&self) -> ResolveFlags {
        let flags = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS;
        if self.narrowed() { flags | ResolveFlags::NO_SYMLINKS } else { flags }
    }
}

/// Whether one of `entries` is `path` or a folder above it.
fn covered(path: &[&str], entries: &[String]) -> bool {
    entries.iter().any(|entry| {
        let entry: Vec<&str> = entry.split('/').filter(|part| !part.is_empty() && *part != ".").collect();
        !entry.is_empty() && path.starts_with(&entry)
    })
}

/// The workspace folder, held open.
#[derive(Debug, Clone)]
pub struct Workspace {
    root: Arc<OwnedFd>,
    path: PathBuf,
}

impl Workspace {
    /// Opens `path`, making it (mode 0700) when it does not exist.
    pub fn open(path: &Path) -> std::io::Result<Self> {
        if !path.exists() {
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(path)?;
        }
        let root = rustix::fs::open(path, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
        Ok(Self { root: Arc::new(root), path: path.to_owned() })
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A file's text, at most [`MAX_READ_BYTES`] of it.
    pub fn read_file(&self, path: &str, access: Access<'_>) -> Result<Value, FileError> {
        let parts = parts(path, false)?;
        if !access.may_read(&parts) {
            return Err(outside_area(path, "read", access.read_paths));
        }
        let file = self.open_file(path, &parts, OFlags::RDONLY, access)?;
        let size = file.metadata().map(|metadata| metadata.len()).unwrap_or(0);
        let mut bytes = Vec::new();
        file.take(MAX_READ_BYTES as u64).read_to_end(&mut bytes).map_err(|error| io_failure(path, &error))?;
        let truncated = size > bytes.len() as u64;
        Ok(json!({
            "path": parts.join("/"),
            "content": String::from_utf8_lossy(&bytes),
            "bytes": size,
            "truncated": truncated,
        }))
    }

    /// Writes (or, with `append`, adds to) a file, making its folders.
    pub fn write_file(&self, path: &str, content: &str, append: bool, access: Access<'_>) -> Result<Value, FileError> {
        let parts = parts(path, false)?;
        if !access.may_write(&parts) {
            return Err(outside_area(path, "write", access.write_paths));
        }
        if content.len() > MAX_WRITE_BYTES {
            return Err(FileError(format!(
                "the content is {} bytes; one write takes at most {MAX_WRITE_BYTES}",
                content.len()
            )));
        }
        let parent = self.folder(&parts[..parts.len() - 1], true, access).map_err(|error| error.about(path))?;
        let mode = if append { OFlags::APPEND } else { OFlags::TRUNC };
        let flags = OFlags::WRONLY | OFlags::CREATE | mode | OFlags::NOCTTY | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let name = parts[parts.len() - 1];
        let fd = rustix::fs::openat2(&parent, name, flags, Mode::from_raw_mode(0o640), access.resolve())
            .map_err(|errno| refusal(path, errno))?;
        let mut file = File::from(fd);
        let metadata = file.metadata().map_err(|error| io_failure(path, &error))?;
        if !metadata.is_file() {
            return Err(FileError(format!("{path} is not a regular file")));
        }
        if append && metadata.len() + content.len() as u64 > MAX_FILE_BYTES {
            return Err(FileError(format!("{path} would grow past {MAX_FILE_BYTES} bytes")));
        }
        file.write_all(content.as_bytes()).map_err(|error| io_failure(path, &error))?;
        let size = file.metadata().map(|metadata| metadata.len()).unwrap_or(0);
        Ok(json!({"path": parts.join("/"), "bytes_written": content.len(), "bytes": size}))
    }

    /// The entries of a folder (the workspace itself for `""` or `.`).
    pub fn list_files(&self, path: &str, access: Access<'_>) -> Result<Value, FileError> {
        let parts = parts(path, true)?;
        if !access.may_read(&parts) {
            return Err(outside_area(path, "read", access.read_paths));
        }
        let folder = self.folder(&parts, false, access).map_err(|error| error.about(path))?;
        let mut entries = Vec::new();
        let directory = rustix::fs::Dir::read_from(&folder).map_err(|errno| refusal(path, errno))?;
        for entry in directory {
            let entry = entry.map_err(|errno| refusal(path, errno))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == "." || name == ".." {
                continue;
            }
            let stat = rustix::fs::statat(&folder, entry.file_name(), rustix::fs::AtFlags::SYMLINK_NOFOLLOW).ok();
            let kind = stat.as_ref().map_or("other", |stat| match rustix::fs::FileType::from_raw_mode(stat.st_mode) {
                rustix::fs::FileType::RegularFile => "file",
                rustix::fs::FileType::Directory => "folder",
                rustix::fs::FileType::Symlink => "link",
                _ => "other",
            });
            let bytes = stat.map_or(0, |stat| u64::try_from(stat.st_size).unwrap_or(0));
            entries.push((name, kind, bytes));
        }
        entries.sort();
        let truncated = entries.len() > MAX_LIST_ENTRIES;
        entries.truncate(MAX_LIST_ENTRIES);
        let entries: Vec<Value> = entries
            .into_iter()
            .map(|(name, kind, bytes)| json!({"name": name, "kind": kind, "bytes": bytes}))
            .collect();
        Ok(json!({"path": parts.join("/"), "entries": entries, "truncated": truncated}))
    }

    /// Moves a file or folder; the target must not exist.
    pub fn move_file(&self, from: &str, to: &str, access: Access<'_>) -> Result<Value, FileError> {
        let (from_parts, to_parts) = (parts(from, false)?, parts(to, false)?);
        for (path, parts) in [(from, &from_parts), (to, &to_parts)] {
            if !access.may_write(parts) {
                return Err(outside_area(path, "write", access.write_paths));
            }
        }
        let from_folder =
            self.folder(&from_parts[..from_parts.len() - 1], false, access).map_err(|error| error.about(from))?;
        let to_folder = self.folder(&to_parts[..to_parts.len() - 1], true, access).map_err(|error| error.about(to))?;
        // The source itself must be reachable under the rules too (not a link out).
        drop(
            rustix::fs::openat2(
                &from_folder,
                from_parts[from_parts.len() - 1],
                OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
                access.resolve(),
            )
            .map_err(|errno| refusal(from, errno))?,
        );
        rustix::fs::renameat_with(
            &from_folder,
            from_parts[from_parts.len() - 1],
            &to_folder,
            to_parts[to_parts.len() - 1],
            RenameFlags::NOREPLACE,
        )
        .map_err(|errno| {
            if errno == Errno::EXIST { FileError(format!("{to} exists already")) } else { refusal(from, errno) }
        })?;
        Ok(json!({"from": from_parts.join("/"), "to": to_parts.join("/")}))
    }

    /// A regular file opened beneath the workspace.
    fn open_file(&self, path: &str, parts: &[&str], flags: OFlags, access: Access<'_>) -> Result<File, FileError> {
        let flags = flags | OFlags::NOCTTY | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let fd = rustix::fs::openat2(self.root.as_fd(), parts.join("/"), flags, Mode::empty(), access.resolve())
            .map_err(|errno| refusal(path, errno))?;
        let file = File::from(fd);
        match file.metadata() {
            Ok(metadata) if metadata.is_file() => Ok(file),
            Ok(metadata) if metadata.is_dir() => Err(FileError(format!("{path} is a folder: use list_files"))),
            Ok(_) => Err(FileError(format!("{path} is not a regular file"))),
            Err(error) => Err(io_failure(path, &error)),
        }
    }

    /// The folder at `parts`, walked one name at a time beneath the
    /// workspace, each made (0750) when missing and `create` is set.
    fn folder(&self, parts: &[&str], create: bool, access: Access<'_>) -> Result<OwnedFd, Refusal> {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let mut folder =
            rustix::fs::openat2(self.root.as_fd(), ".", flags, Mode::empty(), access.resolve()).map_err(Refusal)?;
        for part in parts {
            let next = match rustix::fs::openat2(&folder, *part, flags, Mode::empty(), access.resolve()) {
                Err(Errno::NOENT) if create => {
                    match rustix::fs::mkdirat(&folder, *part, Mode::from_raw_mode(0o750)) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(errno) => return Err(Refusal(errno)),
                    }
                    rustix::fs::openat2(&folder, *part, flags, Mode::empty(), access.resolve())
                }
                other => other,
            };
            folder = next.map_err(Refusal)?;
        }
        Ok(folder)
    }
}

/// An errno met on the way to a path, named once the path is known.
struct Refusal(Errno);

impl Refusal {
    fn about(self, path: &str) -> FileError {
        refusal(path, self.0)
    }
}

/// A path's names, checked: relative, no `..`, no NUL, not too long.
fn parts(path: &str, may_be_root: bool) -> Result<Vec<&str>, FileError> {
    if path.len() > MAX_PATH_BYTES {
        return Err(FileError(format!("the path is {} bytes; at most {MAX_PATH_BYTES}", path.len())));
    }
    if path.contains('\0') {
        return Err(FileError("a path may not hold a NUL character".to_owned()));
    }
    if path.starts_with('/') || path.starts_with('\\') {
        return Err(FileError(format!("{path} is absolute: paths are relative to the workspace")));
    }
    let parts: Vec<&str> = path.split('/').filter(|part| !part.is_empty() && *part != ".").collect();
    if parts.contains(&"..") {
        return Err(FileError(format!("{path} climbs out with '..': paths stay inside the workspace")));
    }
    if parts.is_empty() && !may_be_root {
        return Err(FileError("the path is empty".to_owned()));
    }
    Ok(parts)
}

fn outside_area(path: &str, doing: &str, area: &[String]) -> FileError {
    FileError(format!("this role may not {doing} {path}: it may {doing} only under {}", area.join(", ")))
}

fn refusal(path: &str, errno: Errno) -> FileError {
    let why = match errno {
        Errno::XDEV | Errno::LOOP => "it leads out of the workspace (or through a link this role may not follow)",
        Errno::NOENT => "it does not exist",
        Errno::ISDIR => "it is a folder",
        Errno::NOTDIR => "a part of it is not a folder",
        Errno::ACCESS | Errno::PERM => "permission denied",
        Errno::NOSYS => "this system cannot confine paths (openat2 needs Linux 5.6 or later)",
        _ => return FileError(format!("{path}: {errno}")),
    };
    FileError(format!("{path}: {why}"))
}

fn io_failure(path: &str, error: &std::io::Error) -> FileError {
    FileError(format!("{path}: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Scratch(PathBuf);

    impl Scratch {
        fn new() -> Self {
            let path = std::env::temp_dir().join(format!("muster-workspace-{}", uuid_like()));
            std::fs::create_dir_all(path.join("ws")).unwrap();
            Self(path)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn uuid_like() -> String {
        format!(
            "{}-{:?}",
            std::process::id(),
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
        )
    }

    fn setup() -> (Scratch, Workspace) {
        let scratch = Scratch::new();
        std::fs::write(scratch.0.join("secret.txt"), "TOP SECRET").unwrap();
        std::os::unix::fs::symlink(scratch.0.join("secret.txt"), scratch.0.join("ws/link-out")).unwrap();
        std::os::unix::fs::symlink("..", scratch.0.join("ws/up")).unwrap();
        let workspace = Workspace::open(&scratch.0.join("ws")).unwrap();
        (scratch, workspace)
    }

    #[test]
    fn files_are_written_read_appended_listed_and_moved() {
        let (_scratch, workspace) = setup();
        let all = Access::default();
        workspace.write_file("notes/a.md", "one\n", false, all).unwrap();
        workspace.write_file("notes/a.md", "two\n", true, all).unwrap();
        assert_eq!(workspace.read_file("notes/a.md", all).unwrap()["content"], "one\ntwo\n");
        workspace.move_file("notes/a.md", "done/a.md", all).unwrap();
        let listed = workspace.list_files("done", all).unwrap();
        assert_eq!(listed["entries"][0]["name"], "a.md");
        assert_eq!(listed["entries"][0]["kind"], "file");
        workspace.write_file("notes/b.md", "x", false, all).unwrap();
        assert_eq!(workspace.move_file("notes/b.md", "done/a.md", all).unwrap_err().0, "done/a.md exists already");
        let root = workspace.list_files("", all).unwrap();
        let names: Vec<&str> =
            root["entries"].as_array().unwrap().iter().map(|entry| entry["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["done", "link-out", "notes", "up"]);
    }

    #[test]
    fn nothing_outside_the_workspace_is_reached() {
        let (_scratch, workspace) = setup();
        let all = Access::default();
        for (path, says) in [
            ("../secret.txt", "climbs out"),
            ("/etc/passwd", "absolute"),
            ("link-out", "leads out"),
            ("up/secret.txt", "leads out"),
        ] {
            let error = workspace.read_file(path, all).unwrap_err().0;
            assert!(error.contains(says), "{path}: {error}");
            assert!(!error.contains("TOP SECRET"));
        }
        assert!(workspace.write_file("up/secret.txt", "overwritten", false, all).unwrap_err().0.contains("leads out"));
        assert!(workspace.list_files("up", all).unwrap_err().0.contains("leads out"));
        assert!(workspace.move_file("link-out", "mine", all).is_ok(), "a link itself may move within the workspace");
        assert!(workspace.move_file("mine", "up/stolen", all).unwrap_err().0.contains("leads out"));
    }

    #[test]
    fn a_role_narrows_what_is_read_and_written() {
        let (_scratch, workspace) = setup();
        let all = Access::default();
        workspace.write_file("private/x.md", "private", false, all).unwrap();
        workspace.write_file("project/scope.md", "scope", false, all).unwrap();
        std::os::unix::fs::symlink("../private/x.md", workspace.path().join("project/alias.md")).unwrap();
        let (read, write) = (vec!["project/".to_owned()], vec!["project/traffic-lights".to_owned()]);
        let narrowed = Access { read_paths: &read, write_paths: &write };
        assert_eq!(workspace.read_file("project/scope.md", narrowed).unwrap()["content"], "scope");
        assert!(workspace.read_file("private/x.md", narrowed).unwrap_err().0.contains("may not read"));
        assert!(
            workspace.read_file("project/alias.md", narrowed).unwrap_err().0.contains("link"),
            "no link is followed"
        );
        assert!(
            workspace.write_file("project/scope.md", "x", false, narrowed).unwrap_err().0.contains("may not write")
        );
        workspace.write_file("project/traffic-lights/today.md", "green", false, narrowed).unwrap();
        assert!(workspace.list_files("", narrowed).unwrap_err().0.contains("may not read"));
    }

    #[test]
    fn sizes_are_bounded() {
        let (_scratch, workspace) = setup();
        let all = Access::default();
        let big = "x".repeat(MAX_READ_BYTES + 10);
        workspace.write_file("big", &big, false, all).unwrap();
        let read = workspace.read_file("big", all).unwrap();
        assert_eq!(
            (read["content"].as_str().unwrap().len(), read["truncated"].as_bool()),
            (MAX_READ_BYTES, Some(true))
        );
        assert!(workspace.write_file("huge", &"x".repeat(MAX_WRITE_BYTES + 1), false, all).is_err());
    }
}
