// The workspace the model-driven agent's file tools act in: a folder, and every path relative to it.
//
// The Rust agent has the kernel resolve paths beneath the folder (openat2 with RESOLVE_BENEATH).
// Node has neither openat2 nor descriptor-relative opens, so a path is walked here one name at a
// time (lstat each; a symbolic link is read and its target walked the same way, while it stays
// inside — an absolute target or a `..` above the workspace leads out — and no link is followed
// at all when the role narrows its access with read_paths/write_paths, as in the Rust agent). The
// file or folder is then opened with O_NOFOLLOW, and the opened handle is checked: its real path
// (the kernel's, /proc/self/fd/N) must be the one walked, inside the workspace. What is read,
// written or listed is always that checked handle, so a link swapped in after the walk makes the
// check fail instead of reading or writing outside; a write truncates only after the check.
//
// Accepted races, which only someone else writing into the workspace at the same moment could
// use: a folder made for a write (mkdir) or a file created by the open (O_CREAT) may be made empty
// outside before the check refuses it; `move_file` checks both folders and then renames by path
// (Node has no renameat2), so a folder swapped in between could move a file out, and a target made
// in between is replaced.
//
// Errors are sentences the model reads; they name the path it gave and never carry a file's content.

import * as fs from "node:fs";
import * as path from "node:path";

export const MAX_READ_BYTES = 256 * 1024;
export const MAX_WRITE_BYTES = 1024 * 1024;
export const MAX_FILE_BYTES = 16 * 1024 * 1024;
export const MAX_LIST_ENTRIES = 1000;
const MAX_PATH_BYTES = 1024;
const MAX_LINKS = 40;
const LEADS_OUT = "it leads out of the workspace (or through a link this role may not follow)";

/** A refusal or failure of a file tool, as the model reads it. */
export class FileError extends Error {}

/** What a role lets its agents touch: workspace-relative paths (a folder covers everything under it). */
export interface Access {
  readPaths: string[];
  writePaths: string[];
}

export const ALL: Access = { readPaths: [], writePaths: [] };

const narrowed = (access: Access) => access.readPaths.length > 0 || access.writePaths.length > 0;

function covered(parts: string[], entries: string[]): boolean {
  return entries.some((entry) => {
    const names = entry.split("/").filter((name) => name !== "" && name !== ".");
    return names.length > 0 && names.every((name, index) => parts[index] === name);
  });
}

const mayRead = (access: Access, parts: string[]) =>
  access.readPaths.length === 0 || covered(parts, access.readPaths) || covered(parts, access.writePaths);
const mayWrite = (access: Access, parts: string[]) => access.writePaths.length === 0 || covered(parts, access.writePaths);

/** A path's names, checked: relative, no `..`, no NUL, not too long. */
export function partsOf(given: string, mayBeRoot = false): string[] {
  if (Buffer.byteLength(given) > MAX_PATH_BYTES) {
    throw new FileError(`the path is ${Buffer.byteLength(given)} bytes; at most ${MAX_PATH_BYTES}`);
  }
  if (given.includes("\0")) throw new FileError("a path may not hold a NUL character");
  if (given.startsWith("/") || given.startsWith("\\")) {
    throw new FileError(`${given} is absolute: paths are relative to the workspace`);
  }
  const parts = given.split("/").filter((part) => part !== "" && part !== ".");
  if (parts.includes("..")) throw new FileError(`${given} climbs out with '..': paths stay inside the workspace`);
  if (parts.length === 0 && !mayBeRoot) throw new FileError("the path is empty");
  return parts;
}

class LeadsOut extends Error {}

function refusal(given: string, error: unknown): FileError {
  if (error instanceof FileError) return error;
  if (error instanceof LeadsOut) return new FileError(`${given}: ${LEADS_OUT}`);
  const code = (error as NodeJS.ErrnoException).code;
  const why: Record<string, string> = {
    ELOOP: LEADS_OUT,
    EXDEV: LEADS_OUT,
    ENOENT: "it does not exist",
    EISDIR: "it is a folder",
    ENOTDIR: "a part of it is not a folder",
    EACCES: "permission denied",
    EPERM: "permission denied",
  };
  return new FileError(`${given}: ${(code && why[code]) ?? String((error as Error).message ?? error)}`);
}

const outsideArea = (given: string, doing: string, area: string[]) =>
  new FileError(`this role may not ${doing} ${given}: it may ${doing} only under ${area.join(", ")}`);

