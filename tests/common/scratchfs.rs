//! Scratch filesystems of a chosen type for tests that need btrfs, XFS or ext4 features: a
//! sparse image under /var/tmp, formatted with mkfs.<type>, attached to a loop device
//! (losetup) and mounted (mount(8)). Dropping a [`ScratchFs`] undoes all three, also when the
//! test panicked.
//!
//! Setting one up never "skips": a missing mkfs.<type> (CI installs them), a losetup failure or
//! a refused mount fails the test. The one exception is
//! [`ScratchFs::new_with_project_quota`]: when the kernel says it was built without quota
//! support, it records a skip (`super::skip`, counted by CI and failing where the feature is
//! required) and answers None.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::Command;

use tempfile::TempDir;

#[derive(Debug)]
pub struct ScratchFs {
    pub mount_point: PathBuf,
    /// The loop device, e.g. /dev/loop3.
    pub device: PathBuf,
    pub fs_type: String,
    mount_options: String,
    /// Holds the image and the mount point; None once deliberately leaked.
    dir: Option<TempDir>,
    attached: bool,
    mounted: bool,
}

/// What kernels built without quota support log when asked to mount with it (XFS: no
/// CONFIG_XFS_QUOTA; ext4: no CONFIG_QUOTA, for `-O quota`, `-O project` and `-o prjquota`).
const NO_QUOTA_IN_KERNEL: &[&str] = &[
    "quota support not available in this kernel",
    "not built with CONFIG_QUOTA",
];

impl ScratchFs {
    /// A fresh `fs_type` filesystem of `size_bytes` (sparse), made with
    /// `mkfs.<fs_type> <mkfs_args> <image>` and mounted with `-o <mount_options>` ("" for
    /// none). Panics when any step fails.
    pub fn new(fs_type: &str, size_bytes: u64, mkfs_args: &[&str], mount_options: &str) -> Self {
        Self::make(fs_type, size_bytes, mkfs_args, mount_options, &[])
            .unwrap_or_else(|why| panic!("{why}"))
    }

    /// [`ScratchFs::new`] for a filesystem with project quota (XFS `prjquota`, ext4 `-O
    /// quota,project`): None, after recording a skip of [`super::skip::PROJECT_QUOTA`], when
    /// the mount fails and the kernel log says this kernel lacks quota support; any other
    /// failure panics.
    pub fn new_with_project_quota(
        fs_type: &str,
        size_bytes: u64,
        mkfs_args: &[&str],
        mount_options: &str,
    ) -> Option<Self> {
        match Self::make(
            fs_type,
            size_bytes,
            mkfs_args,
            mount_options,
            NO_QUOTA_IN_KERNEL,
        ) {
            Ok(fs) => Some(fs),
            Err(why) => {
                super::skip::skip(super::skip::PROJECT_QUOTA, &why);
                None
            }
        }
    }

    /// Err only when the mount fails with a kernel log line containing one of `refusals`.
    fn make(
        fs_type: &str,
        size_bytes: u64,
        mkfs_args: &[&str],
        mount_options: &str,
        refusals: &[&str],
    ) -> Result<Self, String> {
        let mkfs = format!("mkfs.{fs_type}");
        let mkfs = find_tool(&mkfs)
            .unwrap_or_else(|| panic!("{mkfs} is not installed (.ci/run installs it)"));
        let dir = tempfile::Builder::new()
            .prefix(&format!("stickyvol-scratch-{fs_type}-"))
            .tempdir_in("/var/tmp")
            .expect("creating a temp dir under /var/tmp");
        let image = dir.path().join("image");
        let mount_point = dir.path().join("mnt");
        fs::create_dir(&mount_point).expect("creating the mount point");
        File::create(&image)
            .and_then(|f| f.set_len(size_bytes))
            .unwrap_or_else(|e| panic!("creating {}: {e}", image.display()));

        let out = Command::new(&mkfs)
            .args(mkfs_args)
            .arg(&image)
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", mkfs.display()));
        assert!(
            out.status.success(),
            "{} {mkfs_args:?} failed: {}",
            mkfs.display(),
            String::from_utf8_lossy(&out.stderr)
        );

        let mut scratch = ScratchFs {
            mount_point,
            device: PathBuf::new(),
            fs_type: fs_type.to_string(),
            mount_options: mount_options.to_string(),
            dir: Some(dir),
            attached: false,
            mounted: false,
        };
        // From here on, Drop undoes whatever was done.
        let out = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(&image)
            .output()
            .unwrap_or_else(|e| panic!("running losetup: {e}"));
        assert!(
            out.status.success(),
            "losetup --find --show {}: {}",
            image.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        scratch.device = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        scratch.attached = true;

        if let Err(why) = scratch.mount() {
            if refusals.iter().any(|refusal| why.contains(refusal)) {
                return Err(why);
            }
            panic!("{why}");
        }
        Ok(scratch)
    }

    fn mount(&mut self) -> Result<(), String> {
        let mut mount = Command::new("mount");
        mount.args(["-t", &self.fs_type]);
        if !self.mount_options.is_empty() {
            mount.args(["-o", &self.mount_options]);
        }
        let out = mount
            .arg(&self.device)
            .arg(&self.mount_point)
            .output()
            .map_err(|e| format!("running mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t {} -o {:?}: {}{}",
                self.fs_type,
                self.mount_options,
                String::from_utf8_lossy(&out.stderr).trim(),
                kernel_log_about(&self.device)
            ));
        }
        self.mounted = true;
        Ok(())
    }

