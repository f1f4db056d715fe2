//! IO limits of a pod's cgroup on one block device: cgroup v2's `io.max`, or the v1 blkio
//! controller's `blkio.throttle.{read,write}_{iops,bps}_device`.
//!
//! The pod's cgroup is found by its uid, only where kubelet makes pod cgroups (under a
//! `kubepods` directory, with the cgroupfs or the systemd driver, below any `cgroupRoot`), never
//! by a name a pod chose: the search never enters a pod's or a container's cgroup, where a
//! container allowed to make cgroups could name one after another pod. Everything is opened
//! relative to the directory checked before it, never by a path resolved again.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::dir::{Dir, Type};
use nix::fcntl::{OFlag, openat};
use nix::sys::stat::Mode;

/// Limits on one device; None is "no limit".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoMax {
    pub read_iops: Option<u64>,
    pub write_iops: Option<u64>,
    pub read_bytes_per_second: Option<u64>,
    pub write_bytes_per_second: Option<u64>,
}

/// Which cgroup hierarchy holds the IO controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hierarchy {
    /// cgroup v2: `io.max`.
    V2,
    /// cgroup v1: the blkio controller's throttle files.
    V1,
}

/// A pod's cgroup, held open.
#[derive(Debug)]
pub struct PodCgroup {
    pub hierarchy: Hierarchy,
    /// Where it was found, for messages.
    pub path: PathBuf,
    dir: OwnedFd,
}

/// A block device's number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceNumber {
    pub major: u32,
    pub minor: u32,
}

/// Most directories the search for the `kubepods` directories looks at: a node's cgroup tree
/// outside its pods is small; this bounds the work on one that is not.
const MAX_VISITED: usize = 4096;
/// Most containers' cgroups of one pod that get its limits (a pod has a few).
const MAX_CHILDREN: usize = 256;
/// How deep below the hierarchy's root a `kubepods` directory may be (kubelet's `cgroupRoot`
/// puts it one or two levels down).
const MAX_DEPTH: usize = 3;

impl IoMax {
    pub fn is_unlimited(&self) -> bool {
        *self == IoMax::default()
    }
}

/// The hierarchy under `root` (the host's `/sys/fs/cgroup` as this process sees it) that holds
/// the IO controller, and its root directory; None if there is none.
pub fn io_hierarchy(root: &Path) -> Option<(Hierarchy, PathBuf)> {
    let controllers = std::fs::read_to_string(root.join("cgroup.controllers")).ok();
    if controllers.is_some_and(|c| c.split_whitespace().any(|name| name == "io")) {
        return Some((Hierarchy::V2, root.to_path_buf()));
    }
    let v1 = root.join("blkio");
    v1.join("blkio.throttle.write_iops_device")
        .exists()
        .then_some((Hierarchy::V1, v1))
}

/// The cgroup kubelet made for the pod with uid `uid`, under `root`; None if there is none
/// (yet). More than one is an error: a uid names one pod.
pub fn find_pod(root: &Path, uid: &str) -> io::Result<Option<PodCgroup>> {
    if !is_uid(uid) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{uid:?} is not a pod uid"),
        ));
    }
    let Some((hierarchy, base)) = io_hierarchy(root) else {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "no cgroup hierarchy with the IO controller under {}",
                root.display()
            ),
        ));
    };
    let base_dir = open_dir(None, &base)?
        .ok_or_else(|| io::Error::other(format!("{} is gone", base.display())))?;
    let mut found = Vec::new();
    for (kubepods, path) in kubepods_dirs(base_dir, &base)? {
        for (dir, at) in pod_dirs(kubepods.as_fd(), &path, uid)? {
            found.push(PodCgroup {
                hierarchy,
                path: at,
                dir,
            });
        }
    }
    if found.len() > 1 {
        let paths: Vec<_> = found.iter().map(|c| c.path.display().to_string()).collect();
        return Err(io::Error::other(format!(
            "pod uid {uid} names {} cgroups: {}",
            found.len(),
            paths.join(", ")
        )));
    }
    Ok(found.pop())
}