const isMissing = (error: unknown) => (error as NodeJS.ErrnoException).code === "ENOENT";

export class Workspace {
  /** The folder's real path. */
  readonly root: string;

  constructor(folder: string) {
    fs.mkdirSync(folder, { recursive: true, mode: 0o700 });
    this.root = fs.realpathSync(folder);
  }

  /**
   * Walks `parts` beneath the workspace: the real names of the last one's folder, and the last name
   * (undefined for the workspace itself). Links are followed while inside when `follow`; missing
   * folders are made (0750) when `create`; the last name is looked at, not opened.
   */
  private resolve(parts: string[], follow: boolean, create = false, followLast = true): { folder: string[]; name?: string } {
    const folder: string[] = [];
    const pending = [...parts];
    let links = 0;
    while (pending.length > 0) {
      const name = pending.shift()!;
      if (name === "..") {
        if (folder.length === 0) throw new LeadsOut();
        folder.pop();
        continue;
      }
      const here = path.join(this.root, ...folder, name);
      let info: fs.Stats | undefined;
      try {
        info = fs.lstatSync(here);
      } catch (error) {
        if (!isMissing(error)) throw error;
      }
      if (info?.isSymbolicLink() && (pending.length > 0 || followLast)) {
        if (!follow) throw new LeadsOut();
        if (++links > MAX_LINKS) throw Object.assign(new Error("too many links"), { code: "ELOOP" });
        const target = fs.readlinkSync(here);
        if (target.startsWith("/")) throw new LeadsOut();
        pending.unshift(...target.split("/").filter((part) => part !== "" && part !== "."));
        continue;
      }
      if (pending.length === 0) return { folder, name };
      if (!info) {
        if (!create) throw Object.assign(new Error("missing"), { code: "ENOENT" });
        try {
          fs.mkdirSync(here, { mode: 0o750 });
        } catch (error) {
          if ((error as NodeJS.ErrnoException).code !== "EEXIST") throw error;
        }
      } else if (!info.isDirectory()) {
        throw Object.assign(new Error("not a folder"), { code: "ENOTDIR" });
      }
      folder.push(name);
    }
    return { folder };
  }

  /** Opens the walked path with O_NOFOLLOW and checks that the handle is that path, inside. */
  private openChecked(given: string, real: string, flags: number, mode = 0o640): number {
    let fd: number;
    try {
      fd = fs.openSync(real, flags | fs.constants.O_NOFOLLOW | fs.constants.O_NONBLOCK | fs.constants.O_NOCTTY, mode);
    } catch (error) {
      throw refusal(given, error);
    }
    let opened = "";
    try {
      opened = fs.readlinkSync(`/proc/self/fd/${fd}`);
    } catch {
      // No /proc: the walk's checks stand alone.
      opened = real;
    }
    if (opened !== real || !(opened === this.root || opened.startsWith(this.root + path.sep))) {
      fs.closeSync(fd);
      throw new FileError(`${given}: ${LEADS_OUT}`);
    }
    return fd;
  }

  private file(given: string, parts: string[], access: Access, flags: number, createFolders = false): number {
    let walked: { folder: string[]; name?: string };
    try {
      walked = this.resolve(parts, !narrowed(access), createFolders);
    } catch (error) {
      throw refusal(given, error);
    }
    if (walked.name === undefined) throw new FileError(`${given} is a folder: use list_files`);
    const fd = this.openChecked(given, path.join(this.root, ...walked.folder, walked.name), flags);
    const info = fs.fstatSync(fd);
    if (info.isFile()) return fd;
    fs.closeSync(fd);
    throw new FileError(info.isDirectory() ? `${given} is a folder: use list_files` : `${given} is not a regular file`);
  }

  readFile(given: string, access: Access = ALL) {
    const parts = partsOf(given);
    if (!mayRead(access, parts)) throw outsideArea(given, "read", access.readPaths);
    const fd = this.file(given, parts, access, fs.constants.O_RDONLY);
    try {
      const size = fs.fstatSync(fd).size;
      const buffer = Buffer.alloc(Math.min(size, MAX_READ_BYTES));
      let read = 0;
      while (read < buffer.length) {
        const count = fs.readSync(fd, buffer, read, buffer.length - read, null);
        if (count === 0) break;
        read += count;
      }
      return { path: parts.join("/"), content: buffer.subarray(0, read).toString("utf8"), bytes: size, truncated: size > read };
    } finally {
      fs.closeSync(fd);
    }
  }

