//! What this machine charges for what a volume's calls cannot avoid: a disk flush (one 4 KiB
//! `fdatasync`), a bind mount, an unmount, and a round trip between two threads over a unix
//! socket (two wakeups: what a call that does nothing else costs in scheduling). The guard
//! reports them beside its figures, for the reader: they say what kind of machine measured
//! them. (It no longer divides by them: a machine type's CPU and syscalls do not scale
//! together, so the ratios moved between machines; see `super`.)

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use serde::Serialize;

use crate::report::median;

/// Medians of one round's samples, µs.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Floor {
    pub fdatasync_us: u64,
    pub bind_mount_us: u64,
    pub unmount_us: u64,
    pub round_trip_us: u64,
}

/// Times `samples` of each on `dir`'s filesystem, in a scratch directory removed afterwards.
pub fn measure(dir: &Path, samples: usize) -> io::Result<Floor> {
    let scratch = Scratch::make(dir)?;
    let fdatasync_us = median(&time_flushes(&scratch.path.join("flushed"), samples)?);
    let (mounts, unmounts) = time_binds(&scratch, samples)?;
    Ok(Floor {
        fdatasync_us,
        bind_mount_us: median(&mounts),
        unmount_us: median(&unmounts),
        round_trip_us: median(&time_round_trips(samples)?),
    })
}

/// One byte there and back between this thread and an echoing one.
fn time_round_trips(samples: usize) -> io::Result<Vec<u64>> {
    let (mut near, mut far) = UnixStream::pair()?;
    let echo = std::thread::spawn(move || -> io::Result<()> {
        let mut byte = [0u8];
        while far.read(&mut byte)? == 1 {
            far.write_all(&byte)?;
        }
        Ok(())
    });
    let mut byte = [1u8];
    let times = (0..samples)
        .map(|_| {
            timed(|| {
                near.write_all(&byte)
                    .and_then(|()| near.read_exact(&mut byte))
            })
        })
        .collect();
    drop(near);
    echo.join().expect("the echo thread does not panic")?;
    times
}

fn time_flushes(path: &Path, samples: usize) -> io::Result<Vec<u64>> {
    let file = OpenOptions::new()
        .create_new(true)
        .read(true)
        .write(true)
        .open(path)?;
    let block = [0x5au8; 4096];
    // Allocated and flushed first: each sample then rewrites data in place, as a journal does.
    file.write_all_at(&block, 0)?;
    file.sync_all()?;
    (0..samples)
        .map(|_| timed(|| file.write_all_at(&block, 0).and_then(|()| file.sync_data())))
        .collect()
}

fn time_binds(scratch: &Scratch, samples: usize) -> io::Result<(Vec<u64>, Vec<u64>)> {
    let (mut mounts, mut unmounts) = (Vec::new(), Vec::new());
    for _ in 0..samples {
        mounts.push(timed(|| bind(&scratch.source, &scratch.target))?);
        unmounts.push(timed(|| unmount(&scratch.target))?);
    }
    Ok((mounts, unmounts))
}

fn bind(source: &Path, target: &Path) -> io::Result<()> {
    mount(
        Some(source),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(io::Error::from)
}

fn unmount(target: &Path) -> io::Result<()> {
    umount2(target, MntFlags::UMOUNT_NOFOLLOW).map_err(io::Error::from)
}

fn timed(work: impl FnOnce() -> io::Result<()>) -> io::Result<u64> {
    let start = Instant::now();
    work()?;
    Ok(micros(start.elapsed()))
}

fn micros(elapsed: Duration) -> u64 {
    u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX)
}

/// `<dir>/.stickyvol-bench-floor-<pid>/` with a bind source and target; on drop a bind left
/// by a failed sample is detached before anything is removed, so removal never crosses it.
struct Scratch {
    path: PathBuf,
    source: PathBuf,
    target: PathBuf,
}

impl Scratch {
    fn make(dir: &Path) -> io::Result<Scratch> {
        let path = dir.join(format!(".stickyvol-bench-floor-{}", std::process::id()));
        fs::create_dir(&path)?;
        let scratch = Scratch {
            source: path.join("source"),
            target: path.join("target"),
            path,
        };
        fs::create_dir(&scratch.source)?;
        fs::create_dir(&scratch.target)?;
        File::create(scratch.source.join("marker"))?;
        Ok(scratch)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = umount2(
            &self.target,
            MntFlags::MNT_DETACH | MntFlags::UMOUNT_NOFOLLOW,
        );
        if !self.target.join("marker").exists() {
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_floor_is_timed_and_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let floor = measure(dir.path(), 5).unwrap();
        assert!(
            floor.fdatasync_us > 0 && floor.round_trip_us > 0,
            "{floor:?}"
        );
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