/// Sets `limits` for `device` on `cgroup` (a limit left None removes any set before). Under
/// cgroup v1 on its containers' cgroups too: v1's throttling does not reach down the hierarchy,
/// and a pod's processes run in its containers' cgroups (which kubelet makes after the volumes:
/// `set_limits` again once they exist, as `Volumes::keep_io_limits` does).
pub fn set_limits(cgroup: &PodCgroup, device: DeviceNumber, limits: &IoMax) -> io::Result<()> {
    set_own_limits(cgroup, device, limits)?;
    if cgroup.hierarchy == Hierarchy::V1 {
        for child in children(cgroup)? {
            set_own_limits(&child, device, limits)?;
        }
    }
    Ok(())
}

/// The cgroups directly below `cgroup` (a pod's containers), at most `MAX_CHILDREN`.
pub fn children(cgroup: &PodCgroup) -> io::Result<Vec<PodCgroup>> {
    let mut found = Vec::new();
    for name in subdirectories(cgroup.dir.as_fd())?
        .into_iter()
        .take(MAX_CHILDREN)
    {
        if let Some(dir) = open_dir(Some(cgroup.dir.as_fd()), Path::new(&name))? {
            found.push(PodCgroup {
                hierarchy: cgroup.hierarchy,
                path: cgroup.path.join(&name),
                dir,
            });
        }
    }
    Ok(found)
}

fn set_own_limits(cgroup: &PodCgroup, device: DeviceNumber, limits: &IoMax) -> io::Result<()> {
    let dev = format!("{}:{}", device.major, device.minor);
    match cgroup.hierarchy {
        Hierarchy::V2 => {
            let value = |limit: Option<u64>| limit.map_or("max".to_string(), |l| l.to_string());
            let line = format!(
                "{dev} rbps={} wbps={} riops={} wiops={}",
                value(limits.read_bytes_per_second),
                value(limits.write_bytes_per_second),
                value(limits.read_iops),
                value(limits.write_iops)
            );
            write_file(cgroup, "io.max", &line)
        }
        // v1 removes a device's rule when its value is 0.
        Hierarchy::V1 => V1_FILES.iter().try_for_each(|(file, field)| {
            let value = field(limits).unwrap_or(0);
            write_file(cgroup, file, &format!("{dev} {value}"))
        }),
    }
}

/// The limits `cgroup` has for `device` now.
pub fn limits_of(cgroup: &PodCgroup, device: DeviceNumber) -> io::Result<IoMax> {
    let dev = format!("{}:{}", device.major, device.minor);
    let mut limits = IoMax::default();
    match cgroup.hierarchy {
        Hierarchy::V2 => {
            let text = read_file(cgroup, "io.max")?;
            let Some(line) = text.lines().find(|l| l.split(' ').next() == Some(&dev)) else {
                return Ok(limits);
            };
            for pair in line.split(' ').skip(1) {
                let Some((key, value)) = pair.split_once('=') else {
                    continue;
                };
                let value = value.parse().ok();
                match key {
                    "rbps" => limits.read_bytes_per_second = value,
                    "wbps" => limits.write_bytes_per_second = value,
                    "riops" => limits.read_iops = value,
                    "wiops" => limits.write_iops = value,
                    _ => {}
                }
            }
        }
        Hierarchy::V1 => {
            for (file, _) in V1_FILES {
                let text = read_file(cgroup, file)?;
                let value = (text.lines())
                    .filter_map(|l| l.split_once(' '))
                    .find(|(d, _)| *d == dev)
                    .and_then(|(_, v)| v.trim().parse().ok())
                    // 0 is how v1 is told "no limit".
                    .filter(|&v: &u64| v > 0);
                *v1_field_mut(&mut limits, file) = value;
            }
        }
    }
    Ok(limits)
}

/// The number of the block device `name` (`loop3`), from sysfs. A name that is not one plain
/// file name is refused before it reaches a path.
pub fn device_number(name: &str) -> io::Result<DeviceNumber> {
    let plain = !name.is_empty() && !name.starts_with('.') && !name.contains('/');
    if !plain {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not a block device's name"),
        ));
    }
    let text = std::fs::read_to_string(Path::new("/sys/class/block").join(name).join("dev"))?;
    let parse = |s: Option<&str>| s.and_then(|s| s.trim().parse().ok());
    let mut parts = text.split(':');
    match (parse(parts.next()), parse(parts.next())) {
        (Some(major), Some(minor)) => Ok(DeviceNumber { major, minor }),
        _ => Err(io::Error::other(format!(
            "/sys/class/block/{name}/dev says {text:?}"
        ))),
    }
}

