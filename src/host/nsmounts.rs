//! The mounts of one directory in every mount namespace of the host, and making them read-only
//! (or writable again) where they are.
//!
//! A pod does not use kubelet's mount of a volume: its container runtime bind-mounts that
//! target into the container's own mount namespace, a separate mount whose flags a remount of
//! the target does not reach (flag changes never propagate, not even to shared peers). So a
//! read-only fence must act on each namespace's own mounts: every task's namespace is looked
//! at once (`/proc/<pid>/task/<tid>/ns/mnt`, deduplicated by the namespace's inode), its mount
//! table read for mounts of the directory or beneath it (subPath mounts), and each one changed
//! from a thread that entered that namespace. Seeing every task needs the host's pid namespace
//! (`hostPID` for the node plugin); without it only our own namespaces are seen.
//!
//! A mount point is a path inside another namespace, in a tree a tenant may rearrange: it is
//! opened without following a final symlink, and changed only if the mount the kernel opened
//! has the id the mount table gave (`statx`'s mount id, unique kernel-wide).

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use super::mountinfo::{self, MountEntry};

/// A directory as every mount table names it: its filesystem's device and its path from that
/// filesystem's root (mountinfo's "root" field of a bind mount of it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    pub dev: (u32, u32),
    pub root: PathBuf,
}

/// One mount, kernel-wide: its namespace (the inode of its nsfs file) and its mount id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MountKey {
    pub namespace: u64,
    pub mount_id: u32,
}

/// A mount of the source found in some namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub key: MountKey,
    /// As that namespace's root sees it.
    pub mount_point: PathBuf,
    pub read_only: bool,
}

/// What one pass changed and what it could not.
#[derive(Debug, Default)]
pub struct Changed {
    pub changed: Vec<MountKey>,
    /// Mounts found but not changed, each with why.
    pub failed: Vec<String>,
    /// Namespaces with a mount that could not be made read-only because files are open for
    /// writing through it (the kernel answers EBUSY while any are): see `stop_processes_in`.
    pub busy: Vec<u64>,
    /// Namespaces looked at.
    pub namespaces: usize,
}

/// `dir` as mount tables name it: the device and root of the mount holding it here, plus its
/// path below that mount's point.
pub fn source_of(dir: &Path) -> io::Result<Source> {
    let opened = nix::fcntl::open(dir, OFlag::O_PATH | OFlag::O_CLOEXEC, Mode::empty())?;
    let id = mount_id(opened.as_fd())?;
    let entries = mountinfo::read_self()?;
    let entry = entries.iter().find(|e| e.mount_id == id).ok_or_else(|| {
        io::Error::other(format!(
            "mount {id} of {} is not in mountinfo",
            dir.display()
        ))
    })?;
    let below = dir.strip_prefix(&entry.mount_point).map_err(|_| {
        io::Error::other(format!(
            "{} is not beneath its mount point {}",
            dir.display(),
            entry.mount_point.display()
        ))
    })?;
    Ok(Source {
        dev: (entry.major, entry.minor),
        root: entry.root.join(below),
    })
}

/// The kernel-wide id of the mount `fd` is on.
fn mount_id(fd: BorrowedFd<'_>) -> io::Result<u32> {
    let mut buf = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: an empty C string with AT_EMPTY_PATH names the descriptor; buf is a writable statx.
    let rc = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_MNT_ID,
            buf.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statx succeeded and filled the buffer.
    let st = unsafe { buf.assume_init() };
    if st.stx_mask & libc::STATX_MNT_ID == 0 {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "kernel does not report mount ids (needs Linux 5.8+)",
        ));
    }
    Ok(st.stx_mnt_id as u32)
}

/// A namespace with mounts of the source: a descriptor of it and what was found there.
struct Namespace {
    fd: OwnedFd,
    mounts: Vec<Found>,
}

fn is_of(entry: &MountEntry, source: &Source) -> bool {
    (entry.major, entry.minor) == source.dev && entry.root.starts_with(&source.root)
}

