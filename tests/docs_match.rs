//! The documentation lists what users can set, and nothing it lists is gone: every flag of
//! `stickyvol serve` has its row in docs/reference.md's flags table, every StorageClass parameter
//! the driver accepts is in docs/operations/storage.md's "The StorageClass", and every value of the
//! Helm chart (down to its second level) is in docs/operations/install.md's values table. A flag,
//! parameter or value added without documentation fails here; the checks' own tests show each
//! catching one left out on purpose.

use std::collections::BTreeSet;

use clap::CommandFactory;

const REFERENCE: &str = include_str!("../docs/reference.md");
const STORAGE: &str = include_str!("../docs/operations/storage.md");
const INSTALL: &str = include_str!("../docs/operations/install.md");
const VALUES: &str = include_str!("../charts/stickyvol/values.yaml");

/// The text of `doc` from the heading `heading` (a whole line) to the next heading of its level.
fn section<'a>(doc: &'a str, heading: &str) -> &'a str {
    let start = (doc.find(&format!("{heading}\n")))
        .filter(|&at| at == 0 || doc[..at].ends_with('\n'))
        .unwrap_or_else(|| panic!("no heading {heading:?}"));
    let level = heading.split(' ').next().unwrap();
    let body = &doc[start + heading.len() + 1..];
    let end = body.find(&format!("\n{level} ")).unwrap_or(body.len());
    &body[..end]
}

/// The backticked words of the first cell of each table row: `| `--a`, `--b` | …` gives --a, --b.
fn first_cells(section: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in section.lines().filter(|l| l.starts_with("| `")) {
        let cell = line.split('|').nth(1).unwrap_or("");
        // `--pool NAME=PATH`: the flag without its metavar.
        let words = cell.split('`').skip(1).step_by(2);
        out.extend(
            words
                .filter_map(|w| w.split_whitespace().next())
                .map(str::to_string),
        );
    }
    out
}

/// The flags in `wanted` that `documented` lacks, and the documented flags not wanted.
fn compare(wanted: &BTreeSet<String>, documented: &BTreeSet<String>) -> (Vec<String>, Vec<String>) {
    let missing = wanted.difference(documented).cloned().collect();
    let stale = documented.difference(wanted).cloned().collect();
    (missing, stale)
}

fn serve_flags() -> BTreeSet<String> {
    let command = stickyvol::cli::Cli::command();
    let serve = command.find_subcommand("serve").expect("the serve command");
    let mut flags: BTreeSet<String> = (serve.get_arguments())
        .filter(|arg| !arg.is_hide_set())
        .filter_map(|arg| arg.get_long().map(|long| format!("--{long}")))
        .filter(|flag| flag != "--help")
        .collect();
    // Global, so serve's too.
    flags.insert("--log-format".into());
    flags
}

#[test]
fn every_flag_of_serve_has_its_row_and_every_row_a_flag() {
    let documented = first_cells(section(REFERENCE, "## `stickyvol serve` flags"));
    let documented = documented
        .into_iter()
        .filter(|w| w.starts_with("--"))
        .collect();
    let (missing, stale) = compare(&serve_flags(), &documented);
    assert!(
        missing.is_empty(),
        "flags without a row in docs/reference.md: {missing:?}"
    );
    assert!(
        stale.is_empty(),
        "rows in docs/reference.md for no flag: {stale:?}"
    );
}

/// The StorageClass parameters `doc_section` does not name in backticks.
fn undocumented_parameters(doc_section: &str, accepted: &[&str]) -> Vec<String> {
    (accepted.iter())
        .filter(|key| !doc_section.contains(&format!("`{key}`")))
        .map(|key| key.to_string())
        .collect()
}

#[test]
fn every_storageclass_parameter_is_documented() {
    let mut accepted = stickyvol::class::ACCEPTED.to_vec();
    accepted.push(stickyvol::class::PARAM_FS_TYPE);
    let missing = undocumented_parameters(section(STORAGE, "## The StorageClass"), &accepted);
    assert!(
        missing.is_empty(),
        "StorageClass parameters not in docs/operations/storage.md: {missing:?}"
    );
}