    /// Shuts the filesystem down the way ext4 and XFS do after fatal I/O errors
    /// (EXT4_IOC_SHUTDOWN / XFS_IOC_GOINGDOWN, without flushing the log): from then on every
    /// write, and every open of a file, fails with EIO, while stat and statvfs still answer.
    pub fn shut_down(&self) {
        // _IOR('X', 125, __u32), the same number for both filesystems.
        const GOING_DOWN: libc::c_ulong = 0x8004_587d;
        const NO_LOG_FLUSH: u32 = 2;
        let root = File::open(&self.mount_point).expect("opening the mount point");
        let flags = NO_LOG_FLUSH;
        // SAFETY: the ioctl reads one u32 that outlives the call.
        let rc = unsafe {
            libc::ioctl(
                std::os::fd::AsRawFd::as_raw_fd(&root),
                GOING_DOWN as _,
                &raw const flags,
            )
        };
        assert_eq!(
            rc,
            0,
            "shutting {} down: {}",
            self.mount_point.display(),
            std::io::Error::last_os_error()
        );
    }

    /// Unmounts and mounts the filesystem again, as a reboot would (e.g. after `shut_down`).
    pub fn remount(&mut self) {
        let out = Command::new("umount")
            .arg(&self.mount_point)
            .output()
            .expect("running umount");
        assert!(
            out.status.success(),
            "umount {}: {}",
            self.mount_point.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        self.mounted = false;
        self.mount()
            .unwrap_or_else(|why| panic!("mounting again: {why}"));
    }

    /// The mount point joined with `relative`.
    pub fn path(&self, relative: &str) -> PathBuf {
        self.mount_point.join(relative)
    }
}

impl Drop for ScratchFs {
    fn drop(&mut self) {
        let mut clean = true;
        if self.mounted {
            let plain = Command::new("umount").arg(&self.mount_point).status();
            if !plain.is_ok_and(|s| s.success()) {
                // Still busy (a file left open by a failed test): detach it from the tree so
                // the device goes away once the last user lets go.
                let lazy = Command::new("umount")
                    .arg("-l")
                    .arg(&self.mount_point)
                    .status();
                if !lazy.is_ok_and(|s| s.success()) {
                    eprintln!("cleanup: cannot unmount {}", self.mount_point.display());
                    clean = false;
                }
            }
        }
        if self.attached && clean {
            // With a lazily unmounted filesystem still open, the kernel detaches on last close.
            let detach = Command::new("losetup").arg("-d").arg(&self.device).status();
            if !detach.is_ok_and(|s| s.success()) {
                eprintln!("cleanup: cannot detach {}", self.device.display());
            }
        }
        if let Some(dir) = self.dir.take() {
            if clean {
                drop(dir); // removes the image and the mount point
            } else {
                // Never recurse into something still mounted: leave it for a human.
                eprintln!("cleanup: leaving {} in place", dir.keep().display());
            }
        }
    }
}

/// What the kernel logged about `device` lately (mount(8) only says "wrong fs type, bad
/// option, ..."), as " [kernel: ...]", or "" when the log cannot be read.
fn kernel_log_about(device: &Path) -> String {
    let Some(name) = device.file_name().and_then(|n| n.to_str()) else {
        return String::new();
    };
    let Ok(out) = Command::new("dmesg").output() else {
        return String::new();
    };
    let tag = format!("({name})");
    let log = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = log.lines().filter(|l| l.contains(&tag)).collect();
    match lines.last() {
        // Drop the "[   12.345678] " timestamp.
        Some(line) => format!(
            " [kernel: {}]",
            line.split_once("] ").map_or(*line, |(_, text)| text)
        ),
        None => String::new(),
    }
}

/// `name` in $PATH or the sbin directories (which a non-login root shell may lack).
fn find_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
