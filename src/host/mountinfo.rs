//! Parser for /proc/self/mountinfo (see proc_pid_mountinfo(5)).
//!
//! A line looks like
//! `36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw,errors=continue`:
//! mount ID, parent ID, major:minor, root, mount point, mount options, zero or more optional
//! fields ended by a lone "-", then file system type, source and super-block options.
//! Fields are separated by single spaces; the kernel escapes space, tab, newline and backslash
//! inside them as `\ooo` octal.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::fs;
use std::io::{self, Read};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use super::{fsstat, tree};

const SELF_MOUNTINFO: &str = "/proc/self/mountinfo";

/// One line of mountinfo. Paths are unescaped to the exact bytes the kernel has; option fields
/// are kept as printed, because unescaping them could break their comma structure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub mount_id: u32,
    pub parent_id: u32,
    pub major: u32,
    pub minor: u32,
    /// The directory within its file system that is mounted here: "/" unless a subdirectory
    /// was bind-mounted.
    pub root: PathBuf,
    pub mount_point: PathBuf,
    /// Per-mount options such as "rw,noatime".
    pub mount_options: String,
    /// Propagation tags such as "shared:1" or "master:2".
    pub optional_fields: Vec<String>,
    pub fs_type: String,
    /// Unescaped; bytes that are not UTF-8 are replaced (it is a label, not a path we open).
    pub source: String,
    /// Per-super-block options such as "rw,errors=continue".
    pub super_options: String,
}

/// Which mountinfo line could not be parsed, and why.
#[derive(Debug, thiserror::Error)]
#[error("mountinfo line {line_number} ({line:?}): {problem}")]
pub struct ParseError {
    /// 1-based; always 1 from [`parse_line`].
    pub line_number: usize,
    pub line: String,
    pub problem: Problem,
}

/// What was wrong with a mountinfo line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    #[error("the line ends before the {0} field")]
    MissingField(&'static str),
    #[error("{field} {value:?} is not a decimal number")]
    BadNumber { field: &'static str, value: String },
    #[error("device {0:?} is not major:minor")]
    BadDevice(String),
    #[error("no \"-\" separator after the optional fields")]
    MissingSeparator,
    #[error("unexpected field {0:?} after the super-block options")]
    TrailingField(String),
}

/// Parses one mountinfo line (without its newline).
pub fn parse_line(line: &str) -> Result<MountEntry, ParseError> {
    parse_fields(line).map_err(|problem| ParseError {
        line_number: 1,
        line: line.to_owned(),
        problem,
    })
}

/// Parses a whole mountinfo text, skipping empty lines.
pub fn parse(text: &str) -> Result<Vec<MountEntry>, ParseError> {
    text.split('\n')
        .enumerate()
        .filter(|(_, line)| !line.is_empty())
        .map(|(index, line)| {
            parse_line(line).map_err(|error| ParseError {
                line_number: index + 1,
                ..error
            })
        })
        .collect()
}

/// The mount table of this process's mount namespace. Parse errors become
/// [`io::ErrorKind::InvalidData`].
pub fn read_self() -> io::Result<Vec<MountEntry>> {
    // procfs reports size 0, so `fs::read` would start with tiny reads: one large buffer
    // takes a node's mount table in one or two.
    let mut bytes = Vec::with_capacity(64 << 10);
    fs::File::open(SELF_MOUNTINFO)?.read_to_end(&mut bytes)?;
    parse_bytes(&bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Parses mountinfo as the kernel gives it: bytes, not necessarily UTF-8.
pub(crate) fn parse_bytes(bytes: &[u8]) -> Result<Vec<MountEntry>, ParseError> {
    // Mount points need not be UTF-8. Writing such bytes as \ooo escapes keeps them
    // byte-exact: parsing decodes them like the kernel's own escapes, and no literal text can
    // be mistaken for one because the kernel escapes every backslash.
    parse(&escape_bytes(bytes, |_| false))
}

/// Entries whose mount point is `dir` itself or lies beneath it, compared component-wise
/// (/a/b is not beneath /a/bc).
pub fn mounts_at_or_under<'a>(
    entries: &'a [MountEntry],
    dir: &Path,
) -> impl Iterator<Item = &'a MountEntry> {
    entries
        .iter()
        .filter(move |entry| entry.mount_point.starts_with(dir))
}

/// Whether no mount can sit at or under `path`, when that is plain without the mount table
/// (which on a busy node runs to hundreds of lines): statx shows a mount on the path itself,
/// and anything mounted beneath needs a directory entry to sit on. `false` means "look".
pub fn nothing_mounted_within(path: &Path) -> io::Result<bool> {
    match fsstat::lstat_if_exists(path)? {
        None => Ok(true),
        Some(stat) if stat.is_mount_root => Ok(false),
        Some(stat) if stat.is_dir() => tree::is_empty_dir(path),
        Some(_) => Ok(true),
    }
}

/// Encodes a path the way the kernel does in mountinfo: space, tab, newline and backslash as
/// `\ooo` octal. Bytes that are not valid UTF-8 are written as `\ooo` as well, which the
/// kernel does not do, but a `String` cannot hold them raw and [`parse_line`] decodes both alike.
pub fn escape(path: &Path) -> String {
    escape_bytes(path.as_os_str().as_bytes(), |c| {
        matches!(c, ' ' | '\t' | '\n' | '\\')
    })
}

/// Copies `bytes` into a string, writing invalid UTF-8 and the characters `must_escape`
/// selects as `\ooo`.
fn escape_bytes(bytes: &[u8], must_escape: impl Fn(char) -> bool) -> String {
    let mut text = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if must_escape(c) {
                push_octal_escape(&mut text, c as u8);
            } else {
                text.push(c);
            }
        }
        for &byte in chunk.invalid() {
            push_octal_escape(&mut text, byte);
        }
    }
    text
}

