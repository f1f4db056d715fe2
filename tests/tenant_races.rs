//! Races a tenant runs against our walks of its live volume, each with a racer thread doing what
//! a pod may do (it owns the tree, and a root container keeps CAP_MKNOD) while we copy, export
//! or measure the tree. Needs root (mknod, loop mounts).

mod common;

use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::stat::{Mode, SFlag, makedev, mknod};

use common::scratchfs::ScratchFs;
use stickyvol::host::archive;
use stickyvol::host::copy::{self, Always, DataMode};

const MIB: u64 = 1 << 20;

fn scratch(fs_type: &str) -> ScratchFs {
    assert!(
        nix::unistd::geteuid().is_root(),
        "these tests need root (mknod, mounts)"
    );
    ScratchFs::new(fs_type, 256 * MIB, &["-q"], "")
}

fn c_path(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).expect("no NUL")
}

/// Counts the opens of one inode (inotify IN_OPEN on it), whatever name it has meanwhile.
struct OpenWatch {
    fd: i32,
}

impl OpenWatch {
    fn on(path: &Path) -> OpenWatch {
        // SAFETY: plain syscalls on a descriptor we own and a valid C string.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        assert!(
            fd >= 0,
            "inotify_init1: {}",
            std::io::Error::last_os_error()
        );
        let watch = unsafe { libc::inotify_add_watch(fd, c_path(path).as_ptr(), libc::IN_OPEN) };
        assert!(
            watch >= 0,
            "inotify_add_watch: {}",
            std::io::Error::last_os_error()
        );
        OpenWatch { fd }
    }

    /// The opens seen since the last call (each event is at least 16 bytes; IN_OPEN events carry
    /// no name). Identical events not yet read are merged into one by inotify: call it after
    /// each walk to count the walks that opened the inode.
    fn opens(&self) -> usize {
        let mut buffer = [0u8; 4096];
        let mut opens = 0;
        loop {
            // SAFETY: the buffer is writable for its length.
            let read = unsafe { libc::read(self.fd, buffer.as_mut_ptr().cast(), buffer.len()) };
            if read <= 0 {
                return opens;
            }
            let mut events = &buffer[..read as usize];
            while events.len() >= 16 {
                let mask = u32::from_ne_bytes(events[4..8].try_into().unwrap());
                let name_len = u32::from_ne_bytes(events[12..16].try_into().unwrap()) as usize;
                if mask & libc::IN_OPEN != 0 {
                    opens += 1;
                }
                events = &events[16 + name_len..];
            }
        }
    }
}

impl Drop for OpenWatch {
    fn drop(&mut self) {
        // SAFETY: closing the descriptor we own.
        unsafe { libc::close(self.fd) };
    }
}