/// Reads a procfs file in one go (procfs reports size 0).
fn read_proc(path: &Path) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::with_capacity(16 << 10);
    fs::File::open(path)?.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Every task directory under /proc (`/proc/<pid>/task/<tid>`).
fn tasks() -> impl Iterator<Item = PathBuf> {
    processes().flat_map(|process| {
        fs::read_dir(process.join("task"))
            .into_iter()
            .flatten()
            .flatten()
            .filter(numeric)
            .map(|task| task.path())
    })
}

/// Calls `visit` once per mount namespace this process can see (a descriptor of it, its nsfs
/// inode, its mount table); how many there were. A task that ends meanwhile is skipped.
fn each_namespace(mut visit: impl FnMut(OwnedFd, u64, Vec<MountEntry>)) -> usize {
    let mut seen = HashSet::new();
    for task in tasks() {
        let Ok(fd) = nix::fcntl::open(
            &task.join("ns/mnt"),
            OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) else {
            continue;
        };
        let Ok(stat) = nix::sys::stat::fstat(fd.as_fd()) else {
            continue;
        };
        if !seen.insert(stat.st_ino) {
            continue;
        }
        let Ok(bytes) = read_proc(&task.join("mountinfo")) else {
            continue;
        };
        if let Ok(entries) = mountinfo::parse_bytes(&bytes) {
            visit(fd, stat.st_ino, entries);
        }
    }
    seen.len()
}

/// The namespaces holding mounts of `source`, and how many namespaces were looked at.
fn namespaces_with(source: &Source) -> (Vec<Namespace>, usize) {
    let mut found = Vec::new();
    let looked_at = each_namespace(|fd, namespace, entries| {
        let mounts: Vec<Found> = entries
            .iter()
            .filter(|e| is_of(e, source))
            .map(|e| Found {
                key: MountKey {
                    namespace,
                    mount_id: e.mount_id,
                },
                mount_point: e.mount_point.clone(),
                read_only: e.mount_options.split(',').any(|o| o == "ro"),
            })
            .collect();
        if !mounts.is_empty() {
            found.push(Namespace { fd, mounts });
        }
    });
    (found, looked_at)
}

/// Every mount of `source` in every namespace this process can see.
pub fn mounts_of(source: &Source) -> Vec<Found> {
    namespaces_with(source)
        .0
        .into_iter()
        .flat_map(|ns| ns.mounts)
        .collect()
}

/// Makes every mount of `source` that `select` picks read-only (`read_only`) or writable, in
/// whichever namespace it is; mounts already so are left alone.
pub fn set_read_only(source: &Source, read_only: bool, select: &dyn Fn(&Found) -> bool) -> Changed {
    let (namespaces, looked_at) = namespaces_with(source);
    let mut outcome = Changed {
        namespaces: looked_at,
        ..Changed::default()
    };
    for ns in namespaces {
        let wanted: Vec<Found> = ns
            .mounts
            .into_iter()
            .filter(|m| m.read_only != read_only && select(m))
            .collect();
        if wanted.is_empty() {
            continue;
        }
        match in_namespace(ns.fd, wanted, read_only) {
            Ok(results) => {
                for (found, result) in results {
                    match result {
                        Ok(()) => outcome.changed.push(found.key),
                        Err(err) if read_only && err.raw_os_error() == Some(libc::EBUSY) => {
                            outcome.busy.push(found.key.namespace)
                        }
                        Err(err) => outcome.failed.push(format!(
                            "{} (mount {}): {err}",
                            found.mount_point.display(),
                            found.key.mount_id
                        )),
                    }
                }
            }
            Err(err) => outcome
                .failed
                .push(format!("entering a mount namespace: {err}")),
        }
    }
    outcome
}

