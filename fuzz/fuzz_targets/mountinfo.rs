//! The /proc/self/mountinfo parser on arbitrary bytes (what `mountinfo::read_self` gets from
//! the kernel). Beyond "never panics": every non-empty line becomes exactly one entry, and an
//! entry rendered back into a line (paths and labels escaped with `mountinfo::escape`, option
//! fields as printed) parses to the same entry.
#![no_main]

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use stickyvol::fuzzing::parse_mountinfo;
use stickyvol::host::mountinfo::{self, MountEntry};

fn render(entry: &MountEntry) -> String {
    let text = |label: &str| mountinfo::escape(Path::new(OsStr::from_bytes(label.as_bytes())));
    let mut fields = vec![
        entry.mount_id.to_string(),
        entry.parent_id.to_string(),
        format!("{}:{}", entry.major, entry.minor),
        mountinfo::escape(&entry.root),
        mountinfo::escape(&entry.mount_point),
        entry.mount_options.clone(),
    ];
    fields.extend(entry.optional_fields.iter().cloned());
    fields.push("-".into());
    fields.push(text(&entry.fs_type));
    fields.push(text(&entry.source));
    fields.push(entry.super_options.clone());
    fields.join(" ")
}

fuzz_target!(|data: &[u8]| {
    let Ok(entries) = parse_mountinfo(data) else {
        return;
    };
    let lines = data.split(|&b| b == b'\n').filter(|line| !line.is_empty());
    assert_eq!(entries.len(), lines.count(), "one entry per non-empty line");
    for entry in &entries {
        // Fields are split on spaces: none can hold one, and "-" ends the optional fields.
        assert!(!entry.mount_options.contains([' ', '\n']));
        assert!(!entry.super_options.is_empty() && !entry.super_options.contains([' ', '\n']));
        for field in &entry.optional_fields {
            assert!(field != "-" && !field.contains([' ', '\n']));
        }
        let line = render(entry);
        assert!(!line.contains('\n'), "escaped: {line:?}");
        let again = mountinfo::parse_line(&line)
            .unwrap_or_else(|err| panic!("{entry:?} rendered as {line:?} does not parse: {err}"));
        assert_eq!(&again, entry, "rendered as {line:?}");
        // An escaped path is one field: no separator survives escaping.
        for path in [&entry.root, &entry.mount_point] {
            assert!(!mountinfo::escape(path).contains([' ', '\t', '\n']));
        }
    }
});
