//! Files and directories where someone else may write (docs/architecture.md, "Servers and
//! files"): private temporary directories from `mkdtemp`, paths walked one directory at a
//! time with `openat`, and files opened `O_NOFOLLOW|O_NONBLOCK` and checked with `fstat`
//! before anything is read from or written to them.
//!
//! The walk's rule, for every directory it passes: if others may write it, it must be
//! sticky (as /tmp is); if others may write it or it is another user's, the next component
//! must be root's or this user's and not a symbolic link. A link is followed only
//! inside a directory nobody else can write. Whatever is opened is checked by its
//! descriptor, so swapping a name after it was looked at changes nothing.

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path, PathBuf};

use super::cvt;
use crate::user::euid;

/// Links a walk follows at most (the kernel's own limit for one lookup).
const MAX_LINKS: usize = 40;

/// Why a path was refused.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// A name on the way could be swapped by someone else.
    #[error(
        "{path} is a symbolic link in a directory others can write; give a path without it (its target, if that is what is meant)"
    )]
    LinkInShared {
        /// The link.
        path: PathBuf,
    },
    /// The last component is a symbolic link.
    #[error("{path} is a symbolic link; sluice does not write through one: give the file's own path")]
    Link {
        /// The link.
        path: PathBuf,
    },
    /// Too many links.
    #[error("{path}: more than {MAX_LINKS} symbolic links on the way")]
    Loop {
        /// The path.
        path: PathBuf,
    },
    /// Something else's.
    #[error(
        "{path} belongs to uid {uid}, neither root nor this user (uid {me}): someone else could change it; choose a path only root or uid {me} can write"
    )]
    Owner {
        /// The file or directory.
        path: PathBuf,
        /// Its owner.
        uid: u32,
        /// This process's effective user.
        me: u32,
    },
    /// A directory others may write that is not sticky.
    #[error(
        "the directory {path} can be written by others (mode {mode:04o}) and is not sticky: anyone could swap what is in it; choose a directory only root or this user can write"
    )]
    OpenDir {
        /// The directory.
        path: PathBuf,
        /// Its mode bits.
        mode: u32,
    },
    /// Not a directory where one is needed.
    #[error("{path} is {what}, not a directory")]
    NotDir {
        /// The path.
        path: PathBuf,
        /// What it is.
        what: &'static str,
    },
    /// Not a regular file.
    #[error("{path} is {what}, not a regular file; give the path of a regular file (or of none, to create it)")]
    NotRegular {
        /// The path.
        path: PathBuf,
        /// What it is.
        what: &'static str,
    },
    /// A second name of someone's file.
    #[error(
        "{path} has {links} names (a hard link) in a directory others can write; remove it, or choose another name"
    )]
    HardLink {
        /// The file.
        path: PathBuf,
        /// Its link count.
        links: libc::nlink_t,
    },
    /// A system call failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// On which path.
        path: PathBuf,
        /// Why it failed.
        #[source]
        source: io::Error,
    },
}

impl FileError {
    fn io(what: &'static str, path: &Path, source: io::Error) -> FileError {
        FileError::Io { what, path: path.to_path_buf(), source }
    }
}

fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: stat is plain data; all zeroes is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open; `st` is valid for writes of its size.
    cvt(unsafe { libc::fstat(fd, &mut st) })?;
    Ok(st)
}

fn fstatat(dir: RawFd, name: &CString) -> io::Result<libc::stat> {
    // SAFETY: as fstat; `name` is NUL-terminated.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `dir` is open; `name` is NUL-terminated; `st` is valid for writes.
    cvt(unsafe { libc::fstatat(dir, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) })?;
    Ok(st)
}

fn openat(dir: RawFd, name: &CString, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    // SAFETY: `dir` is open; `name` is NUL-terminated; the result is a new descriptor we own.
    let fd = cvt(unsafe { libc::openat(dir, name.as_ptr(), flags | libc::O_CLOEXEC, mode as libc::c_uint) })?;
    // SAFETY: openat just returned this descriptor, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn cstr(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in a path"))
}

/// What a file of mode `m` is, for a message.
pub fn kind_of(m: u32) -> &'static str {
    match m & libc::S_IFMT {
        libc::S_IFREG => "a regular file",
        libc::S_IFDIR => "a directory",
        libc::S_IFLNK => "a symbolic link",
        libc::S_IFIFO => "a FIFO (named pipe)",
        libc::S_IFSOCK => "a socket",
        libc::S_IFCHR => "a character device",
        libc::S_IFBLK => "a block device",
        _ => "of an unknown kind",
    }
}