/// Kills (SIGKILL) every process whose mount namespace is one of `namespaces`, never one in
/// this process's own namespace or in pid 1's; how many were signalled. A container keeping a
/// file open for writing through a mount keeps that mount from being made read-only, and no
/// descriptor can be revoked: its processes go, and kubelet restarts the container. Each is
/// signalled through a pidfd opened before its namespace is looked at, so a pid reused
/// meanwhile is never signalled (the pidfd's process is gone then, and the signal fails).
pub fn stop_processes_in(namespaces: &[u64]) -> usize {
    let inode = |path: &str| nix::sys::stat::stat(path).ok().map(|s| s.st_ino);
    let protected = [inode("/proc/self/ns/mnt"), inode("/proc/1/ns/mnt")];
    let mut stopped = 0;
    for process in processes() {
        let Some(pid) = process
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        // SAFETY: plain integers; the result is a new descriptor or -1.
        let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if raw < 0 {
            continue;
        }
        // SAFETY: pidfd_open returned a descriptor nobody else owns.
        let pidfd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw as libc::c_int) };
        let Some(namespace) = inode(&format!("/proc/{pid}/ns/mnt")) else {
            continue;
        };
        if !namespaces.contains(&namespace) || protected.contains(&Some(namespace)) {
            continue;
        }
        // SAFETY: a pidfd we own, a signal number, no siginfo.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                pidfd.as_raw_fd(),
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if rc == 0 {
            stopped += 1;
        }
    }
    stopped
}

type Results = Vec<(Found, io::Result<()>)>;

/// Changes `mounts` from a thread of their namespace: the thread unshares its filesystem
/// context (root and cwd) from the process's first, as setns requires of a threaded process,
/// and ends with the work, so no other thread ever runs in the namespace.
fn in_namespace(ns: OwnedFd, mounts: Vec<Found>, read_only: bool) -> io::Result<Results> {
    std::thread::spawn(move || -> io::Result<Results> {
        // SAFETY: plain syscalls on this thread's own context and a descriptor we own.
        unsafe {
            if libc::unshare(libc::CLONE_FS) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNS) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(mounts
            .into_iter()
            .map(|found| {
                let result = set_one(&found, read_only);
                (found, result)
            })
            .collect())
    })
    .join()
    .map_err(|_| io::Error::other("the namespace's thread panicked"))?
}

