//! LUKS2 encryption through dm-crypt: formatting a device, opening it as a mapping
//! (`/dev/mapper/<name>`), closing, resizing, and wiping a header for good.
//!
//! The on-disk format is cryptsetup's to know, so Debian's `cryptsetup` runs as a child process
//! (libcryptsetup through a crate would bind us to the node's library version and a C build;
//! the tool is one package in the image). The key reaches it on stdin only, never argv (which
//! /proc shows to every process) and never a file.
//!
//! The header is small and at a fixed place: two 16 KiB metadata copies and 992 KiB of key
//! slots, the data from 1 MiB on. So erasing needs no parsing: zero the first `HEADER_BYTES`.

use std::fmt;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use zeroize::Zeroizing;

use super::fsimage::find_tool;

/// Where the data starts: everything before is header and key slots.
pub const HEADER_BYTES: u64 = 1 << 20;

/// The LUKS magic of the primary header (the secondary's is "SKUL" and the same two bytes).
const MAGIC: [u8; 6] = *b"LUKS\xba\xbe";

/// Shortest and longest key accepted: a Secret's value, meant to be random bytes.
pub const MIN_KEY_BYTES: usize = 32;
pub const MAX_KEY_BYTES: usize = 4096;

/// A volume key's passphrase: zeroed when dropped, never printed.
pub struct Key(Zeroizing<Vec<u8>>);

impl Key {
    /// The key, if its length is acceptable; the error says why not (without the key).
    pub fn new(bytes: Vec<u8>) -> Result<Key, String> {
        let bytes = Zeroizing::new(bytes);
        if !(MIN_KEY_BYTES..=MAX_KEY_BYTES).contains(&bytes.len()) {
            return Err(format!(
                "the encryption key has {} bytes; between {MIN_KEY_BYTES} and {MAX_KEY_BYTES} are accepted (e.g. `head -c 64 /dev/urandom | base64 -w0`)",
                bytes.len()
            ));
        }
        Ok(Key(bytes))
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Key(redacted)")
    }
}

/// Why this node cannot encrypt, if it cannot: no device mapper, or no cryptsetup.
pub fn unavailable() -> Option<String> {
    if !Path::new("/dev/mapper/control").exists() {
        return Some(
            "this node's kernel offers no device mapper (/dev/mapper/control is missing), so no dm-crypt"
                .into(),
        );
    }
    if find_tool("cryptsetup").is_none() {
        return Some("cryptsetup is not installed on this node".into());
    }
    None
}

/// Makes `device` a LUKS2 device whose one key slot opens with `key`. Destroys what was there.
pub fn format(device: &Path, key: &Key) -> io::Result<()> {
    let offset = (HEADER_BYTES / 512).to_string();
    let mut args = vec![
        "luksFormat",
        "--batch-mode",
        "--type",
        "luks2",
        "--luks2-metadata-size",
        "16k",
        "--luks2-keyslots-size",
        "992k",
        "--offset",
        &offset,
        // The key is a Secret's random bytes, not a person's passphrase: a modest KDF keeps
        // opening fast (and the node's memory free) without weakening it.
        "--pbkdf",
        "argon2id",
        "--pbkdf-memory",
        "32768",
        "--pbkdf-parallel",
        "1",
        "--pbkdf-force-iterations",
        "4",
    ];
    args.extend(["--key-file", "-"]);
    run(&args, Some(device), Some(key))
}

/// Opens LUKS `device` as mapping `name`; its path. The volume key stays in the kernel's
/// table, not the keyring, so `resize` needs no key.
pub fn open(device: &Path, name: &str, key: &Key, readonly: bool) -> io::Result<PathBuf> {
    let mut args = vec!["open", "--type", "luks2", "--disable-keyring"];
    if readonly {
        args.push("--readonly");
    }
    args.extend(["--key-file", "-"]);
    let mut with_name = args;
    with_name.push(device.to_str().ok_or_else(not_utf8)?);
    with_name.push(name);
    run(&with_name, None, Some(key))?;
    Ok(mapper_path(name))
}

/// Closes mapping `name`; nothing to do when it is not open.
pub fn close(name: &str) -> io::Result<()> {
    if mapping(name).is_none() {
        return Ok(());
    }
    run(&["close", name], None, None)
}

/// Grows mapping `name` to its device's size (after the loop device grew).
pub fn resize(name: &str) -> io::Result<()> {
    run(&["resize", name], None, None)
}

pub fn mapper_path(name: &str) -> PathBuf {
    Path::new("/dev/mapper").join(name)
}

/// An open mapping: its device number and the block devices under it (e.g. "loop3").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    /// Major and minor.
    pub dev: (u32, u32),
    /// The kernel's name of the mapping's own device (e.g. "dm-0").
    pub kernel_name: String,
    pub below: Vec<String>,
}

