//! Files that hold secrets, and the data at rest of a service: everything
//! a service writes is its owner's alone (folders 0700, files 0600),
//! whatever the umask it was started with.

use std::{io::Write as _, path::Path};

/// The mode of every folder a service makes or keeps.
pub const PRIVATE_FOLDER: u32 = 0o700;
/// The mode of every file a service makes or keeps.
pub const PRIVATE_FILE: u32 = 0o600;

/// Makes every file and folder this process creates from now on its
/// owner's alone (umask 0o077), whatever umask it inherited: the SQLite
/// files and their `-wal` and `-shm`, which SQLite creates with 0644 less
/// the umask, and everything else a service writes. Called first thing by
/// [`crate::process::serve`].
pub fn private_umask() {
    #[cfg(unix)]
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
}

/// Narrows `path` to its owner, when it exists: a folder to 0700 and
/// everything beneath it (folders 0700, files 0600), a file to 0600.
/// For data written before the services made it private; symbolic links
/// are left alone (their mode means nothing, and their target may be
/// another's).
pub fn make_private(path: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let metadata = match std::fs::symlink_metadata(path) {
            Ok(metadata) => metadata,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(error) => return Err(error),
        };
        let wanted = if metadata.is_dir() {
            PRIVATE_FOLDER
        } else if metadata.is_file() {
            PRIVATE_FILE
        } else {
            return Ok(());
        };
        if metadata.permissions().mode() & 0o777 != wanted {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(wanted))?;
        }
        if metadata.is_dir() {
            for entry in std::fs::read_dir(path)? {
                make_private(&entry?.path())?;
            }
        }
    }
    Ok(())
}

/// Writes `contents` to `path` readable and writable by its owner only (mode
/// 0600), replacing it atomically: the file is never seen half-written or
/// with wider permissions.
pub fn write_private(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    let mut temporary_name = path.file_name().unwrap_or_default().to_os_string();
    temporary_name.push(format!(".{}.tmp", std::process::id()));
    let temporary = path.with_file_name(temporary_name);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let written = (|| {
        let mut file = options.open(&temporary)?;
        file.write_all(contents)?;
        file.sync_all()?;
        std::fs::rename(&temporary, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written
}

#[cfg(test)]
mod tests {
    #[test]
    #[cfg(unix)]
    fn private_files_are_mode_0600() {
        use std::os::unix::fs::PermissionsExt as _;
        let path = std::env::temp_dir().join(format!("muster-private-{}", std::process::id()));
        super::write_private(&path, b"secret").unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(std::fs::read(&path).unwrap(), b"secret");
        std::fs::remove_file(&path).unwrap();
        assert_eq!(mode, 0o600);
    }

    #[test]
    #[cfg(unix)]
    fn data_written_before_is_narrowed_to_its_owner() {
        use std::os::unix::fs::PermissionsExt as _;
        let root = std::env::temp_dir().join(format!("muster-narrowed-{}", std::process::id()));
        let nested = root.join("agents").join("a");
        std::fs::create_dir_all(&nested).unwrap();
        std::fs::write(nested.join("events.ndjson"), b"{}").unwrap();
        std::fs::write(root.join("x.db"), b"").unwrap();
        for (path, mode) in [(&root, 0o755), (&nested, 0o775)] {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        std::fs::set_permissions(root.join("x.db"), std::fs::Permissions::from_mode(0o644)).unwrap();
        super::make_private(&root).unwrap();
        super::make_private(&root.join("missing")).unwrap();
        let mode = |path: &std::path::Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        let modes = [mode(&root), mode(&nested), mode(&nested.join("events.ndjson")), mode(&root.join("x.db"))];
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(modes, [0o700, 0o700, 0o600, 0o600]);
    }
}