  writeFile(given: string, content: string, append: boolean, access: Access = ALL) {
    const parts = partsOf(given);
    if (!mayWrite(access, parts)) throw outsideArea(given, "write", access.writePaths);
    const data = Buffer.from(content, "utf8");
    if (data.length > MAX_WRITE_BYTES) {
      throw new FileError(`the content is ${data.length} bytes; one write takes at most ${MAX_WRITE_BYTES}`);
    }
    const flags = fs.constants.O_WRONLY | fs.constants.O_CREAT | (append ? fs.constants.O_APPEND : 0);
    const fd = this.file(given, parts, access, flags, true);
    try {
      if (append && fs.fstatSync(fd).size + data.length > MAX_FILE_BYTES) {
        throw new FileError(`${given} would grow past ${MAX_FILE_BYTES} bytes`);
      }
      // Truncated only once the open file is known to be a regular file inside.
      if (!append) fs.ftruncateSync(fd, 0);
      fs.writeSync(fd, data);
      return { path: parts.join("/"), bytes_written: data.length, bytes: fs.fstatSync(fd).size };
    } finally {
      fs.closeSync(fd);
    }
  }

  listFiles(given: string, access: Access = ALL) {
    const parts = partsOf(given, true);
    if (!mayRead(access, parts)) throw outsideArea(given, "read", access.readPaths);
    let walked: { folder: string[]; name?: string };
    try {
      walked = this.resolve(parts, !narrowed(access));
    } catch (error) {
      throw refusal(given, error);
    }
    const names = walked.name === undefined ? walked.folder : [...walked.folder, walked.name];
    const fd = this.openChecked(given, path.join(this.root, ...names), fs.constants.O_RDONLY | fs.constants.O_DIRECTORY);
    try {
      // Listed through the checked handle itself.
      const handle = `/proc/self/fd/${fd}`;
      const listed = fs.existsSync(handle) ? handle : path.join(this.root, ...names);
      const entries = fs.readdirSync(listed).map((name) => {
        try {
          const info = fs.lstatSync(path.join(listed, name));
          const kind = info.isFile() ? "file" : info.isDirectory() ? "folder" : info.isSymbolicLink() ? "link" : "other";
          return { name, kind, bytes: info.size };
        } catch {
          return { name, kind: "other", bytes: 0 };
        }
      });
      entries.sort((left, right) => (left.name < right.name ? -1 : left.name > right.name ? 1 : 0));
      return { path: parts.join("/"), entries: entries.slice(0, MAX_LIST_ENTRIES), truncated: entries.length > MAX_LIST_ENTRIES };
    } finally {
      fs.closeSync(fd);
    }
  }

  moveFile(from: string, to: string, access: Access = ALL) {
    const fromParts = partsOf(from);
    const toParts = partsOf(to);
    for (const [given, parts] of [[from, fromParts], [to, toParts]] as const) {
      if (!mayWrite(access, parts)) throw outsideArea(given, "write", access.writePaths);
    }
    const follow = !narrowed(access);
    let source: { folder: string[]; name?: string };
    let target: { folder: string[]; name?: string };
    try {
      source = this.resolve(fromParts, follow, false, false);
    } catch (error) {
      throw refusal(from, error);
    }
    try {
      target = this.resolve(toParts, follow, true, false);
    } catch (error) {
      throw refusal(to, error);
    }
    for (const [given, walked] of [[from, source], [to, target]] as const) {
      const folder = path.join(this.root, ...walked.folder);
      fs.closeSync(this.openChecked(given, folder, fs.constants.O_RDONLY | fs.constants.O_DIRECTORY));
    }
    const sourcePath = path.join(this.root, ...source.folder, source.name!);
    const targetPath = path.join(this.root, ...target.folder, target.name!);
    try {
      fs.lstatSync(sourcePath);
    } catch (error) {
      throw refusal(from, error);
    }
    let exists = true;
    try {
      fs.lstatSync(targetPath);
    } catch {
      exists = false;
    }
    if (exists) throw new FileError(`${to} exists already`);
    try {
      fs.renameSync(sourcePath, targetPath);
    } catch (error) {
      throw refusal(from, error);
    }
    return { from: fromParts.join("/"), to: toParts.join("/") };
  }
}
