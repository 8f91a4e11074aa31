"""The workspace the model-driven agent's file tools act in: a folder, and every path relative to it.

The Rust agent has the kernel resolve paths beneath the folder (openat2 with RESOLVE_BENEATH); Python
has no openat2, so this walks a path one name at a time from the folder's descriptor, opening each
folder with O_NOFOLLOW | O_DIRECTORY relative to the last (`dir_fd`) and the file itself with
O_NOFOLLOW. `..` and absolute paths are refused; a symbolic link met on the way is read and followed
by the same walk only while it stays inside (an absolute target, or a `..` above the workspace, leads
out and is refused), and not at all when the role narrows its access (`read_paths`, `write_paths`),
as in the Rust agent. Every open is relative to a descriptor already held and never follows a link,
so a link swapped in between the look and the open makes the open fail (ELOOP), not escape.

Accepted races, which only someone else writing into the workspace at the same moment could use:
a folder already opened on the way that another process moves out of the workspace meanwhile is
still used (openat2 would notice the move); `move_file` checks that the target does not exist and
then renames (Python has no renameat2 with RENAME_NOREPLACE), so a target made in between is
replaced.

Errors are sentences the model reads; they name the path it gave and never carry a file's content.
"""

import errno
import os
import stat

MAX_READ_BYTES = 256 * 1024
MAX_WRITE_BYTES = 1024 * 1024
MAX_FILE_BYTES = 16 * 1024 * 1024
MAX_LIST_ENTRIES = 1000
MAX_PATH_BYTES = 1024
# Links followed on one walk, as the kernel's limit.
MAX_LINKS = 40

_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class FileError(Exception):
    """A refusal or failure of a file tool, as the model reads it."""


class _LeadsOut(Exception):
    pass


class Access:
    """What a role lets its agents touch: workspace-relative paths (a folder covers everything
    under it). Empty lists do not narrow."""

    def __init__(self, read_paths=(), write_paths=()):
        self.read_paths = list(read_paths)
        self.write_paths = list(write_paths)

    def narrowed(self):
        return bool(self.read_paths or self.write_paths)

    def may_read(self, parts):
        return not self.read_paths or _covered(parts, self.read_paths) or _covered(parts, self.write_paths)

    def may_write(self, parts):
        return not self.write_paths or _covered(parts, self.write_paths)


def _covered(parts, entries):
    for entry in entries:
        names = [name for name in entry.split("/") if name not in ("", ".")]
        if names and parts[: len(names)] == names:
            return True
    return False


def parts_of(path, may_be_root=False):
    """A path's names, checked: relative, no `..`, no NUL, not too long."""
    if len(path.encode()) > MAX_PATH_BYTES:
        raise FileError(f"the path is {len(path.encode())} bytes; at most {MAX_PATH_BYTES}")
    if "\0" in path:
        raise FileError("a path may not hold a NUL character")
    if path.startswith("/") or path.startswith("\\"):
        raise FileError(f"{path} is absolute: paths are relative to the workspace")
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise FileError(f"{path} climbs out with '..': paths stay inside the workspace")
    if not parts and not may_be_root:
        raise FileError("the path is empty")
    return parts


def _refusal(path, error):
    code = error.errno if isinstance(error, OSError) else None
    why = {
        errno.ELOOP: "it leads out of the workspace (or through a link this role may not follow)",
        errno.EXDEV: "it leads out of the workspace (or through a link this role may not follow)",
        errno.ENOENT: "it does not exist",
        errno.EISDIR: "it is a folder",
        errno.ENOTDIR: "a part of it is not a folder",
        errno.EACCES: "permission denied",
        errno.EPERM: "permission denied",
    }.get(code)
    if isinstance(error, _LeadsOut):
        why = "it leads out of the workspace (or through a link this role may not follow)"
    if why is None:
        return FileError(f"{path}: {os.strerror(code) if code else error}")
    return FileError(f"{path}: {why}")


def _outside_area(path, doing, area):
    return FileError(f"this role may not {doing} {path}: it may {doing} only under {', '.join(area)}")


