//! A tenant acting in its volume as a pod's unprivileged user does: the test binary runs itself
//! again as uid and gid 1000 (setuid from root clears every capability; std drops the
//! supplementary groups), with the volume's directory as its descriptor 3, and that run does one
//! action instead of testing. A test file using this must have a test named `tenant_act` that
//! calls [`act_if_asked`].

use std::fs::{self, File};
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use stickyvol::host::projquota;

pub const TENANT_UID: u32 = 1000;
const ACTION: &str = "STICKYVOL_TENANT_ACTION";
const PATH: &str = "STICKYVOL_TENANT_PATH";
const ARG: &str = "STICKYVOL_TENANT_ARG";

/// What the tenant does, relative to the directory it is given.
#[derive(Debug, Clone, Copy)]
pub enum Action<'a> {
    Mkdir(&'a str),
    /// Sets the project id of a file or directory (FS_IOC_FSSETXATTR), its flags unchanged.
    SetProject(&'a str, u32),
    /// Clears the inherit flag of a directory (FS_XFLAG_PROJINHERIT): what is made in it then
    /// starts in project 0.
    ClearInherit(&'a str),
    /// Writes this many bytes into a new file, 1 MiB at a time, each synced.
    Write(&'a str, u64),
    /// Makes files `<prefix>0`, `<prefix>1`, … and tags each with the next project id from
    /// `first`: (prefix, first, count).
    TagMany(&'a str, u32, u32),
}

/// Runs `action` as the tenant inside `dir`: Ok, or what went wrong (its output).
pub fn act(dir: &Path, action: Action<'_>) -> Result<(), String> {
    let (name, path, arg) = match action {
        Action::Mkdir(path) => ("mkdir", path, 0),
        Action::SetProject(path, id) => ("set-project", path, u64::from(id)),
        Action::ClearInherit(path) => ("clear-inherit", path, 0),
        Action::Write(path, bytes) => ("write", path, bytes),
        Action::TagMany(prefix, first, count) => (
            "tag-many",
            prefix,
            u64::from(first) << 32 | u64::from(count),
        ),
    };
    let held = File::open(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let fd = held.as_fd().as_raw_fd();
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["tenant_act", "--exact", "--nocapture", "--test-threads=1"])
        .env(ACTION, name)
        .env(PATH, path)
        .env(ARG, arg.to_string())
        .uid(TENANT_UID)
        .gid(TENANT_UID);
    // SAFETY: dup2 and fcntl are async-signal-safe; they give the child the directory as
    // descriptor 3 without close-on-exec (dup2 onto itself keeps the flag: clear it anyway).
    unsafe {
        command.pre_exec(move || {
            if libc::dup2(fd, 3) < 0 || libc::fcntl(3, libc::F_SETFD, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let output = command.output().expect("running the tenant");
    drop(held);
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// The tenant's side: does the action the environment names, if any (panics on failure).
pub fn act_if_asked() {
    let Ok(action) = std::env::var(ACTION) else {
        return;
    };
    // Whatever the tenant does must be done without privilege.
    let status = fs::read_to_string("/proc/self/status").unwrap();
    assert!(
        status.lines().any(|l| l == "CapEff:\t0000000000000000"),
        "{status}"
    );
    // SAFETY: geteuid cannot fail.
    assert_eq!(unsafe { libc::geteuid() }, TENANT_UID);
    let path = format!("/proc/self/fd/3/{}", std::env::var(PATH).unwrap());
    let arg: u64 = std::env::var(ARG).unwrap().parse().unwrap();
    match action.as_str() {
        "mkdir" => fs::create_dir(&path).unwrap(),
        "set-project" => set_project(&path, arg as u32),
        "clear-inherit" => clear_inherit(&path),
        "write" => {
            let mut file = File::create_new(&path).unwrap();
            let chunk = vec![0x5a; 1 << 20];
            let mut written = 0;
            while written < arg {
                let n = (arg - written).min(chunk.len() as u64) as usize;
                let wrote = file.write_all(&chunk[..n]).and_then(|()| file.sync_data());
                wrote.unwrap_or_else(|e| panic!("after {written} bytes: {e}"));
                written += n as u64;
            }
        }
        "tag-many" => {
            let (first, count) = ((arg >> 32) as u32, arg as u32);
            for i in 0..count {
                let file = format!("{path}{i}");
                File::create_new(&file).unwrap();
                set_project(&file, first + i);
            }
        }
        other => panic!("unknown tenant action {other}"),
    }
}

fn set_project(path: &str, id: u32) {
    let file = File::open(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    projquota::set_project_of_fd(file.as_fd(), id, false)
        .unwrap_or_else(|e| panic!("FS_IOC_FSSETXATTR {path} to project {id}: {e}"));
}

nix::ioctl_read_bad!(fs_ioc_fsgetxattr, 0x801C_581F, projquota::FsXattr);
nix::ioctl_write_ptr_bad!(fs_ioc_fssetxattr, 0x401C_5820, projquota::FsXattr);

fn clear_inherit(path: &str) {
    const FS_XFLAG_PROJINHERIT: u32 = 0x200;
    let dir = File::open(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut attr = projquota::FsXattr::default();
    // SAFETY: `attr` is a whole struct fsxattr that outlives both calls.
    unsafe { fs_ioc_fsgetxattr(dir.as_raw_fd(), &mut attr) }.unwrap();
    attr.fsx_xflags &= !FS_XFLAG_PROJINHERIT;
    // SAFETY: as above; the kernel only reads it.
    unsafe { fs_ioc_fssetxattr(dir.as_raw_fd(), &attr) }.unwrap();
}
