//! A hostile tenant: the test plays the pod, shaping what it may shape (its volume's tree),
//! and the driver runs in a memory cgroup (v1 or v2) limited as the DaemonSet limits it
//! (256 MiB). Each case asserts that the driver stays up, answers Probe within a second while
//! it works on the tenant's tree, keeps its peak RSS (VmHWM) under `RSS_BOUND`, and refuses
//! what goes past its documented limits with an error that names the limit.

mod common;

use std::ffi::CString;
use std::fs;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::fcntl::{OFlag, open, openat};
use nix::sys::stat::{Mode as FileMode, mkdirat};
use nix::unistd::linkat;
use tonic::{Code, Status};

use common::csi;
use common::scratchfs::ScratchFs;
use common::*;

/// The DaemonSet's memory limit for the driver container.
const CGROUP_LIMIT: u64 = 256 << 20;
/// What the driver may reach at its peak in any case here.
const RSS_BOUND: u64 = 128 << 20;
/// How long Probe may take while the driver works on a tenant's tree.
const PROBE_BOUND: Duration = Duration::from_secs(1);
/// `tree::MAX_DEPTH` (the library's walks enter no deeper).
const MAX_DEPTH: usize = stickyvol::host::tree::MAX_DEPTH;

/// A memory cgroup of its own for the driver (cgroup v1's memory controller, or cgroup v2's
/// unified tree with the memory controller enabled for its children); removed on drop.
struct MemoryCgroup {
    dir: PathBuf,
    /// Where its processes go back to.
    parent: PathBuf,
    files: MemoryFiles,
}

/// The same three things under each version's names.
struct MemoryFiles {
    limit: &'static str,
    peak: &'static str,
    /// The file with an `oom_kill N` line.
    events: &'static str,
}

const V1: MemoryFiles = MemoryFiles {
    limit: "memory.limit_in_bytes",
    peak: "memory.max_usage_in_bytes",
    events: "memory.oom_control",
};
const V2: MemoryFiles = MemoryFiles {
    limit: "memory.max",
    peak: "memory.peak",
    events: "memory.events",
};

impl MemoryCgroup {
    fn new(limit: u64) -> Option<MemoryCgroup> {
        let (parent, files) = match memory_root() {
            Some(found) => found,
            None => {
                eprintln!("no memory cgroup controller: the driver runs without a memory limit");
                return None;
            }
        };
        let dir = parent.join(format!(
            "stickyvol-hostile-{}-{}",
            std::process::id(),
            new_name()
        ));
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join(files.limit), limit.to_string()).unwrap();
        eprintln!("the driver runs in {} ({} MiB)", dir.display(), limit >> 20);
        Some(MemoryCgroup { dir, parent, files })
    }

    fn add(&self, pid: u32) {
        fs::write(self.dir.join("cgroup.procs"), pid.to_string()).unwrap();
    }

    /// The most memory the cgroup was charged, the kernel's for its processes included.
    fn peak_usage(&self) -> u64 {
        let text = fs::read_to_string(self.dir.join(self.files.peak)).unwrap();
        text.trim().parse().unwrap()
    }

    /// What the cgroup is charged for (its memory.stat's chief lines), to explain a kill.
    fn charges(&self) -> String {
        let stat = fs::read_to_string(self.dir.join("memory.stat")).unwrap_or_default();
        let wanted = [
            "anon",
            "rss",
            "file",
            "cache",
            "kernel",
            "slab_reclaimable",
            "shmem",
        ];
        let lines = stat.lines().filter(|line| {
            let key = line.split_whitespace().next().unwrap_or_default();
            wanted.contains(&key)
        });
        lines.collect::<Vec<_>>().join(", ")
    }

    fn oom_kills(&self) -> u64 {
        let events = fs::read_to_string(self.dir.join(self.files.events)).unwrap();
        events
            .lines()
            .find_map(|line| line.strip_prefix("oom_kill "))
            .map_or(0, |n| n.trim().parse().unwrap())
    }
}