fn push_octal_escape(text: &mut String, byte: u8) {
    write!(text, "\\{byte:03o}").expect("writing to a String cannot fail");
}

fn parse_fields(line: &str) -> Result<MountEntry, Problem> {
    let mut fields = line.split(' ');
    let mut next = |name: &'static str| fields.next().ok_or(Problem::MissingField(name));

    let mount_id = parse_number("mount ID", next("mount ID")?)?;
    let parent_id = parse_number("parent ID", next("parent ID")?)?;
    let (major, minor) = parse_device(next("major:minor")?)?;
    let root = unescape_path(next("root")?);
    let mount_point = unescape_path(next("mount point")?);
    let mount_options = next("mount options")?.to_owned();
    let mut optional_fields = Vec::new();
    loop {
        match next("separator").map_err(|_| Problem::MissingSeparator)? {
            "-" => break,
            tag => optional_fields.push(tag.to_owned()),
        }
    }
    let fs_type = unescape_text(next("file system type")?);
    let source = unescape_text(next("source")?);
    // Never empty: the kernel always starts it with "rw" or "ro", so "" means a cut-off line.
    let super_options = match next("super options")? {
        "" => return Err(Problem::MissingField("super options")),
        options => options.to_owned(),
    };
    if let Some(extra) = fields.next() {
        return Err(Problem::TrailingField(extra.to_owned()));
    }

    Ok(MountEntry {
        mount_id,
        parent_id,
        major,
        minor,
        root,
        mount_point,
        mount_options,
        optional_fields,
        fs_type,
        source,
        super_options,
    })
}

/// Digits only: `str::parse` would also take a leading '+', which the kernel never prints.
fn parse_number(field: &'static str, value: &str) -> Result<u32, Problem> {
    let bad_number = || Problem::BadNumber {
        field,
        value: value.to_owned(),
    };
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad_number());
    }
    value.parse().map_err(|_| bad_number())
}