class _Walk:
    """Folders held open from the workspace down to where a walk stands."""

    def __init__(self, root_fd):
        self.stack = [os.dup(root_fd)]

    @property
    def top(self):
        return self.stack[-1]

    def close(self):
        for fd in self.stack:
            os.close(fd)
        self.stack = []


class Workspace:
    """The workspace folder, held open."""

    def __init__(self, path):
        path = os.fspath(path)
        if not os.path.exists(path):
            os.makedirs(path, mode=0o700)
        self.path = path
        self._root = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def close(self):
        os.close(self._root)

    def _resolve(self, parts, follow, create=False, follow_last=True):
        """Walks `parts` beneath the workspace: the walk holding the last name's folder, and that
        name (None for the workspace itself). Links are followed (while inside) when `follow`;
        missing folders are made (0750) when `create`. The last name is looked at, not opened: the
        caller opens it with O_NOFOLLOW."""
        walk = _Walk(self._root)
        pending = list(parts)
        links = 0
        try:
            while pending:
                name = pending.pop(0)
                last = not pending
                if name == "..":  # only from a link's target
                    if len(walk.stack) == 1:
                        raise _LeadsOut()
                    os.close(walk.stack.pop())
                    continue
                if last:
                    try:
                        info = os.stat(name, dir_fd=walk.top, follow_symlinks=False)
                    except FileNotFoundError:
                        return walk, name
                    if stat.S_ISLNK(info.st_mode) and follow_last:
                        links = self._follow(walk, name, follow, pending, links)
                        continue
                    return walk, name
                try:
                    fd = os.open(name, _FOLDER, dir_fd=walk.top)
                except FileNotFoundError:
                    if not create:
                        raise
                    try:
                        os.mkdir(name, 0o750, dir_fd=walk.top)
                    except FileExistsError:
                        pass
                    fd = os.open(name, _FOLDER, dir_fd=walk.top)
                except OSError as error:
                    if error.errno not in (errno.ELOOP, errno.ENOTDIR):
                        raise
                    info = os.stat(name, dir_fd=walk.top, follow_symlinks=False)
                    if not stat.S_ISLNK(info.st_mode):
                        raise
                    links = self._follow(walk, name, follow, pending, links)
                    continue
                walk.stack.append(fd)
            return walk, None
        except BaseException:
            walk.close()
            raise

    @staticmethod
    def _follow(walk, name, follow, pending, links):
        """Puts a link's target in front of the names still to walk, when it may be followed."""
        if not follow:
            raise _LeadsOut()
        links += 1
        if links > MAX_LINKS:
            raise OSError(errno.ELOOP, "too many links")
        target = os.readlink(name, dir_fd=walk.top)
        if target.startswith("/"):
            raise _LeadsOut()
        pending[:0] = [part for part in target.split("/") if part not in ("", ".")]
        return links

    def _open(self, path, parts, flags, access, mode=0o640, create_folders=False):
        follow = not access.narrowed()
        try:
            walk, name = self._resolve(parts, follow, create=create_folders)
        except (OSError, _LeadsOut) as error:
            raise _refusal(path, error) from None
        try:
            if name is None:
                raise FileError(f"{path} is a folder: use list_files")
            try:
                fd = os.open(name, flags | os.O_NOFOLLOW | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC, mode, dir_fd=walk.top)
            except OSError as error:
                raise _refusal(path, error) from None
        finally:
            walk.close()
        info = os.fstat(fd)
        if stat.S_ISREG(info.st_mode):
            return fd
        os.close(fd)
        if stat.S_ISDIR(info.st_mode):
            raise FileError(f"{path} is a folder: use list_files")
        raise FileError(f"{path} is not a regular file")

    def read_file(self, path, access=Access()):
        parts = parts_of(path)
        if not access.may_read(parts):
            raise _outside_area(path, "read", access.read_paths)
        fd = self._open(path, parts, os.O_RDONLY, access)
        with os.fdopen(fd, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            data = file.read(MAX_READ_BYTES)
        return {
            "path": "/".join(parts),
            "content": data.decode("utf-8", errors="replace"),
            "bytes": size,
            "truncated": size > len(data),
        }

    def write_file(self, path, content, append=False, access=Access()):
        parts = parts_of(path)
        if not access.may_write(parts):
            raise _outside_area(path, "write", access.write_paths)
        data = content.encode()
        if len(data) > MAX_WRITE_BYTES:
            raise FileError(f"the content is {len(data)} bytes; one write takes at most {MAX_WRITE_BYTES}")
        flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else 0)
        fd = self._open(path, parts, flags, access, create_folders=True)
        with os.fdopen(fd, "wb") as file:
            if append and os.fstat(fd).st_size + len(data) > MAX_FILE_BYTES:
                raise FileError(f"{path} would grow past {MAX_FILE_BYTES} bytes")
            if not append:
                # Truncated only once the open file is known to be a regular file inside.
                os.ftruncate(fd, 0)
            file.write(data)
            file.flush()
            size = os.fstat(fd).st_size
        return {"path": "/".join(parts), "bytes_written": len(data), "bytes": size}

    def list_files(self, path, access=Access()):
        parts = parts_of(path, may_be_root=True)
        if not access.may_read(parts):
            raise _outside_area(path, "read", access.read_paths)
        try:
            walk, name = self._resolve(parts, not access.narrowed())
        except (OSError, _LeadsOut) as error:
            raise _refusal(path, error) from None
        try:
            if name is not None:
                try:
                    folder = os.open(name, _FOLDER, dir_fd=walk.top)
                except OSError as error:
                    raise _refusal(path, error) from None
            else:
                folder = os.dup(walk.top)
        finally:
            walk.close()
        try:
            entries = []
            for entry in os.scandir(folder):
                try:
                    info = os.stat(entry.name, dir_fd=folder, follow_symlinks=False)
                    kind = (
                        "file" if stat.S_ISREG(info.st_mode)
                        else "folder" if stat.S_ISDIR(info.st_mode)
                        else "link" if stat.S_ISLNK(info.st_mode)
                        else "other"
                    )
                    size = info.st_size
                except OSError:
                    kind, size = "other", 0
                entries.append((entry.name, kind, size))
        finally:
            os.close(folder)
        entries.sort()
        return {
            "path": "/".join(parts),
            "entries": [{"name": name, "kind": kind, "bytes": size} for name, kind, size in entries[:MAX_LIST_ENTRIES]],
            "truncated": len(entries) > MAX_LIST_ENTRIES,
        }

    def move_file(self, source, target, access=Access()):
        from_parts, to_parts = parts_of(source), parts_of(target)
        for path, parts in ((source, from_parts), (target, to_parts)):
            if not access.may_write(parts):
                raise _outside_area(path, "write", access.write_paths)
        follow = not access.narrowed()
        # The source's folder is walked as any path; the source itself is moved, not followed.
        try:
            from_walk, from_name = self._resolve(from_parts, follow, follow_last=False)
        except (OSError, _LeadsOut) as error:
            raise _refusal(source, error) from None
        try:
            try:
                to_walk, to_name = self._resolve(to_parts, follow, create=True, follow_last=False)
            except (OSError, _LeadsOut) as error:
                raise _refusal(target, error) from None
            try:
                try:
                    os.stat(from_name, dir_fd=from_walk.top, follow_symlinks=False)
                except OSError as error:
                    raise _refusal(source, error) from None
                try:
                    os.stat(to_name, dir_fd=to_walk.top, follow_symlinks=False)
                    raise FileError(f"{target} exists already")
                except FileNotFoundError:
                    pass
                try:
                    os.rename(from_name, to_name, src_dir_fd=from_walk.top, dst_dir_fd=to_walk.top)
                except OSError as error:
                    raise _refusal(source, error) from None
            finally:
                to_walk.close()
        finally:
            from_walk.close()
        return {"from": "/".join(from_parts), "to": "/".join(to_parts)}