/// Where a memory cgroup can be made: cgroup v1's memory hierarchy, or the root of a cgroup v2
/// tree, its memory controller enabled for children (allowed at the root, which may hold
/// processes itself) and `memory.peak` there (Linux 5.19).
fn memory_root() -> Option<(PathBuf, MemoryFiles)> {
    let v1 = Path::new("/sys/fs/cgroup/memory");
    if v1.join("cgroup.procs").exists() {
        return Some((v1.to_path_buf(), V1));
    }
    let v2 = Path::new("/sys/fs/cgroup");
    let controllers = fs::read_to_string(v2.join("cgroup.controllers")).ok()?;
    if !controllers.split_whitespace().any(|c| c == "memory") {
        return None;
    }
    fs::write(v2.join("cgroup.subtree_control"), "+memory").ok()?;
    Some((v2.to_path_buf(), V2))
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        let procs = fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines() {
            let _ = fs::write(self.parent.join("cgroup.procs"), pid);
        }
        let _ = fs::remove_dir(&self.dir);
    }
}

/// A driver in its memory cgroup.
struct Confined {
    driver: TestDriver,
    cgroup: Option<MemoryCgroup>,
}

impl Confined {
    async fn start(extra_args: &[String]) -> Confined {
        let mut driver = TestDriver::prepare(Options::default());
        driver.add_args(extra_args.iter().cloned());
        Confined::start_prepared(driver).await
    }

    /// `driver` (stopped, as `TestDriver::prepare` makes it) started and confined.
    async fn start_prepared(mut driver: TestDriver) -> Confined {
        driver.start_again().await;
        let cgroup = MemoryCgroup::new(CGROUP_LIMIT);
        let confined = Confined { driver, cgroup };
        confined.confine();
        confined
    }

    fn confine(&self) {
        if let Some(cgroup) = &self.cgroup {
            cgroup.add(self.driver.pid());
        }
    }

    async fn restart(&mut self) {
        self.driver.restart().await;
        self.confine();
    }

    /// The driver's peak resident memory so far (VmHWM), in bytes.
    fn peak_rss(&self) -> u64 {
        let status = fs::read_to_string(format!("/proc/{}/status", self.driver.pid())).unwrap();
        let kib: u64 = status
            .lines()
            .find_map(|line| line.strip_prefix("VmHWM:"))
            .and_then(|rest| rest.trim().strip_suffix("kB"))
            .map(|n| n.trim().parse().unwrap())
            .expect("VmHWM in /proc/PID/status");
        kib << 10
    }

    /// The cgroup's OOM kills and charges, for a failure's message.
    fn memory_report(&self) -> String {
        match &self.cgroup {
            Some(cgroup) => format!(
                "OOM kills in the driver's cgroup: {}; charged: {}",
                cgroup.oom_kills(),
                cgroup.charges()
            ),
            None => "no memory cgroup".to_string(),
        }
    }

    /// Up, never OOM-killed, under the RSS bound; prints the peak for the record.
    fn assert_unharmed(&mut self, case: &str) {
        let report = self.memory_report();
        assert!(
            self.driver.is_running(),
            "{case}: the driver died ({report})"
        );
        if let Some(cgroup) = &self.cgroup {
            assert_eq!(cgroup.oom_kills(), 0, "{case}: {report}");
        }
        let peak = self.peak_rss();
        eprintln!("{case}: peak RSS {} MiB", peak >> 20);
        assert!(
            peak < RSS_BOUND,
            "{case}: peak RSS {} MiB, over {} MiB",
            peak >> 20,
            RSS_BOUND >> 20
        );
    }

    async fn probe_in_time(&self) {
        let started = Instant::now();
        self.driver
            .identity()
            .probe(csi::ProbeRequest {})
            .await
            .unwrap();
        let took = started.elapsed();
        assert!(took < on_this_machine(PROBE_BOUND), "Probe took {took:?}");
    }