/// The chart's values down to the second level ("image.digest", "node.updateStrategy"), as
/// values.yaml has them.
fn value_paths(values: &str) -> Vec<String> {
    let root: serde_yaml::Mapping = serde_yaml::from_str(values).expect("values.yaml");
    let mut out = vec![];
    for (key, value) in &root {
        let key = key.as_str().unwrap();
        match value.as_mapping() {
            Some(children) if !children.is_empty() => out.extend(
                children
                    .keys()
                    .map(|child| format!("{key}.{}", child.as_str().unwrap())),
            ),
            _ => out.push(key.to_string()),
        }
    }
    out
}

/// The names a values table gives, relative names (`.labels`) completed from the name before
/// them (`monitoring.podMonitor.enabled`, `.labels` → monitoring.podMonitor.labels).
fn table_names(table: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in table.lines().filter(|l| l.starts_with("| `")) {
        let cell = line.split('|').nth(1).unwrap_or("");
        let mut parent = "";
        for name in cell.split('`').skip(1).step_by(2) {
            match name.strip_prefix('.') {
                Some(relative) => out.insert(format!("{parent}.{relative}")),
                None => {
                    parent = name.rsplit_once('.').map(|(p, _)| p).unwrap_or("");
                    out.insert(name.to_string())
                }
            };
        }
    }
    out
}

/// Whether `path` is named, itself or under it (`node.resources.<container>` names
/// node.resources; `sidecars.*.image` names every sidecars.X).
fn names(documented: &BTreeSet<String>, path: &str) -> bool {
    documented.iter().any(|name| {
        let name_parts: Vec<&str> = name.split('.').collect();
        let path_parts: Vec<&str> = path.split('.').collect();
        path_parts.len() <= name_parts.len()
            && (path_parts.iter().zip(&name_parts))
                .all(|(p, n)| p == n || *n == "*" || n.starts_with('<'))
    })
}

fn undocumented_values(values: &str, table: &str) -> Vec<String> {
    let documented = table_names(table);
    (value_paths(values).into_iter())
        .filter(|path| !names(&documented, path))
        .collect()
}

#[test]
fn every_chart_value_is_in_the_values_table() {
    // From the line that introduces it to the blank line after its last row.
    let start = INSTALL
        .find("What the values set")
        .expect("the values table");
    let after = &INSTALL[start..];
    let rows = after.find("\n|").expect("the values table's rows");
    let table = &after[rows..];
    let table = &table[..table.find("\n\n").unwrap_or(table.len())];
    let missing = undocumented_values(VALUES, table);
    assert!(
        missing.is_empty(),
        "chart values not in docs/operations/install.md's table: {missing:?}"
    );
}

/// Each check above, given documentation with one thing left out on purpose, names that thing.
#[test]
fn each_check_names_what_was_left_out() {
    let doc = "## `stickyvol serve` flags\n\n| `--endpoint` | x |\n| `--gone` | y |\n\n## Next\n";
    let documented = first_cells(section(doc, "## `stickyvol serve` flags"));
    let wanted: BTreeSet<String> = ["--endpoint", "--node-id"].map(String::from).into();
    assert_eq!(
        compare(&wanted, &documented),
        (vec!["--node-id".to_string()], vec!["--gone".to_string()])
    );
    let classes = "| `pool` | a pool |\n- the parameter `csi.storage.k8s.io/fstype`";
    assert_eq!(
        undocumented_parameters(
            classes,
            &["pool", "onOverflow", "csi.storage.k8s.io/fstype"]
        ),
        ["onOverflow"]
    );
    let values =
        "image:\n  repository: r\n  digest: \"\"\nnode:\n  resources:\n    a: {}\nlogLevel: info\n";
    let table = "| `image.repository`, `.tag` | … |\n| `node.resources.<container>` | … |";
    assert_eq!(
        undocumented_values(values, table),
        ["image.digest", "logLevel"]
    );
}