/// A racer that swaps a device node with each of `files` in turn (RENAME_EXCHANGE, so every
/// name always exists), until stopped.
struct Swapper {
    stop: Arc<AtomicBool>,
    swaps: Arc<AtomicU64>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Swapper {
    fn start(device: PathBuf, files: Vec<PathBuf>) -> Swapper {
        let stop = Arc::new(AtomicBool::new(false));
        let swaps = Arc::new(AtomicU64::new(0));
        let (stop_flag, counter) = (stop.clone(), swaps.clone());
        let thread = thread::spawn(move || {
            let device = c_path(&device);
            let files: Vec<CString> = files.iter().map(|f| c_path(f)).collect();
            while !stop_flag.load(Ordering::Relaxed) {
                for file in &files {
                    // Twice: the device node takes the file's name, then gives it back.
                    for _ in 0..2 {
                        // SAFETY: valid C strings; renameat2 only renames.
                        let done = unsafe {
                            libc::renameat2(
                                libc::AT_FDCWD,
                                device.as_ptr(),
                                libc::AT_FDCWD,
                                file.as_ptr(),
                                libc::RENAME_EXCHANGE,
                            )
                        };
                        assert_eq!(done, 0, "{}", std::io::Error::last_os_error());
                    }
                    counter.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        Swapper {
            stop,
            swaps,
            thread: Some(thread),
        }
    }

    fn stop(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .unwrap()
            .join()
            .expect("the racer panicked");
        self.swaps.load(Ordering::Relaxed)
    }
}

impl Drop for Swapper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A volume of small files and one char device 1:3 (/dev/null's numbers: harmless if opened)
/// that a racer keeps swapping with the files; the watch counts every open of the device.
struct SwappedDevice {
    // Dropped in this order: the racer stops before its filesystem goes.
    swapper: Swapper,
    watch: OpenWatch,
    volume: PathBuf,
    _fs: ScratchFs,
}

fn volume_with_a_swapped_device(fs_type: &str) -> SwappedDevice {
    let fs = scratch(fs_type);
    let volume = fs.path("volume");
    fs::create_dir(&volume).unwrap();
    let files: Vec<PathBuf> = (0..4).map(|i| volume.join(format!("f{i}"))).collect();
    for file in &files {
        fs::write(file, b"tenant data").unwrap();
    }
    let device = volume.join("dev");
    mknod(
        &device,
        SFlag::S_IFCHR,
        Mode::from_bits_truncate(0o666),
        makedev(1, 3),
    )
    .unwrap();
    let watch = OpenWatch::on(&device);
    let swapper = Swapper::start(device, files);
    SwappedDevice {
        _fs: fs,
        volume,
        watch,
        swapper,
    }
}

const RACE_FOR: Duration = Duration::from_secs(3);

/// Copies (as a clone or a snapshot on a copy pool does) while the device node is swapped in
/// and out: no copy ever opens it. Before the fix: 12-18 opens in 5 s on ext4 and btrfs.
#[test]
fn a_device_node_swapped_in_is_never_opened_by_a_copy() {
    for fs_type in ["ext4", "btrfs"] {
        let race = volume_with_a_swapped_device(fs_type);
        let dest_root = race.volume.parent().unwrap().join("copies");
        fs::create_dir(&dest_root).unwrap();
        let (started, mut copies, mut opens) = (Instant::now(), 0, 0);
        while started.elapsed() < RACE_FOR {
            let dest = dest_root.join(copies.to_string());
            fs::create_dir(&dest).unwrap();
            copy::copy_tree(&race.volume, &dest, DataMode::Copy, &mut Always)
                .unwrap_or_else(|err| panic!("copy on {fs_type}: {err}"));
            fs::remove_dir_all(&dest).unwrap();
            copies += 1;
            opens += race.watch.opens();
        }
        let swaps = race.swapper.stop();
        println!("{fs_type}: {copies} copies, {swaps} swaps, {opens} of them opened the device");
        assert!(
            swaps > 1000,
            "the racer barely ran on {fs_type}: {swaps} swaps"
        );
        assert_eq!(
            opens, 0,
            "copies on {fs_type} opened the swapped-in device node"
        );
    }
}

/// The same during exports (`stickyvol volume export` of a published volume).
#[test]
fn a_device_node_swapped_in_is_never_opened_by_an_export() {
    for fs_type in ["ext4", "btrfs"] {
        let race = volume_with_a_swapped_device(fs_type);
        let (started, mut exports, mut opens) = (Instant::now(), 0, 0);
        while started.elapsed() < RACE_FOR {
            let header = archive::tree_header(&race.volume, "race").unwrap();
            archive::export(&race.volume, &header, &mut std::io::sink())
                .unwrap_or_else(|err| panic!("export on {fs_type}: {err}"));
            exports += 1;
            opens += race.watch.opens();
        }
        let swaps = race.swapper.stop();
        println!("{fs_type}: {exports} exports, {swaps} swaps, {opens} of them opened the device");
        assert!(
            swaps > 1000,
            "the racer barely ran on {fs_type}: {swaps} swaps"
        );
        assert_eq!(
            opens, 0,
            "exports on {fs_type} opened the swapped-in device node"
        );
    }
}