    /// CreateSnapshot repeated as csi-snapshotter repeats it, with a timed Probe between calls,
    /// until the snapshot is ready (Ok) or the driver gives an error other than ABORTED.
    async fn snapshot(&self, volume_id: &str) -> Result<csi::Snapshot, Status> {
        let request = snapshot_request(&new_snapshot_name(), volume_id);
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            match self.driver.create_snapshot(request.clone()).await {
                Ok(snapshot) if snapshot.ready_to_use => return Ok(snapshot),
                Ok(_) => {}
                Err(status) if status.code() == Code::Aborted => {}
                Err(status) => return Err(status),
            }
            self.probe_in_time().await;
            assert!(Instant::now() < deadline, "snapshot not done in 300 s");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn stats_in_time(
        &self,
        volume: &csi::Volume,
        target: &Path,
    ) -> csi::NodeGetVolumeStatsResponse {
        let probing = async {
            loop {
                self.probe_in_time().await;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        tokio::select! {
            stats = self.driver.stats(&volume.volume_id, target.to_str().unwrap()) => stats.unwrap(),
            () = probing => unreachable!(),
        }
    }
}

fn dir_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

/// Below `top`, a chain of `depth` directories named `name`, made level by level as a pod can
/// (the whole path may be far beyond PATH_MAX); the deepest one, open.
fn chain(top: &Path, depth: usize, name: &str) -> OwnedFd {
    let mut dir = open(top, dir_flags(), FileMode::empty()).unwrap();
    for _ in 0..depth {
        mkdirat(dir.as_fd(), name, FileMode::S_IRWXU).unwrap();
        dir = openat(dir.as_fd(), name, dir_flags(), FileMode::empty()).unwrap();
    }
    dir
}

/// `/proc/self/fd/N/name` for a file in an open directory.
fn in_dir(dir: &OwnedFd, name: &str) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}/{name}", dir.as_raw_fd()))
}

#[tokio::test]
async fn a_deep_tree_of_long_names_with_hard_links_is_snapshot_in_bounded_memory() {
    let mut confined = Confined::start(&[]).await;
    let (volume, target) = confined.driver.published_fs_volume().await;
    // As the issue found it: 1,000 levels of 255-byte names, 1,500 hard-linked pairs at the
    // bottom (before: the copy kept each link's ~256 KiB path, 390 MB at its peak).
    let name = "d".repeat(255);
    let bottom = chain(&target, 1000, &name);
    for i in 0..1500 {
        fs::write(in_dir(&bottom, &format!("f{i}")), b"x").unwrap();
        let (first, second) = (
            CString::new(format!("f{i}")).unwrap(),
            CString::new(format!("g{i}")).unwrap(),
        );
        linkat(
            bottom.as_fd(),
            first.as_c_str(),
            bottom.as_fd(),
            second.as_c_str(),
            nix::fcntl::AtFlags::empty(),
        )
        .unwrap();
    }
    drop(bottom);

    let snapshot = confined.snapshot(&volume.volume_id).await.unwrap();
    confined.stats_in_time(&volume, &target).await;
    confined.assert_unharmed("deep tree with hard links");

    // The copy kept the links: a restore's pairs are one inode each.
    let request = csi::CreateVolumeRequest {
        volume_content_source: Some(from_snapshot(&snapshot.snapshot_id)),
        ..create_request(&new_name(), mount_cap(Mode::SingleNodeWriter), 1 << 30)
    };
    let restored = confined.driver.create(request).await;
    let restored_target = confined
        .driver
        .publish_at_new_target(&restored, mount_cap(Mode::SingleNodeWriter))
        .await;
    let copy_bottom = {
        let mut dir = open(&restored_target, dir_flags(), FileMode::empty()).unwrap();
        for _ in 0..1000 {
            dir = openat(dir.as_fd(), name.as_str(), dir_flags(), FileMode::empty()).unwrap();
        }
        dir
    };
    use std::os::unix::fs::MetadataExt;
    let first = fs::metadata(in_dir(&copy_bottom, "f7")).unwrap();
    let second = fs::metadata(in_dir(&copy_bottom, "g7")).unwrap();
    assert_eq!((first.ino(), first.nlink()), (second.ino(), 2));
    drop(copy_bottom);
    confined.assert_unharmed("restore of the deep tree");
    confined
        .driver
        .unpublish_ok(&restored, &restored_target)
        .await;
    confined.driver.delete(&restored.volume_id).await.unwrap();
    confined.driver.unpublish_ok(&volume, &target).await;
    confined.driver.delete(&volume.volume_id).await.unwrap();
}

#[tokio::test]
async fn hundreds_of_thousands_of_names_in_one_directory_cost_no_memory_to_walk() {
    let mut confined = Confined::start(&[]).await;
    let (volume, target) = confined.driver.published_fs_volume().await;
    // Before: NodeGetVolumeStats peaked at 104 MB, a snapshot at 199 MB.
    let wide = target.join("wide");
    fs::create_dir(&wide).unwrap();
    let long = "n".repeat(200);
    for i in 0..400_000 {
        fs::File::create(wide.join(format!("{i}{long}"))).unwrap();
    }
    let stats = confined.stats_in_time(&volume, &target).await;
    let inodes = stats
        .usage
        .iter()
        .find(|u| u.unit == csi::volume_usage::Unit::Inodes as i32)
        .map(|u| u.used);
    eprintln!("inodes used: {inodes:?}");
    confined.assert_unharmed("NodeGetVolumeStats of 400,000 names");
    confined.snapshot(&volume.volume_id).await.unwrap();
    confined.assert_unharmed("snapshot of 400,000 names");
    confined.driver.unpublish_ok(&volume, &target).await;
    confined.driver.delete(&volume.volume_id).await.unwrap();
    confined.restart().await;
    confined.probe_in_time().await;
}

#[tokio::test]
async fn a_tree_deeper_than_walks_enter_is_refused_by_name_and_still_deleted() {
    let mut confined = Confined::start(&[]).await;
    let (volume, target) = confined.driver.published_fs_volume().await;
    drop(chain(&target, MAX_DEPTH + 100, "d"));

    let err = confined.snapshot(&volume.volume_id).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message()
            .contains(&format!("more than {MAX_DEPTH} levels deep")),
        "{err:?}"
    );
    confined.assert_unharmed("snapshot of a tree too deep");
    confined.driver.unpublish_ok(&volume, &target).await;
    // Deletion cuts the chain into pieces it can walk.
    confined.driver.delete(&volume.volume_id).await.unwrap();
    assert!(!host_path(&volume).exists());
    confined.restart().await;
    confined.probe_in_time().await;
    confined.assert_unharmed("restart after the deep tree");
}