/// Sets or clears read-only on the mount at `found`'s point, if it is still that mount.
fn set_one(found: &Found, read_only: bool) -> io::Result<()> {
    let opened = nix::fcntl::open(
        &found.mount_point,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    if mount_id(opened.as_fd())? != found.key.mount_id {
        return Err(io::Error::other("another mount is there now"));
    }
    let bit = libc::MOUNT_ATTR_RDONLY;
    let attr = libc::mount_attr {
        attr_set: if read_only { bit } else { 0 },
        attr_clr: if read_only { 0 } else { bit },
        propagation: 0,
        userns_fd: 0,
    };
    super::mount::set_attributes(opened.as_fd(), &attr)
}

/// The bytes held by files that no name reaches any more (unlinked, or made with O_TMPFILE)
/// but that a process keeps open through a mount of one of `sources`, per source: a walk of
/// the tree cannot see them, yet they fill the filesystem until closed. Each inode counts
/// once, however many descriptors hold it. Looks at every process this one can see (the host's,
/// with `hostPID`), reading only the descriptors the kernel names "(deleted)".
pub fn held_by_unlinked(sources: &[Source]) -> Vec<u64> {
    let mut bytes = vec![0; sources.len()];
    if sources.is_empty() {
        return bytes;
    }
    // Mount ids are unique kernel-wide: one map from every namespace's table, in one pass.
    let mut of_mount: HashMap<u32, usize> = HashMap::new();
    each_namespace(|_, _, entries| {
        for entry in entries {
            if let Some(index) = sources.iter().position(|source| is_of(&entry, source)) {
                of_mount.insert(entry.mount_id, index);
            }
        }
    });
    let mut counted = HashSet::new();
    for process in processes() {
        let Ok(fds) = fs::read_dir(process.join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let Ok(link) = fs::read_link(fd.path()) else {
                continue;
            };
            if !link.as_os_str().as_encoded_bytes().ends_with(b" (deleted)") {
                continue;
            }
            let Some(index) = fd_mount_id(&process, &fd.file_name()).and_then(|m| of_mount.get(&m))
            else {
                continue;
            };
            // Follows the descriptor's magic link to the open file itself.
            let Ok(stat) = nix::sys::stat::stat(&fd.path()) else {
                continue;
            };
            let regular = stat.st_mode & libc::S_IFMT == libc::S_IFREG;
            if regular && stat.st_nlink == 0 && counted.insert((stat.st_dev, stat.st_ino)) {
                bytes[*index] += (stat.st_blocks as u64).saturating_mul(512);
            }
        }
    }
    bytes
}

/// The mount a process's descriptor was opened through (its fdinfo's `mnt_id`).
fn fd_mount_id(process: &Path, fd: &std::ffi::OsStr) -> Option<u32> {
    let info = fs::read_to_string(process.join("fdinfo").join(fd)).ok()?;
    info.lines()
        .find_map(|line| line.strip_prefix("mnt_id:"))
        .and_then(|id| id.trim().parse().ok())
}

/// Every process directory under /proc.
fn processes() -> impl Iterator<Item = PathBuf> {
    fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter(numeric)
        .map(|entry| entry.path())
}

fn numeric(entry: &fs::DirEntry) -> bool {
    entry
        .file_name()
        .to_str()
        .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn bind(source: &Path, target: &Path, flags: sys_mount::MountFlags) {
        let dir = super::super::dirfd::open_dir(target).unwrap();
        super::super::mount::bind_onto(source, dir.as_fd(), flags).unwrap();
    }

    /// A directory `data` bind-mounted at `target` in a scratch directory; unmounted when
    /// dropped, also by a failed test.
    struct Bound {
        _scratch: tempfile::TempDir,
        data: PathBuf,
        target: PathBuf,
    }

    impl Bound {
        fn new() -> Bound {
            let scratch = tempfile::tempdir().unwrap();
            let data = scratch.path().join("data");
            let target = scratch.path().join("target");
            fs::create_dir_all(&data).unwrap();
            fs::create_dir_all(&target).unwrap();
            bind(&data, &target, sys_mount::MountFlags::empty());
            Bound {
                _scratch: scratch,
                data,
                target,
            }
        }
    }

    impl Drop for Bound {
        fn drop(&mut self) {
            // Already gone where the test unmounted it; detached lazily if still busy.
            let _ = nix::mount::umount2(&self.target, nix::mount::MntFlags::MNT_DETACH);
        }
    }

    /// A thread in a namespace of its own (a copy of ours, as a container runtime makes one)
    /// writes into its copy of the bind mount until told to stop; it reports each write's result.
    #[test]
    fn a_mount_in_another_namespace_is_made_read_only_there_and_writable_again() {
        if !nix::unistd::Uid::effective().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let bound = Bound::new();
        let (data, target) = (bound.data.clone(), bound.target.clone());
        let source = source_of(&data).unwrap();
        let (go, commands) = std::sync::mpsc::channel::<bool>();
        let (report, results) = std::sync::mpsc::channel::<io::Result<()>>();
        let in_pod = target.join("file");
        let pod = std::thread::spawn(move || {
            // SAFETY: this thread's own context.
            assert_eq!(
                unsafe { libc::unshare(libc::CLONE_FS | libc::CLONE_NEWNS) },
                0
            );
            nix::mount::mount(
                None::<&str>,
                "/",
                None::<&str>,
                nix::mount::MsFlags::MS_REC | nix::mount::MsFlags::MS_PRIVATE,
                None::<&str>,
            )
            .unwrap();
            report.send(Ok(())).unwrap();
            for keep_going in commands {
                if !keep_going {
                    break;
                }
                report.send(fs::write(&in_pod, b"x")).unwrap();
            }
        });
        results.recv().unwrap().unwrap();
        super::super::mount::unmount(&target).unwrap();
        // Only the pod's namespace has the mount now: once, or at each path where a shared
        // bind shows its directory (a systemd host's shared root; the project's VM).
        let found = mounts_of(&source);
        let namespaces: HashSet<u64> = found.iter().map(|m| m.key.namespace).collect();
        assert_eq!(namespaces.len(), 1, "{found:?}");
        go.send(true).unwrap();
        results.recv().unwrap().expect("writable before");

        let fenced = set_read_only(&source, true, &|_| true);
        assert_eq!(fenced.changed.len(), found.len(), "{fenced:?}");
        assert!(fenced.failed.is_empty(), "{fenced:?}");
        go.send(true).unwrap();
        let refused = results.recv().unwrap().unwrap_err();
        assert_eq!(refused.raw_os_error(), Some(libc::EROFS));
        assert!(mounts_of(&source).iter().all(|m| m.read_only));
        // Again: nothing left to change.
        assert!(set_read_only(&source, true, &|_| true).changed.is_empty());

        let lifted = set_read_only(&source, false, &|m| fenced.changed.contains(&m.key));
        assert_eq!(lifted.changed, fenced.changed);
        go.send(true).unwrap();
        results.recv().unwrap().expect("writable after");
        go.send(false).unwrap();
        pod.join().unwrap();
    }

    /// A process of another namespace keeps a file open for writing through its copy of the
    /// mount: the kernel refuses to make that mount read-only (EBUSY), the namespace is named
    /// busy, and stopping its processes ends the writer; our own namespace is never touched.
    #[test]
    fn a_namespace_writing_through_a_mount_is_busy_and_its_processes_can_be_stopped() {
        if !nix::unistd::Uid::effective().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let bound = Bound::new();
        let (data, target) = (bound.data.clone(), bound.target.clone());
        let source = source_of(&data).unwrap();
        let script = format!(
            "exec 3>>{}/held && echo ready && exec sleep 60",
            target.display()
        );
        let mut writer = std::process::Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("unshare(1)");
        let mut ready = [0u8; 6];
        std::io::Read::read_exact(writer.stdout.as_mut().unwrap(), &mut ready).unwrap();
        let theirs = nix::sys::stat::stat(format!("/proc/{}/ns/mnt", writer.id()).as_str())
            .unwrap()
            .st_ino;
        let fenced = set_read_only(&source, true, &|_| true);
        // Ours, and copies propagated into other namespaces of this machine, if any.
        assert!(!fenced.changed.is_empty(), "our own target: {fenced:?}");
        assert_eq!(fenced.busy, [theirs], "the writer's namespace: {fenced:?}");
        assert!(fenced.failed.is_empty(), "{fenced:?}");
        let own = nix::sys::stat::stat("/proc/self/ns/mnt").unwrap().st_ino;
        assert_eq!(stop_processes_in(&[own]), 0, "never our own namespace");
        assert_eq!(stop_processes_in(&fenced.busy), 1);
        let status = writer.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGKILL)
        );
    }

    /// A file unlinked while open still holds its blocks: counted for the mount it was opened
    /// through, once however many descriptors hold it, and no more once closed.
    #[test]
    fn bytes_of_unlinked_open_files_count_for_the_mount_they_were_opened_through() {
        if !nix::unistd::Uid::effective().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        use std::io::Write;
        let scratch = tempfile::tempdir().unwrap();
        let (data, other, target) = (
            scratch.path().join("data"),
            scratch.path().join("other"),
            scratch.path().join("target"),
        );
        for dir in [&data, &other, &target] {
            fs::create_dir_all(dir).unwrap();
        }
        bind(&data, &target, sys_mount::MountFlags::empty());
        let sources = [source_of(&data).unwrap(), source_of(&other).unwrap()];
        let mut hidden = fs::File::create(target.join("hidden")).unwrap();
        hidden.write_all(&vec![7u8; 1 << 20]).unwrap();
        hidden.sync_all().unwrap();
        let second = fs::File::open(target.join("hidden")).unwrap();
        fs::remove_file(target.join("hidden")).unwrap();
        let held = held_by_unlinked(&sources);
        assert!((1 << 20..(1 << 20) + 65536).contains(&held[0]), "{held:?}");
        assert_eq!(held[1], 0);
        drop((hidden, second));
        assert_eq!(held_by_unlinked(&sources), [0, 0]);
        super::super::mount::unmount(&target).unwrap();
    }
}