/// A directory opened by a checked walk: operations on names in it go through its
/// descriptor.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    path: PathBuf,
    /// Others may write it (it is sticky), or it is another user's: names in it are checked
    /// more closely.
    shared: bool,
    /// Some directory on the way to it (or it) is another user's, who could swap names in
    /// it: only its descriptor may be trusted, not its path. (In a sticky directory only
    /// root's and this user's entries are gone through, and nobody else can swap those.)
    exposed: bool,
    uid: u32,
    mode: u32,
}

/// Checks directory `fd` (reached as `path`) against the walk's rule: whether others may
/// write it (it is then sticky) or it is another user's, whether it is another user's, its
/// owner and mode.
fn check_dir(fd: RawFd, path: &Path, me: u32) -> Result<(bool, bool, u32, u32), FileError> {
    let st = fstat(fd).map_err(|e| FileError::io("checking", path, e))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return Err(FileError::NotDir { path: path.to_path_buf(), what: kind_of(st.st_mode) });
    }
    let writable = st.st_mode & 0o022 != 0;
    if writable && st.st_mode & libc::S_ISVTX == 0 {
        return Err(FileError::OpenDir { path: path.to_path_buf(), mode: st.st_mode & 0o7777 });
    }
    // Another user's own directory (an operator's home, say, under `sudo`): its owner can
    // swap what is in it, so it is gone through as a shared one is.
    let theirs = st.st_uid != 0 && st.st_uid != me;
    Ok((writable || theirs, theirs, st.st_uid, st.st_mode & 0o7777))
}