#[tokio::test]
async fn xattrs_past_the_bound_are_refused_by_name() {
    // XFS holds many large xattrs on one inode (ext4 holds a block's worth).
    let fs = ScratchFs::new("xfs", 512 << 20, &["-q"], "");
    let pool = fs.mount_point.join("pool");
    let mut confined = Confined::start(&["--pool".into(), format!("xfs={}", pool.display())]).await;
    let mut request = create_request(&new_name(), mount_cap(Mode::SingleNodeWriter), 64 << 20);
    request.parameters = params(&[("pool", "xfs")]);
    let volume = confined.driver.create(request).await;
    let target = confined
        .driver
        .publish_at_new_target(&volume, mount_cap(Mode::SingleNodeWriter))
        .await;
    let bomb = target.join("bomb");
    fs::write(&bomb, b"x").unwrap();
    let value = vec![7u8; 60 << 10];
    for i in 0..40 {
        fidelity::set_xattr(&bomb, &format!("user.big{i}"), &value);
    }

    let err = confined.snapshot(&volume.volume_id).await.unwrap_err();
    assert!(err.message().contains("xattrs hold more than"), "{err:?}");
    confined.assert_unharmed("xattrs past the bound");
    confined.driver.unpublish_ok(&volume, &target).await;
    confined.driver.delete(&volume.volume_id).await.unwrap();
}

/// An export stream written by hand, as a hostile client would: frames in the documented
/// format (src/host/archive/mod.rs) and a trailer whose checksum is wrong, so that whatever
/// the importer holds, it holds it before the trailer could refuse the stream.
struct HostileStream {
    bytes: Vec<u8>,
}

impl HostileStream {
    fn new() -> HostileStream {
        let mut stream = HostileStream {
            bytes: b"stickyvol-export".to_vec(),
        };
        stream.bytes.extend_from_slice(&1u32.to_le_bytes());
        let header = br#"{"kind":"tree","allocated_bytes":0,"size_bytes":0,"source":"bomb","created_unix_ms":0}"#;
        stream.frame(b'H', header);
        stream
    }

    fn frame(&mut self, tag: u8, payload: &[u8]) {
        self.bytes.push(tag);
        self.bytes
            .extend_from_slice(&u32::try_from(payload.len()).unwrap().to_le_bytes());
        self.bytes.extend_from_slice(payload);
    }

    fn name(payload: &mut Vec<u8>, name: &str) {
        payload.push(u8::try_from(name.len()).unwrap());
        payload.extend_from_slice(name.as_bytes());
    }