/// The open mapping called `name`, from sysfs (the /dev/mapper node alone may be stale).
pub fn mapping(name: &str) -> Option<Mapping> {
    let rdev = std::fs::metadata(mapper_path(name))
        .ok()
        .map(|m| std::os::unix::fs::MetadataExt::rdev(&m))?;
    let dev = (
        nix::sys::stat::major(rdev) as u32,
        nix::sys::stat::minor(rdev) as u32,
    );
    let sys = PathBuf::from(format!("/sys/dev/block/{}:{}", dev.0, dev.1));
    let named = std::fs::read_to_string(sys.join("dm/name")).ok()?;
    if named.trim_end() != name {
        return None;
    }
    let kernel_name = std::fs::canonicalize(&sys)
        .ok()?
        .file_name()?
        .to_string_lossy()
        .into_owned();
    let below = std::fs::read_dir(sys.join("slaves"))
        .ok()?
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    Some(Mapping {
        dev,
        kernel_name,
        below,
    })
}

/// Whether `file` begins with a LUKS header.
pub fn is_luks(file: &File) -> io::Result<bool> {
    let mut start = [0u8; MAGIC.len()];
    match file.read_exact_at(&mut start, 0) {
        Ok(()) => Ok(start == MAGIC),
        Err(err) if err.kind() == io::ErrorKind::UnexpectedEof => Ok(false),
        Err(err) => Err(err),
    }
}

/// Zeroes the header and key slots of LUKS `file` (opened for writing) and flushes: the data
/// after it can no longer be decrypted by anyone, whatever key they hold. Returns whether there
/// was a header. On a copy-on-write pool (btrfs, or XFS blocks a snapshot shares) the old
/// header's blocks stay on the disk until reused: the overwrite reaches the file, not them.
pub fn erase_header(file: &File) -> io::Result<bool> {
    if !is_luks(file)? {
        return Ok(false);
    }
    let length = file.metadata()?.len().min(HEADER_BYTES);
    let zeros = vec![0u8; 64 << 10];
    let mut at = 0;
    while at < length {
        let n = (length - at).min(zeros.len() as u64) as usize;
        file.write_all_at(&zeros[..n], at)?;
        at += n as u64;
    }
    file.sync_data()?;
    Ok(true)
}

fn not_utf8() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        "a device path that is not UTF-8",
    )
}

/// Runs cryptsetup with `args` (then `device`, if given), `key` on its stdin.
fn run(args: &[&str], device: Option<&Path>, key: Option<&Key>) -> io::Result<()> {
    let program = find_tool("cryptsetup").ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            "cryptsetup is not installed on this node",
        )
    })?;
    let mut command = Command::new(program);
    command.args(args);
    if let Some(device) = device {
        command.arg(device);
    }
    let mut child = command
        // No udev in a container to make /dev/mapper's nodes (or to wait for): libdevmapper
        // makes them itself. Its locks guard against other cryptsetups; we serialize per volume.
        .env("DM_DISABLE_UDEV", "1")
        .arg("--disable-locks")
        .env("LC_ALL", "C")
        .stdin(if key.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    if let Some(key) = key {
        let mut stdin = child.stdin.take().expect("stdin was piped");
        stdin.write_all(&key.0)?;
    }
    let mut said = String::new();
    if let Some(mut stderr) = child.stderr.take() {
        let _ = stderr.read_to_string(&mut said);
    }
    let status = child.wait()?;
    if status.success() {
        return Ok(());
    }
    let what = args.first().copied().unwrap_or_default();
    Err(io::Error::other(format!(
        "cryptsetup {what} failed ({status}): {}",
        said.trim().chars().take(2000).collect::<String>()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_outside_the_bounds_are_refused_and_none_is_printed() {
        assert!(Key::new(vec![b'k'; MIN_KEY_BYTES - 1]).is_err());
        assert!(Key::new(vec![b'k'; MAX_KEY_BYTES + 1]).is_err());
        let key = Key::new(b"a-secret-that-must-never-be-printed!".to_vec()).unwrap();
        assert_eq!(format!("{key:?}"), "Key(redacted)");
        let refused = Key::new(b"short-secret".to_vec()).unwrap_err();
        assert!(!refused.contains("short-secret"), "{refused}");
    }

    #[test]
    fn only_a_luks_header_is_erased_and_then_it_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("image");
        let mut bytes = MAGIC.to_vec();
        bytes.resize(HEADER_BYTES as usize + 4096, 0x5a);
        std::fs::write(&path, &bytes).unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        assert!(erase_header(&file).unwrap());
        let after = std::fs::read(&path).unwrap();
        assert!(after[..HEADER_BYTES as usize].iter().all(|b| *b == 0));
        assert!(after[HEADER_BYTES as usize..].iter().all(|b| *b == 0x5a));
        assert!(!erase_header(&file).unwrap(), "no header any more");

        let plain = dir.path().join("plain");
        std::fs::write(&plain, b"not luks").unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&plain)
            .unwrap();
        assert!(!erase_header(&file).unwrap());
        assert_eq!(std::fs::read(&plain).unwrap(), b"not luks");
    }
}