impl Dir {
    /// Opens directory `path` by walking it from `/` (or from the current directory, for a
    /// relative path) with the rule of this module; missing directories are made with mode
    /// `create` when it is given.
    pub fn open(path: &Path, create: Option<u32>) -> Result<Dir, FileError> {
        let me = euid();
        let start: &Path = if path.is_absolute() { Path::new("/") } else { Path::new(".") };
        let mut todo: std::collections::VecDeque<OsString> = components(path);
        let mut fd = openat(libc::AT_FDCWD, &cstr(start.as_os_str()).expect("no NUL"), dir_flags(), 0)
            .map_err(|e| FileError::io("opening", start, e))?;
        // (Named in messages as the absolute path, where the current directory has one.)
        let mut at = if path.is_absolute() {
            start.to_path_buf()
        } else {
            std::env::current_dir().unwrap_or_else(|_| start.to_path_buf())
        };
        let (mut shared, mut exposed, mut uid, mut mode) = check_dir(fd.as_raw_fd(), &at, me)?;
        let mut links = 0;
        while let Some(name) = todo.pop_front() {
            if name == ".." {
                at.pop();
            } else {
                at.push(&name);
            }
            let c = cstr(&name).map_err(|e| FileError::io("opening", &at, e))?;
            let next = match openat(fd.as_raw_fd(), &c, dir_flags(), 0) {
                Err(e)
                    if e.raw_os_error() == Some(libc::ENOENT)
                        && name != ".."
                        && let Some(m) = create =>
                {
                    // SAFETY: `fd` is open; `c` is NUL-terminated.
                    let made = cvt(unsafe { libc::mkdirat(fd.as_raw_fd(), c.as_ptr(), m) });
                    match made {
                        Ok(_) => {}
                        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
                        Err(e) => return Err(FileError::io("creating", &at, e)),
                    }
                    openat(fd.as_raw_fd(), &c, dir_flags(), 0)
                }
                r => r,
            }
            .map_err(|e| FileError::io("opening", &at, e))?;
            let st = fstat(next.as_raw_fd()).map_err(|e| FileError::io("checking", &at, e))?;
            if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
                if shared {
                    return Err(FileError::LinkInShared { path: at });
                }
                links += 1;
                if links > MAX_LINKS {
                    return Err(FileError::Loop { path: path.to_path_buf() });
                }
                let target = readlinkat(fd.as_raw_fd(), &c).map_err(|e| FileError::io("reading the link", &at, e))?;
                let target = PathBuf::from(target);
                for c in components(&target).into_iter().rev() {
                    todo.push_front(c);
                }
                at.pop();
                if target.is_absolute() {
                    fd = openat(libc::AT_FDCWD, &cstr(OsStr::new("/")).expect("no NUL"), dir_flags(), 0)
                        .map_err(|e| FileError::io("opening", Path::new("/"), e))?;
                    at = PathBuf::from("/");
                    let theirs;
                    (shared, theirs, uid, mode) = check_dir(fd.as_raw_fd(), &at, me)?;
                    exposed |= theirs;
                }
                continue;
            }
            if shared && st.st_uid != 0 && st.st_uid != me {
                return Err(FileError::Owner { path: at, uid: st.st_uid, me });
            }
            let theirs;
            (shared, theirs, uid, mode) = check_dir(next.as_raw_fd(), &at, me)?;
            exposed |= theirs;
            fd = next;
        }
        Ok(Dir { fd, path: path.to_path_buf(), shared, exposed, uid, mode })
    }

    /// True when only root or this user may write it, and no other user could swap a name
    /// on the way to it: its path, not only its descriptor, names it for good.
    pub fn private(&self) -> bool {
        !self.shared && !self.exposed
    }

    /// Its owner and mode bits.
    pub fn owner_mode(&self) -> (u32, u32) {
        (self.uid, self.mode)
    }

    /// Opens file `name` in it for appending (made with mode `mode` when missing), without
    /// following a link and without blocking on a FIFO or a device, and checks it: a
    /// regular file of this user's, with no second name where others may write.
    pub fn append(&self, name: &OsStr, mode: u32) -> Result<File, FileError> {
        self.open_file(name, libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT, mode, false)
    }

    /// Opens `name` for an output the user named (`sluice capture -w`): a regular file
    /// checked as [`Dir::append`] checks it and then made empty (after the checks, never
    /// before); a FIFO or a device of root's or this user's (`/dev/null`, a reader's named
    /// pipe) is written as it is.
    pub fn output(&self, name: &OsStr, mode: u32) -> Result<File, FileError> {
        let f = self.open_file(name, libc::O_WRONLY | libc::O_CREAT, mode, true)?;
        let regular = f.metadata().is_ok_and(|m| m.is_file());
        if regular {
            f.set_len(0).map_err(|e| FileError::io("emptying", &self.path.join(name), e))?;
        }
        Ok(f)
    }

    fn open_file(&self, name: &OsStr, flags: i32, mode: u32, special: bool) -> Result<File, FileError> {
        let path = self.path.join(name);
        let c = cstr(name).map_err(|e| FileError::io("opening", &path, e))?;
        let fd = match openat(self.fd.as_raw_fd(), &c, flags | libc::O_NOFOLLOW | libc::O_NONBLOCK, mode) {
            Ok(fd) => fd,
            Err(e) => {
                // A FIFO without a reader (ENXIO), a link (ELOOP), a device: say what it is.
                if let Ok(st) = fstatat(self.fd.as_raw_fd(), &c)
                    && st.st_mode & libc::S_IFMT != libc::S_IFREG
                    && !(special && st.st_mode & libc::S_IFMT == libc::S_IFIFO)
                {
                    return Err(refusal(&path, st.st_mode));
                }
                return Err(FileError::io("opening", &path, e));
            }
        };
        let st = fstat(fd.as_raw_fd()).map_err(|e| FileError::io("checking", &path, e))?;
        let me = euid();
        let kind = st.st_mode & libc::S_IFMT;
        let writable_special = special && matches!(kind, libc::S_IFIFO | libc::S_IFCHR);
        if kind != libc::S_IFREG && !writable_special {
            return Err(refusal(&path, st.st_mode));
        }
        if st.st_uid != me && !(writable_special && st.st_uid == 0) {
            return Err(FileError::Owner { path, uid: st.st_uid, me });
        }
        if self.shared && st.st_nlink > 1 {
            return Err(FileError::HardLink { path, links: st.st_nlink });
        }
        // (A regular file does not block; the flag is cleared for whoever reads it later.)
        // SAFETY: fcntl on a descriptor we own; F_GETFL/F_SETFL take an int.
        unsafe {
            let fl = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
            libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK);
        }
        Ok(File::from(fd))
    }

    /// Renames `from` to `to`, both in this directory (a link at `to` is replaced, never
    /// followed).
    pub fn rename(&self, from: &OsStr, to: &OsStr) -> Result<(), FileError> {
        let path = self.path.join(from);
        let (a, b) = (
            cstr(from).map_err(|e| FileError::io("renaming", &path, e))?,
            cstr(to).map_err(|e| FileError::io("renaming", &path, e))?,
        );
        // SAFETY: both names are NUL-terminated; the descriptor is open.
        cvt(unsafe { libc::renameat(self.fd.as_raw_fd(), a.as_ptr(), self.fd.as_raw_fd(), b.as_ptr()) })
            .map_err(|e| FileError::io("renaming", &path, e))?;
        Ok(())
    }
}