    /// mode, uid, gid, rdev, atime, mtime, no xattrs.
    fn meta(payload: &mut Vec<u8>, mode: u32) {
        for field in [mode, 0, 0] {
            payload.extend_from_slice(&field.to_le_bytes());
        }
        payload.extend_from_slice(&0u64.to_le_bytes());
        for _ in 0..2 {
            payload.extend_from_slice(&0i64.to_le_bytes());
            payload.extend_from_slice(&0u32.to_le_bytes());
        }
        payload.extend_from_slice(&0u32.to_le_bytes());
    }

    fn dir(&mut self, name: &str) {
        let mut payload = Vec::new();
        Self::name(&mut payload, name);
        self.frame(b'D', &payload);
    }

    fn end_dir(&mut self) {
        let mut payload = Vec::new();
        Self::meta(&mut payload, libc::S_IFDIR | 0o755);
        self.frame(b'E', &payload);
    }

    /// An empty regular file; `link_id` not 0 announces `later` more names to come.
    fn file(&mut self, name: &str, link_id: u64, later: u32) {
        let mut payload = Vec::new();
        Self::name(&mut payload, name);
        payload.extend_from_slice(&0u64.to_le_bytes());
        payload.extend_from_slice(&link_id.to_le_bytes());
        payload.extend_from_slice(&later.to_le_bytes());
        Self::meta(&mut payload, libc::S_IFREG | 0o644);
        self.frame(b'F', &payload);
        self.frame(b'Z', &[]);
    }

    fn fifo(&mut self, name: &str) {
        let mut payload = Vec::new();
        Self::name(&mut payload, name);
        Self::meta(&mut payload, libc::S_IFIFO | 0o644);
        self.frame(b'N', &payload);
    }

    /// The trailer, with a checksum of zeros, into a file under /var/tmp.
    fn finish(mut self, entries: u64) -> tempfile::NamedTempFile {
        let mut payload = vec![0u8; 32];
        payload.extend_from_slice(&entries.to_le_bytes());
        payload.extend_from_slice(&0u64.to_le_bytes());
        self.frame(b'T', &payload);
        let mut file = tempfile::NamedTempFile::new_in("/var/tmp").unwrap();
        std::io::Write::write_all(&mut file, &self.bytes).unwrap();
        file
    }
}

/// `stickyvol volume import ID < stream` against the confined driver; it must fail: stderr.
fn import_refused(driver: &TestDriver, volume_id: &str, stream: &Path) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_stickyvol"))
        .args(["volume", "import", volume_id, "--quiet"])
        .env("ADMIN_SOCKET", &driver.admin_socket)
        .stdin(fs::File::open(stream).unwrap())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "import should fail: {stderr}");
    stderr
}

