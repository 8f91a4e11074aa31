//! Files that hold secrets.

use std::{io::Write as _, path::Path};

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
}