fn refusal(path: &Path, mode: u32) -> FileError {
    if mode & libc::S_IFMT == libc::S_IFLNK {
        FileError::Link { path: path.to_path_buf() }
    } else {
        FileError::NotRegular { path: path.to_path_buf(), what: kind_of(mode) }
    }
}

/// Opens directories (or, with `O_NOFOLLOW`, a link itself, to be told apart by fstat).
fn dir_flags() -> i32 {
    libc::O_PATH | libc::O_NOFOLLOW
}

fn components(p: &Path) -> std::collections::VecDeque<OsString> {
    p.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            _ => None,
        })
        .collect()
}

fn readlinkat(dir: RawFd, name: &CString) -> io::Result<OsString> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: `buf` is valid for writes of its length; `name` is NUL-terminated.
    let n = cvt(unsafe { libc::readlinkat(dir, name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })?;
    buf.truncate(n as usize);
    Ok(OsString::from_vec(buf))
}

/// Opens file `path` for appending (see [`Dir::append`]), its directory walked as
/// [`Dir::open`] walks (made when missing): returns the directory too, for renames.
pub fn append_checked(path: &Path, mode: u32) -> Result<(Dir, File), FileError> {
    let (dir, name) = split(path)?;
    let d = Dir::open(dir, Some(0o700))?;
    let f = d.append(name, mode)?;
    Ok((d, f))
}

/// Opens `path` as an output the user named, checked as [`Dir::output`]; its directory
/// must exist.
pub fn output_checked(path: &Path, mode: u32) -> Result<File, FileError> {
    let (dir, name) = split(path)?;
    Dir::open(dir, None)?.output(name, mode)
}

/// A path's directory and last name.
pub fn split(path: &Path) -> Result<(&Path, &OsStr), FileError> {
    let name =
        path.file_name().ok_or_else(|| FileError::NotRegular { path: path.to_path_buf(), what: "no file name" })?;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    Ok((dir, name))
}