/// Import streams built to exhaust the driver: refused at our bounds, the driver never
/// OOM-killed. The first makes 262,154 empty files (and as many spare names) before its bound:
/// on cgroup v2 their inodes are charged to the driver, and before it set its cgroup's
/// `memory.high` below the limit (`host::cgroup::soften_memory_limit`) Debian 12's kernel
/// OOM-killed it at 256 MiB.
#[tokio::test]
async fn import_stream_bombs_are_refused_in_bounded_memory() {
    let mut confined = Confined::start(&[]).await;
    let links_bound = stickyvol::host::links::MAX_WAITING_LINKS;

    // Hard links announced and never given, at the bottom of 1,000 levels of 255-byte names
    // (before: the importer kept a full path, ~256 KiB here, for each such file).
    let volume = confined
        .driver
        .create(create_request(
            &new_name(),
            mount_cap(Mode::SingleNodeWriter),
            1 << 30,
        ))
        .await;
    let mut links = HostileStream::new();
    let name = "d".repeat(255);
    for _ in 0..1000 {
        links.dir(&name);
    }
    let files = links_bound + 10;
    for i in 0..files {
        links.file(&format!("f{i}"), i as u64 + 1, u32::MAX);
    }
    let stream = links.finish(0);
    let err = import_refused(&confined.driver, &volume.volume_id, stream.path());
    assert!(
        err.contains(&format!(
            "more than {links_bound} hard-linked files await their other names"
        )),
        "{err}\n{}",
        confined.memory_report()
    );
    confined.probe_in_time().await;
    confined.assert_unharmed("import of a stream of unfinished hard links");

    // Empty entries far beyond what the volume's capacity allows (no block quota counts
    // inodes): refused at the allowance, before the one too many is made.
    let small = confined
        .driver
        .create(create_request(
            &new_name(),
            mount_cap(Mode::SingleNodeWriter),
            64 << 20,
        ))
        .await;
    let allowance = stickyvol::host::archive::entry_limit(64 << 20);
    let mut fifos = HostileStream::new();
    for i in 0..allowance * 4 {
        fifos.fifo(&format!("p{i}"));
    }
    fifos.end_dir();
    let stream = fifos.finish(allowance * 4);
    let err = import_refused(&confined.driver, &small.volume_id, stream.path());
    assert!(
        err.contains(&format!("more than {allowance} entries")),
        "{err}\n{}",
        confined.memory_report()
    );
    confined.probe_in_time().await;
    confined.assert_unharmed("import of more entries than the volume allows");

    // Both volumes were emptied again and serve.
    for volume in [volume, small] {
        let target = confined
            .driver
            .publish_at_new_target(&volume, mount_cap(Mode::SingleNodeWriter))
            .await;
        assert_eq!(fs::read_dir(&target).unwrap().count(), 0);
        confined.driver.unpublish_ok(&volume, &target).await;
        confined.driver.delete(&volume.volume_id).await.unwrap();
    }
}

#[tokio::test]
async fn a_read_only_nested_subvolume_is_deleted_in_bounded_memory() {
    use stickyvol::host::btrfs;
    let fs = ScratchFs::new("btrfs", 256 << 20, &["-q"], "");
    let pool = fs.mount_point.join("pool");
    let mut confined =
        Confined::start(&["--pool".into(), format!("btrfs={}", pool.display())]).await;
    let mut request = create_request(&new_name(), mount_cap(Mode::SingleNodeWriter), 64 << 20);
    request.parameters = params(&[("pool", "btrfs")]);
    let volume = confined.driver.create(request).await;
    let target = confined
        .driver
        .publish_at_new_target(&volume, mount_cap(Mode::SingleNodeWriter))
        .await;
    // What the pod may do to its own subvolume: fill it, then make it read-only.
    btrfs::create_subvolume(&target, "frozen").unwrap();
    for i in 0..1000 {
        fs::write(target.join(format!("frozen/f{i}")), b"x").unwrap();
    }
    btrfs::set_read_only(&target.join("frozen"), true).unwrap();

    confined.driver.unpublish_ok(&volume, &target).await;
    confined.driver.delete(&volume.volume_id).await.unwrap();
    assert!(!host_path(&volume).exists());
    confined.probe_in_time().await;
    confined.assert_unharmed("deletion of a read-only nested subvolume");
    confined.restart().await;
    confined.probe_in_time().await;
}

#[tokio::test]
async fn a_pool_filled_to_the_last_block_keeps_the_driver_serving() {
    use common::fill::fill_to_the_last_block;
    // The pool's filesystem also holds the state directory, as the DaemonSet's data dir does.
    let fs = ScratchFs::new("xfs", 320 << 20, &["-q"], "");
    let mut driver = TestDriver::prepare(Options::default());
    driver.data = fs.mount_point.join("data");
    driver.add_args(["--enforcement", "default=none"]);
    let mut confined = Confined::start_prepared(driver).await;
    let (volume, target) = confined.driver.published_fs_volume().await;
    fill_to_the_last_block(&target.join("fill"));

    confined.restart().await;
    confined.probe_in_time().await;
    assert_eq!(
        confined.driver.listed_ids().await,
        std::slice::from_ref(&volume.volume_id)
    );
    confined.driver.unpublish_ok(&volume, &target).await;
    confined.driver.delete(&volume.volume_id).await.unwrap();
    confined.probe_in_time().await;
    confined.assert_unharmed("a pool filled to the last block");
}

/// The most anonymous memory (RssAnon) a process holds while watched, sampled every 10 ms: its
/// own part, apart from the pages of its binary the kernel maps (a debug build's code is about
/// 30 MiB, counted as shared memory where the binary lies on a tmpfs, as in the VM).
struct AnonPeak {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    sampler: std::thread::JoinHandle<u64>,
}