type Field = fn(&IoMax) -> Option<u64>;

const V1_FILES: [(&str, Field); 4] = [
    ("blkio.throttle.read_iops_device", |l| l.read_iops),
    ("blkio.throttle.write_iops_device", |l| l.write_iops),
    ("blkio.throttle.read_bps_device", |l| {
        l.read_bytes_per_second
    }),
    ("blkio.throttle.write_bps_device", |l| {
        l.write_bytes_per_second
    }),
];

fn v1_field_mut<'a>(limits: &'a mut IoMax, file: &str) -> &'a mut Option<u64> {
    match file {
        "blkio.throttle.read_iops_device" => &mut limits.read_iops,
        "blkio.throttle.write_iops_device" => &mut limits.write_iops,
        "blkio.throttle.read_bps_device" => &mut limits.read_bytes_per_second,
        _ => &mut limits.write_bytes_per_second,
    }
}

/// A Kubernetes uid: hex digits and dashes, nothing a path could use.
fn is_uid(uid: &str) -> bool {
    (1..=64).contains(&uid.len()) && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

/// A directory kubelet makes for a pod, or a container's (cgroupfs `pod<uid>`, systemd
/// `kubepods-…-pod<uid>.slice`, runtimes' `cri-containerd-….scope`, or a container id): never
/// entered while looking for `kubepods`.
fn is_pod_or_container(name: &str) -> bool {
    name.starts_with("pod")
        || name.contains("-pod")
        || name.ends_with(".scope")
        || (name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The `kubepods` directories (cgroupfs `kubepods`, systemd `kubepods.slice`) within
/// `MAX_DEPTH` levels of `base`, breadth first, looking at most at `MAX_VISITED` directories.
fn kubepods_dirs(base: OwnedFd, base_path: &Path) -> io::Result<Vec<(OwnedFd, PathBuf)>> {
    let mut found = Vec::new();
    let mut level = vec![(base, base_path.to_path_buf())];
    let mut visited = 0;
    for _ in 0..MAX_DEPTH {
        let mut next = Vec::new();
        for (dir, path) in level {
            for name in subdirectories(dir.as_fd())? {
                visited += 1;
                if visited > MAX_VISITED {
                    return Err(io::Error::other(format!(
                        "more than {MAX_VISITED} cgroups looked at under {} without finding where kubelet keeps pods",
                        base_path.display()
                    )));
                }
                let Some(child) = open_dir(Some(dir.as_fd()), Path::new(&name))? else {
                    continue;
                };
                let child_path = path.join(&name);
                if name == "kubepods" || name == "kubepods.slice" {
                    found.push((child, child_path));
                } else if !is_pod_or_container(&name.to_string_lossy()) {
                    next.push((child, child_path));
                }
            }
        }
        level = next;
    }
    Ok(found)
}

/// The pod directories for `uid` in the `kubepods` directory `kubepods`: its own child (the
/// Guaranteed class) or its `burstable` / `besteffort` child's, by either driver's naming.
fn pod_dirs(
    kubepods: BorrowedFd<'_>,
    path: &Path,
    uid: &str,
) -> io::Result<Vec<(OwnedFd, PathBuf)>> {
    let systemd = path.file_name() == Some(OsStr::new("kubepods.slice"));
    let underscored = uid.replace('-', "_");
    let mut found = Vec::new();
    let classes: [Option<&str>; 3] = [None, Some("burstable"), Some("besteffort")];
    for class in classes {
        let (class_dir, pod_name) = match (systemd, class) {
            (false, None) => (None, format!("pod{uid}")),
            (false, Some(class)) => (Some(class.to_string()), format!("pod{uid}")),
            (true, None) => (None, format!("kubepods-pod{underscored}.slice")),
            (true, Some(class)) => (
                Some(format!("kubepods-{class}.slice")),
                format!("kubepods-{class}-pod{underscored}.slice"),
            ),
        };
        let (parent, parent_path) = match &class_dir {
            None => (None, path.to_path_buf()),
            Some(name) => match open_dir(Some(kubepods), Path::new(name))? {
                Some(fd) => (Some(fd), path.join(name)),
                None => continue,
            },
        };
        let parent_fd = parent.as_ref().map_or(kubepods, |fd| fd.as_fd());
        if let Some(pod) = open_dir(Some(parent_fd), Path::new(&pod_name))? {
            found.push((pod, parent_path.join(pod_name)));
        }
    }
    Ok(found)
}

/// The names of the directories in `dir`.
fn subdirectories(dir: BorrowedFd<'_>) -> io::Result<Vec<std::ffi::OsString>> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let mut listing = Dir::openat(dir, ".", flags, Mode::empty())?;
    let mut names = Vec::new();
    for entry in listing.iter() {
        let entry = entry?;
        let name = OsStr::from_bytes(entry.file_name().to_bytes());
        if entry.file_type() == Some(Type::Directory) && name != "." && name != ".." {
            names.push(name.to_os_string());
        }
    }
    Ok(names)
}

/// Opens the directory `name` (in `dir`, or from the root when None) without following a
/// symlink; None if it is not there.
fn open_dir(dir: Option<BorrowedFd<'_>>, name: &Path) -> io::Result<Option<OwnedFd>> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let opened = match dir {
        Some(dir) => openat(dir, name, flags, Mode::empty()),
        None => nix::fcntl::open(name, flags, Mode::empty()),
    };
    match opened {
        Ok(fd) => Ok(Some(fd)),
        Err(nix::Error::ENOENT) => Ok(None),
        Err(err) => Err(io::Error::other(format!(
            "opening {}: {err}",
            name.display()
        ))),
    }
}

fn open_file(cgroup: &PodCgroup, file: &str, flags: OFlag) -> io::Result<File> {
    let flags = flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    openat(cgroup.dir.as_fd(), file, flags, Mode::empty())
        .map(File::from)
        .map_err(|err| {
            io::Error::other(format!(
                "opening {}: {err}",
                cgroup.path.join(file).display()
            ))
        })
}

/// One write, as the kernel wants a cgroup file's line.
fn write_file(cgroup: &PodCgroup, file: &str, line: &str) -> io::Result<()> {
    let mut opened = open_file(cgroup, file, OFlag::O_WRONLY)?;
    opened.write_all(line.as_bytes()).map_err(|err| {
        io::Error::new(
            err.kind(),
            format!(
                "writing {line:?} to {}: {err}",
                cgroup.path.join(file).display()
            ),
        )
    })
}

fn read_file(cgroup: &PodCgroup, file: &str) -> io::Result<String> {
    let mut text = String::new();
    open_file(cgroup, file, OFlag::O_RDONLY)?.read_to_string(&mut text)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0f6c1a52-1b7e-4c54-9d7e-2c1f3e0b9a11";

    /// A cgroup v1 tree of regular files and directories, as the search sees one.
    fn v1_tree(dirs: &[&str]) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        let blkio = root.path().join("blkio");
        std::fs::create_dir(&blkio).unwrap();
        std::fs::write(blkio.join("blkio.throttle.write_iops_device"), "").unwrap();
        for dir in dirs {
            std::fs::create_dir_all(blkio.join(dir)).unwrap();
        }
        root
    }

    fn found(root: &Path) -> Option<PathBuf> {
        let base = root.join("blkio");
        (find_pod(root, UID).unwrap()).map(|c| c.path.strip_prefix(&base).unwrap().to_path_buf())
    }

    #[test]
    fn a_pod_is_found_by_uid_where_either_driver_puts_it_below_any_cgroup_root() {
        let underscored = UID.replace('-', "_");
        let layouts = [
            format!("kubepods/pod{UID}"),
            format!("kubepods/burstable/pod{UID}"),
            format!("node-a/kubepods/besteffort/pod{UID}"),
            format!("kubepods.slice/kubepods-pod{underscored}.slice"),
            format!(
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{underscored}.slice"
            ),
        ];
        for layout in layouts {
            let root = v1_tree(&[&layout, "kubepods/burstable/podother", "system.slice/x"]);
            assert_eq!(found(root.path()), Some(PathBuf::from(&layout)), "{layout}");
        }
    }

    #[test]
    fn a_cgroup_named_after_a_pod_inside_another_pod_or_outside_kubepods_is_not_it() {
        let decoys = [
            format!("kubepods/burstable/podother/evil/kubepods/pod{UID}"),
            format!("kubepods/burstable/podother/kubepods/pod{UID}"),
            format!("pod{UID}"),
            format!("elsewhere/pod{UID}"),
            format!("a/b/c/kubepods/pod{UID}"),
        ];
        for decoy in decoys {
            let root = v1_tree(&[&decoy]);
            assert_eq!(found(root.path()), None, "{decoy}");
        }
    }

    #[test]
    fn two_cgroups_for_one_uid_are_an_error_and_a_uid_is_never_a_path() {
        let root = v1_tree(&[
            &format!("node-a/kubepods/pod{UID}"),
            &format!("node-b/kubepods/burstable/pod{UID}"),
        ]);
        let err = find_pod(root.path(), UID).unwrap_err();
        assert!(err.to_string().contains("names 2 cgroups"), "{err}");
        for uid in ["../x", "a/b", "", "pod"] {
            assert!(find_pod(root.path(), uid).is_err(), "{uid:?}");
        }
    }

    #[test]
    fn a_symlink_in_the_tree_is_not_followed() {
        let root = v1_tree(&["real/kubepods/burstable"]);
        let blkio = root.path().join("blkio");
        std::fs::create_dir(
            blkio
                .join("real/kubepods/burstable")
                .join(format!("pod{UID}")),
        )
        .unwrap();
        std::os::unix::fs::symlink(blkio.join("real/kubepods"), blkio.join("kubepods")).unwrap();
        // Found once, through the real directory only.
        assert_eq!(
            found(root.path()),
            Some(PathBuf::from(format!("real/kubepods/burstable/pod{UID}")))
        );
    }

    #[test]
    fn a_device_name_is_never_a_path() {
        for name in ["", "..", "../../etc", "loop0/../x", ".hidden"] {
            let err = device_number(name).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{name:?}");
        }
        // A real one, where sysfs shows loop devices.
        if Path::new("/sys/class/block/loop0/dev").exists() {
            assert_eq!(device_number("loop0").unwrap().major, 7);
        }
    }

    #[test]
    fn limits_are_written_as_each_hierarchy_reads_them() {
        let root = v1_tree(&[&format!("kubepods/pod{UID}")]);
        let cgroup = find_pod(root.path(), UID).unwrap().unwrap();
        for (name, _) in V1_FILES {
            std::fs::write(cgroup.path.join(name), "").unwrap();
        }
        let dev = DeviceNumber { major: 7, minor: 3 };
        let limits = IoMax {
            write_iops: Some(200),
            read_bytes_per_second: Some(1 << 20),
            ..IoMax::default()
        };
        set_limits(&cgroup, dev, &limits).unwrap();
        let file = |name: &str| std::fs::read_to_string(cgroup.path.join(name)).unwrap();
        assert_eq!(file("blkio.throttle.write_iops_device"), "7:3 200");
        assert_eq!(file("blkio.throttle.read_iops_device"), "7:3 0");
        assert_eq!(limits_of(&cgroup, dev).unwrap(), limits);

        let v2 = PodCgroup {
            hierarchy: Hierarchy::V2,
            path: cgroup.path.clone(),
            dir: open_dir(None, &cgroup.path).unwrap().unwrap(),
        };
        std::fs::write(cgroup.path.join("io.max"), "").unwrap();
        set_limits(&v2, dev, &limits).unwrap();
        assert_eq!(
            file("io.max"),
            "7:3 rbps=1048576 wbps=max riops=max wiops=200"
        );
        assert_eq!(limits_of(&v2, dev).unwrap(), limits);
    }
}