/// A fresh directory of this process's own, made by `mkdtemp` under the system's temporary
/// directory (mode 0700: nobody else can add, swap or read anything in it), removed with
/// what it holds when dropped.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Makes `$TMPDIR/PREFIX.XXXXXX` (the Xs random, the directory new: `mkdtemp` never
    /// takes one that exists).
    pub fn new(prefix: &str) -> io::Result<TempDir> {
        Self::new_in(&std::env::temp_dir(), prefix)
    }

    /// Makes `DIR/PREFIX.XXXXXX`.
    pub fn new_in(dir: &Path, prefix: &str) -> io::Result<TempDir> {
        let mut template = dir.join(format!("{prefix}.XXXXXX")).into_os_string().into_vec();
        template.push(0);
        // SAFETY: `template` is NUL-terminated and writable; mkdtemp replaces the Xs in place.
        let p = unsafe { libc::mkdtemp(template.as_mut_ptr().cast()) };
        if p.is_null() {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(e.kind(), format!("making a temporary directory in {}: {e}", dir.display())));
        }
        template.pop();
        Ok(TempDir { path: PathBuf::from(OsString::from_vec(template)) })
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn chown(p: &Path, uid: u32) {
        std::os::unix::fs::lchown(p, Some(uid), Some(uid)).unwrap();
    }

    #[test]
    fn a_temporary_directory_is_new_private_and_removed() {
        let a = TempDir::new("sluice-unit").unwrap();
        let b = TempDir::new("sluice-unit").unwrap();
        assert_ne!(a.path(), b.path());
        let m = std::fs::symlink_metadata(a.path()).unwrap();
        assert!(m.is_dir() && m.mode() & 0o777 == 0o700 && m.uid() == euid());
        std::fs::write(a.path().join("f"), b"x").unwrap();
        let p = a.path().to_path_buf();
        drop(a);
        assert!(!p.exists());
        assert!(b.path().is_dir());
    }

    #[test]
    fn files_are_opened_only_when_regular_and_ours() {
        let t = TempDir::new("sluice-unit").unwrap();
        let d = t.path();
        let (dir, mut f) = append_checked(&d.join("new/deeper/m.log"), 0o600).unwrap();
        std::io::Write::write_all(&mut f, b"one\n").unwrap();
        assert!(dir.private());
        assert_eq!(std::fs::metadata(d.join("new/deeper/m.log")).unwrap().mode() & 0o777, 0o600);
        dir.rename(OsStr::new("m.log"), OsStr::new("m.log.1")).unwrap();
        assert!(d.join("new/deeper/m.log.1").exists());

        // A FIFO (no reader: the open would block without O_NONBLOCK), a link, a directory.
        let fifo = d.join("fifo");
        let c = CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = append_checked(&fifo, 0o600).unwrap_err();
        assert!(e.to_string().contains("a FIFO (named pipe), not a regular file"), "{e}");
        std::os::unix::fs::symlink("/etc/hostname", d.join("link")).unwrap();
        let e = append_checked(&d.join("link"), 0o600).unwrap_err();
        assert!(e.to_string().contains("is a symbolic link"), "{e}");
        let e = output_checked(&d.join("new"), 0o600).unwrap_err();
        assert!(e.to_string().contains("a directory, not a regular file"), "{e}");
        // An output the user names may be a device or a FIFO of root's or theirs.
        assert!(output_checked(Path::new("/dev/null"), 0o644).is_ok());
        let e = output_checked(&d.join("link"), 0o644).unwrap_err();
        assert!(e.to_string().contains("is a symbolic link"), "{e}");
        let mut o = output_checked(&d.join("out"), 0o644).unwrap();
        std::io::Write::write_all(&mut o, b"long text").unwrap();
        let mut o = output_checked(&d.join("out"), 0o644).unwrap();
        std::io::Write::write_all(&mut o, b"short").unwrap();
        assert_eq!(std::fs::read(d.join("out")).unwrap(), b"short", "emptied first");
        // Links to directories are followed where nobody else can write.
        std::os::unix::fs::symlink("new/deeper", d.join("alias")).unwrap();
        assert!(append_checked(&d.join("alias/m.log"), 0o600).is_ok());
    }

    #[test]
    #[ignore = "system tier: needs root (files of another user); scripts/test.sh runs it"]
    fn a_shared_directory_yields_nothing_someone_else_planted() {
        assert_eq!(
            euid(),
            0,
            "needs root (files of another user): run scripts/test.sh as root, or leave out --include-ignored"
        );
        let t = TempDir::new("sluice-unit").unwrap();
        let shared = t.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
        // Someone's directory, someone's link, someone's file, a second name of ours.
        std::fs::create_dir(shared.join("theirs")).unwrap();
        chown(&shared.join("theirs"), 65534);
        std::os::unix::fs::symlink(t.path(), shared.join("lnk")).unwrap();
        chown(&shared.join("lnk"), 65534);
        std::fs::write(shared.join("their.log"), b"").unwrap();
        chown(&shared.join("their.log"), 65534);
        std::fs::write(t.path().join("mine"), b"").unwrap();
        std::fs::hard_link(t.path().join("mine"), shared.join("twice.log")).unwrap();
        let e = append_checked(&shared.join("theirs/m.log"), 0o600).unwrap_err();
        assert!(e.to_string().contains("belongs to uid 65534"), "{e}");
        let e = append_checked(&shared.join("lnk/m.log"), 0o600).unwrap_err();
        assert!(e.to_string().contains("symbolic link in a directory others can write"), "{e}");
        let e = append_checked(&shared.join("their.log"), 0o600).unwrap_err();
        assert!(e.to_string().contains("belongs to uid 65534"), "{e}");
        let e = append_checked(&shared.join("twice.log"), 0o600).unwrap_err();
        assert!(e.to_string().contains("hard link"), "{e}");
        // A directory others may write that is not sticky is refused whole.
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = append_checked(&shared.join("new.log"), 0o600).unwrap_err();
        assert!(e.to_string().contains("is not sticky"), "{e}");
        // Ours, in a sticky one: fine.
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
        assert!(append_checked(&shared.join("new.log"), 0o600).is_ok());
        // Another user's own directory (a home directory under sudo): a new file of ours
        // is fine, its owner's links and files are not gone through, and its path is not
        // private (the owner could rename it).
        let home = t.path().join("home");
        std::fs::create_dir(&home).unwrap();
        std::os::unix::fs::symlink(t.path(), home.join("lnk")).unwrap();
        chown(&home, 65534);
        assert!(append_checked(&home.join("out.log"), 0o600).is_ok());
        let e = append_checked(&home.join("lnk/m.log"), 0o600).unwrap_err();
        assert!(e.to_string().contains("symbolic link in a directory others can write"), "{e}");
        assert!(!Dir::open(&home, None).unwrap().private());
        assert!(Dir::open(t.path(), None).unwrap().private(), "a mkdtemp directory under /tmp is");
    }
}