impl AnonPeak {
    fn watch(pid: u32) -> AnonPeak {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let sampler = std::thread::spawn(move || {
            let mut peak = 0;
            while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
                let kib = status
                    .lines()
                    .find_map(|line| line.strip_prefix("RssAnon:"))
                    .and_then(|rest| rest.trim().strip_suffix("kB"))
                    .map_or(0, |n| n.trim().parse::<u64>().unwrap());
                peak = peak.max(kib << 10);
                std::thread::sleep(Duration::from_millis(10));
            }
            peak
        });
        AnonPeak { stop, sampler }
    }

    fn finish(self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.sampler.join().unwrap()
    }
}

/// The most anonymous memory the driver may hold during those clones.
const ANON_BOUND_CLONES: u64 = 40 << 20;

/// Clones csi-provisioner asks for at once in [`concurrent_clones_of_a_deep_chain_stay_inside_the_memory_limit`].
const CONCURRENT_CLONES: usize = 40;

/// 40 clones at once of a volume holding a 4,000-level chain of directories (40 claims with one
/// data source): the driver in the DaemonSet's 256 MiB is not OOM-killed and its own memory
/// stays that of a few copies. (The issue saw 20 such clones OOM-kill it 9 s in, its own RSS
/// ~58 MiB, the rest kernel memory charged for each copy's directories.) The node runs at most
/// `node_walk_count(256 MiB)` = 6 copies at once; the others wait their turn.
#[tokio::test]
async fn concurrent_clones_of_a_deep_chain_stay_inside_the_memory_limit() {
    let mut confined = Confined::start(&[]).await;
    let (volume, target) = confined.driver.published_fs_volume().await;
    drop(chain(&target, 4000, "d"));
    let started = Instant::now();
    let anon = AnonPeak::watch(confined.driver.pid());
    let mut clones = tokio::task::JoinSet::new();
    for _ in 0..CONCURRENT_CLONES {
        let mut controller = confined.driver.controller();
        let request = csi::CreateVolumeRequest {
            volume_content_source: Some(from_volume(&volume.volume_id)),
            ..create_request(
                &new_name(),
                mount_cap(Mode::SingleNodeWriter),
                volume.capacity_bytes,
            )
        };
        // Retried as csi-provisioner retries what is still in progress.
        clones.spawn(async move {
            loop {
                match controller.create_volume(request.clone()).await {
                    Err(status) if status.code() == Code::Aborted => {
                        tokio::time::sleep(Duration::from_millis(100)).await
                    }
                    done => return done.map(|answer| answer.into_inner().volume.unwrap()),
                }
            }
        });
    }
    let mut made = Vec::new();
    while let Some(done) = clones.join_next().await {
        made.push(done.unwrap().expect("a clone of the deep chain"));
    }
    eprintln!(
        "{CONCURRENT_CLONES} clones of a 4,000-level chain took {:?}; the cgroup's peak charge {} MiB",
        started.elapsed(),
        confined.cgroup.as_ref().map_or(0, |c| c.peak_usage() >> 20)
    );
    let peak_anon = anon.finish();
    confined.assert_unharmed("concurrent clones of a 4,000-level chain");
    // Our own part grows with the copies running at once (each holds its buffers and link
    // book): bounded by the node's copy slots, not by the clones asked for. Before the bound:
    // a peak RSS of 84 MiB with 40 clones (here the kernel reclaimed the directories it
    // charged at the cgroup's limit, 256 MiB, rather than OOM-kill as the issue saw); with
    // it, 45 MiB. Measured as anonymous memory: the binary's mapped code is no copy's.
    eprintln!("their peak anonymous memory: {} MiB", peak_anon >> 20);
    assert!(
        peak_anon < ANON_BOUND_CLONES,
        "peak anonymous memory {} MiB with {CONCURRENT_CLONES} concurrent clones",
        peak_anon >> 20
    );
    confined.probe_in_time().await;
    for clone in made {
        confined.driver.delete(&clone.volume_id).await.unwrap();
    }
    confined.driver.unpublish_ok(&volume, &target).await;
    confined.driver.delete(&volume.volume_id).await.unwrap();
    confined.assert_unharmed("deleting the clones");
}