fn parse_device(value: &str) -> Result<(u32, u32), Problem> {
    let (major, minor) = value
        .split_once(':')
        .ok_or_else(|| Problem::BadDevice(value.to_owned()))?;
    Ok((parse_number("major", major)?, parse_number("minor", minor)?))
}

fn unescape_path(field: &str) -> PathBuf {
    PathBuf::from(OsString::from_vec(unescape(field)))
}

fn unescape_text(field: &str) -> String {
    String::from_utf8_lossy(&unescape(field)).into_owned()
}

/// Turns every `\ooo` octal triple into its byte. Anything else, including a backslash not
/// followed by a valid triple, is kept as is: being lenient here cannot hide a bad line,
/// because the kernel always escapes backslashes.
fn unescape(field: &str) -> Vec<u8> {
    let bytes = field.as_bytes();
    let mut unescaped = Vec::with_capacity(bytes.len());
    let mut rest = bytes;
    while let Some(&first) = rest.first() {
        match octal_escape(rest) {
            Some(byte) => {
                unescaped.push(byte);
                rest = &rest[4..];
            }
            None => {
                unescaped.push(first);
                rest = &rest[1..];
            }
        }
    }
    unescaped
}

/// The byte encoded by a `\ooo` triple at the start of `bytes`, if there is one (at most \377).
fn octal_escape(bytes: &[u8]) -> Option<u8> {
    let &[b'\\', high, middle, low, ..] = bytes else {
        return None;
    };
    let value = [high, middle, low].iter().try_fold(0u32, |value, &digit| {
        matches!(digit, b'0'..=b'7').then(|| value * 8 + u32::from(digit - b'0'))
    })?;
    u8::try_from(value).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const EXAMPLE: &str =
        "36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw,errors=continue";

    fn problem(line: &str) -> Problem {
        parse_line(line).expect_err("should not parse").problem
    }

    #[test]
    fn only_non_empty_directories_need_the_mount_table() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        assert!(nothing_mounted_within(&root.join("missing")).unwrap());
        fs::create_dir(root.join("empty")).unwrap();
        assert!(nothing_mounted_within(&root.join("empty")).unwrap());
        fs::write(root.join("file"), b"x").unwrap();
        assert!(nothing_mounted_within(&root.join("file")).unwrap());
        std::os::unix::fs::symlink(root, root.join("link")).unwrap();
        assert!(
            nothing_mounted_within(&root.join("link")).unwrap(),
            "a symlink is judged itself, not what it points at"
        );
        assert!(!nothing_mounted_within(root).unwrap(), "has entries: look");
        assert!(
            !nothing_mounted_within(Path::new("/")).unwrap(),
            "a mount root: look"
        );
    }

    #[test]
    fn parses_the_man_page_example() {
        assert_eq!(
            parse_line(EXAMPLE).unwrap(),
            MountEntry {
                mount_id: 36,
                parent_id: 35,
                major: 98,
                minor: 0,
                root: PathBuf::from("/mnt1"),
                mount_point: PathBuf::from("/mnt/parent"),
                mount_options: "rw,noatime".into(),
                optional_fields: vec!["master:1".into()],
                fs_type: "ext3".into(),
                source: "/dev/root".into(),
                super_options: "rw,errors=continue".into(),
            }
        );
    }

    #[test]
    fn optional_fields_may_be_absent_or_many() {
        let none = parse_line("22 27 0:21 / /proc rw,relatime - proc proc rw").unwrap();
        assert!(none.optional_fields.is_empty());
        assert_eq!(none.fs_type, "proc");

        let many = parse_line(
            "40 25 0:38 / /kubelet rw shared:7 master:3 propagate_from:2 unbindable - tmpfs tmpfs rw",
        )
        .unwrap();
        assert_eq!(
            many.optional_fields,
            ["shared:7", "master:3", "propagate_from:2", "unbindable"]
        );
        assert_eq!(many.source, "tmpfs");
    }

    #[test]
    fn escaped_characters_are_decoded() {
        let entry = parse_line(
            r"50 27 7:3 /vol\040data /pods/my\040vol\011tab\012nl\134bs rw - ext4 /dev/my\040disk rw",
        )
        .unwrap();
        assert_eq!(entry.root, Path::new("/vol data"));
        assert_eq!(entry.mount_point, Path::new("/pods/my vol\ttab\nnl\\bs"));
        assert_eq!(entry.source, "/dev/my disk");
    }

    #[test]
    fn an_empty_source_is_kept_empty() {
        // `mount -t tmpfs "" /mnt` leaves two spaces in a row where the source would be.
        let entry = parse_line("60 27 0:50 / /mnt rw - tmpfs  rw,size=4k").unwrap();
        assert_eq!(entry.source, "");
        assert_eq!(entry.super_options, "rw,size=4k");
    }

    #[test]
    fn octal_escapes_decode_to_single_bytes_and_invalid_ones_stay_literal() {
        assert_eq!(unescape(r"a\101\377b"), b"aA\xffb");
        assert_eq!(unescape(r"\400\18\\12\"), br"\400\18\\12\");
    }

    #[test]
    fn malformed_lines_are_errors() {
        assert_eq!(
            problem("36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 ext3 /dev/root rw"),
            Problem::MissingSeparator
        );
        assert_eq!(
            problem("x 35 98:0 / / rw - ext3 /dev/root rw"),
            Problem::BadNumber {
                field: "mount ID",
                value: "x".into()
            }
        );
        assert_eq!(
            problem("36 +35 98:0 / / rw - ext3 /dev/root rw"),
            Problem::BadNumber {
                field: "parent ID",
                value: "+35".into()
            }
        );
        assert_eq!(
            problem("36 35 98-0 / / rw - ext3 /dev/root rw"),
            Problem::BadDevice("98-0".into())
        );
        assert_eq!(
            problem("36 35 98:99999999999 / / rw - ext3 /dev/root rw"),
            Problem::BadNumber {
                field: "minor",
                value: "99999999999".into()
            }
        );
        assert_eq!(
            problem("36 35 98:0 / / rw - ext3 /dev/root rw extra"),
            Problem::TrailingField("extra".into())
        );
        // Two spaces between fields are not a separator the kernel writes.
        assert!(parse_line("36  35 98:0 / / rw - ext3 /dev/root rw").is_err());
    }

    #[test]
    fn every_truncation_of_a_line_is_an_error() {
        for end in 0..EXAMPLE.len() {
            let truncated = &EXAMPLE[..end];
            // Cutting inside the last field still leaves a well-formed (shorter) line.
            if end > EXAMPLE.rfind(' ').unwrap() + 1 {
                continue;
            }
            assert!(parse_line(truncated).is_err(), "{truncated:?} parsed");
        }
        assert_eq!(
            problem(""),
            Problem::BadNumber {
                field: "mount ID",
                value: String::new(),
            }
        );
        assert_eq!(problem("36"), Problem::MissingField("parent ID"));
        assert_eq!(
            problem("36 35 98:0 / / rw -"),
            Problem::MissingField("file system type")
        );
        assert_eq!(
            problem("36 35 98:0 / / rw - ext3 /dev/root"),
            Problem::MissingField("super options")
        );
    }

    #[test]
    fn parse_skips_empty_lines_and_reports_line_numbers() {
        let text = format!("{EXAMPLE}\n\n22 27 0:21 / /proc rw - proc proc rw\n");
        let entries = parse(&text).unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[1].mount_point, Path::new("/proc"));

        let error = parse(&format!("{EXAMPLE}\n\nbroken line\n")).unwrap_err();
        assert_eq!(error.line_number, 3);
        assert_eq!(error.line, "broken line");
        assert!(error.to_string().contains("line 3"), "{error}");
    }

    #[test]
    fn read_self_parses_this_machines_table() {
        let entries = read_self().unwrap();
        assert!(
            entries.iter().any(|e| e.mount_point == Path::new("/")),
            "no root mount in {entries:#?}"
        );
        let lines = fs::read_to_string(SELF_MOUNTINFO).unwrap().lines().count();
        // The table may change between the two reads; it is only a sanity check.
        assert!(entries.len().abs_diff(lines) <= 5);
    }

    fn entry_at(mount_point: &str) -> MountEntry {
        parse_line(&format!("1 1 0:1 / {mount_point} rw - tmpfs tmpfs rw")).unwrap()
    }

    fn mount_points_at_or_under(entries: &[MountEntry], dir: &str) -> Vec<String> {
        mounts_at_or_under(entries, Path::new(dir))
            .map(|e| e.mount_point.display().to_string())
            .collect()
    }

    #[test]
    fn mounts_at_or_under_compares_whole_components() {
        let entries: Vec<_> = ["/", "/a", "/a/b", "/a/bc", "/a/b/c", "/a/b/c/d", "/ab"]
            .into_iter()
            .map(entry_at)
            .collect();
        assert_eq!(
            mount_points_at_or_under(&entries, "/a/b"),
            ["/a/b", "/a/b/c", "/a/b/c/d"]
        );
        assert_eq!(
            mount_points_at_or_under(&entries, "/a/b/"),
            ["/a/b", "/a/b/c", "/a/b/c/d"]
        );
        assert_eq!(
            mount_points_at_or_under(&entries, "/a"),
            ["/a", "/a/b", "/a/bc", "/a/b/c", "/a/b/c/d"]
        );
        assert_eq!(mount_points_at_or_under(&entries, "/").len(), entries.len());
        assert!(mount_points_at_or_under(&entries, "/a/b/c/d/e").is_empty());
    }

    #[test]
    fn escape_matches_the_kernel_encoding() {
        assert_eq!(
            escape(Path::new("/a b\tc\nd\\e")),
            r"/a\040b\011c\012d\134e"
        );
        assert_eq!(escape(Path::new("/ünïcode/ok")), "/ünïcode/ok");
        let latin1 = PathBuf::from(OsString::from_vec(b"/caf\xe9".to_vec()));
        assert_eq!(escape(&latin1), r"/caf\351");
    }

    fn non_nul_bytes() -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(1u8..=255, 1..64)
    }

    proptest! {
        #[test]
        fn escaped_paths_round_trip(mount_point in non_nul_bytes(), root in non_nul_bytes()) {
            let mount_point = PathBuf::from(OsString::from_vec(mount_point));
            let root = PathBuf::from(OsString::from_vec(root));
            let line = format!(
                "36 35 98:0 {} {} rw shared:1 - ext4 /dev/vda rw",
                escape(&root),
                escape(&mount_point)
            );
            let entry = parse_line(&line).unwrap();
            // Compare bytes: PathBuf equality would forgive "//" and trailing slashes.
            prop_assert_eq!(entry.mount_point.as_os_str(), mount_point.as_os_str());
            prop_assert_eq!(entry.root.as_os_str(), root.as_os_str());
        }

        #[test]
        fn parse_line_never_panics(line in ".*") {
            let _ = parse_line(&line);
        }

        #[test]
        fn parse_line_never_panics_on_near_misses(
            line in r"[0-9]{0,3}( [0-9:+\-]{0,6}){0,3}( [a-z/\\0-7]{0,8}){0,6}( -)?( [a-z0-9\\]{0,5}){0,4}"
        ) {
            let _ = parse_line(&line);
        }

        #[test]
        fn parse_never_panics_on_mutated_examples(position in 0usize..100, byte in any::<u8>()) {
            let mut bytes = EXAMPLE.as_bytes().to_vec();
            let position = position % bytes.len();
            bytes[position] = byte;
            let _ = parse(&String::from_utf8_lossy(&bytes));
        }
    }
}
