//! Another node on this kernel, as every multi-node kind cluster has them: a mount namespace of
//! its own in which a fresh tmpfs hides a directory this test also uses, so both see their own
//! files at the same paths. Loop devices stay kernel-wide: what the other node attaches shows up
//! here, with backing paths that look like ours.
//!
//! [`OtherNode`] is a thread that entered such a namespace and runs jobs in it, playing the other
//! node's driver by hand; [`enter_with_tmpfs_at`] sets up the same for a whole driver process.

use std::ffi::{CStr, CString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;

use nix::mount::{MsFlags, mount};
use stickyvol::host::fsstat::{self, FileId};
use stickyvol::host::loopdev::{self, LoopDevice};

type Job = Box<dyn FnOnce() + Send>;

/// A thread in a mount namespace of its own with a tmpfs over a directory. Drop detaches the
/// devices it attached (those still attached to its files) and ends the thread, whose namespace
/// (and tmpfs) goes with it; also when the test panicked.
pub struct OtherNode {
    dir: PathBuf,
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    attached: Vec<(LoopDevice, FileId)>,
}

impl OtherNode {
    /// Starts the thread and hides `dir` (which must exist) under a fresh tmpfs in its namespace.
    pub fn over(dir: &Path) -> OtherNode {
        let target = c_path(dir);
        Self::start(dir, move || enter_with_tmpfs_at(&target))
    }

    /// A thread in a private copy of our mount namespace, as a container runtime makes one for
    /// a pod: it keeps its own copies of the mounts there now (a volume's target among them),
    /// whatever happens to ours later.
    pub fn private_copy() -> OtherNode {
        Self::start(Path::new("/"), enter_private)
    }

    fn start(dir: &Path, enter: impl FnOnce() -> io::Result<()> + Send + 'static) -> OtherNode {
        let (jobs, incoming) = mpsc::channel::<Job>();
        let (ready, entered) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            // unshare(CLONE_NEWNS) also unshares this thread's root and cwd from the process's:
            // only this thread changes namespace.
            let _ = ready.send(enter());
            for job in incoming {
                job();
            }
        });
        let node = OtherNode {
            dir: dir.to_path_buf(),
            jobs: Some(jobs),
            thread: Some(thread),
            attached: Vec::new(),
        };
        entered
            .recv()
            .expect("the other node's thread died")
            .unwrap_or_else(|e| panic!("entering a mount namespace over {}: {e}", dir.display()));
        node
    }

    /// Runs `job` in the other node's namespace; its result.
    pub fn run<T: Send + 'static>(&self, job: impl FnOnce() -> T + Send + 'static) -> T {
        let (send, result) = mpsc::channel();
        let job: Job = Box::new(move || {
            let _ = send.send(job());
        });
        self.jobs
            .as_ref()
            .expect("the other node has stopped")
            .send(job)
            .expect("the other node's thread died");
        result
            .recv()
            .expect("a job in the other node's namespace panicked")
    }

    /// What the other node's driver does to publish a block volume: a file of `len` bytes at
    /// `relative` under the hidden directory (its own file, at our path), attached to a loop
    /// device. The device and the identity of the file.
    pub fn attach_new_file(&mut self, relative: &str, len: u64) -> (LoopDevice, FileId) {
        let file = self.dir.join(relative);
        let attached = self.run(move || -> io::Result<(LoopDevice, FileId)> {
            if let Some(parent) = file.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::File::create(&file)?.set_len(len)?;
            let device = loopdev::attach(&file, false)?;
            Ok((device, fsstat::file_id(&file)?))
        });
        let attached = attached.unwrap_or_else(|e| panic!("the other node's attach: {e}"));
        self.attached.push(attached.clone());
        attached
    }
}

impl Drop for OtherNode {
    fn drop(&mut self) {
        for (device, file) in &self.attached {
            // The number may serve someone else by now if the device was (wrongly) detached.
            if loopdev::backing_file_id(device).ok().flatten() == Some(*file)
                && let Err(err) = loopdev::detach(device)
            {
                eprintln!("other node: detaching {}: {err}", device.name());
            }
        }
        // The thread ends with its last job; its namespace, the tmpfs in it, goes with it.
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Moves the calling thread into a new mount namespace with every mount private. Allocates
/// nothing, so it may run in a `pre_exec` hook.
pub fn enter_private() -> io::Result<()> {
    // SAFETY: unshare takes flags only.
    if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
        return Err(io::Error::last_os_error());
    }
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )?;
    Ok(())
}

/// `path` as a C string, for [`enter_with_tmpfs_at`].
pub fn c_path(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).expect("no NUL in test paths")
}

/// Moves the calling thread (or a child between fork and exec) into a new mount namespace with
/// every mount private (nothing done here reaches the original namespace, nor the other way) and
/// mounts a fresh tmpfs at `dir`. Allocates nothing, so it may run in a `pre_exec` hook.
pub fn enter_with_tmpfs_at(dir: &CStr) -> io::Result<()> {
    enter_private()?;
    mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=0755"),
    )?;
    Ok(())
}
