use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use super::*;

fn given(pairs: &[(&str, &str)]) -> Result<ClassParameters, String> {
    ClassParameters::parse(
        &pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

#[test]
fn parameters_refuse_unknown_keys_and_pass_provisioner_keys() {
    let mut params = HashMap::new();
    params.insert(
        "csi.storage.k8s.io/pvc/name".to_string(),
        "data".to_string(),
    );
    assert!(ClassParameters::parse(&params).is_ok());
    params.insert("sizeLimit".to_string(), "1".to_string());
    let err = ClassParameters::parse(&params).unwrap_err();
    assert!(err.contains("\"sizeLimit\""), "{err}");
    for key in ACCEPTED {
        assert!(err.contains(key), "{err} lists {key}");
    }
}

#[test]
fn parameter_maps_are_bounded_in_count_and_bytes() {
    let key = |i: usize| format!("{PROVISIONER_PARAMETER_PREFIX}k{i}");
    let at_most: HashMap<_, _> = (0..MAX_PARAMETERS).map(|i| (key(i), "v".into())).collect();
    assert!(ClassParameters::parse(&at_most).is_ok());
    let mut too_many = at_most.clone();
    too_many.insert(key(MAX_PARAMETERS), "v".into());
    assert!(ClassParameters::parse(&too_many).is_err());
    let value = |len| HashMap::from([(key(0), "x".repeat(len - key(0).len()))]);
    assert!(ClassParameters::parse(&value(MAX_PARAMETER_BYTES)).is_ok());
    assert!(ClassParameters::parse(&value(MAX_PARAMETER_BYTES + 1)).is_err());
}

#[test]
fn class_parameters_are_typed_with_defaults() {
    let plain = given(&[]).unwrap();
    assert_eq!(
        (
            plain.pool.as_str(),
            plain.allocation,
            plain.require_enforcement,
            plain.shared_access,
            plain.on_node_loss,
            plain.image_fs,
            plain.on_overflow,
        ),
        (
            "default",
            None,
            false,
            false,
            OnNodeLoss::Keep,
            None,
            OnOverflow::Evict
        )
    );
    let set = given(&[
        ("pool", "nvme-1"),
        ("blockAllocation", "thick"),
        ("requireEnforcement", "true"),
        ("sharedAccess", "true"),
        ("onNodeLoss", "release"),
        ("onOverflow", "report"),
        ("csi.storage.k8s.io/fstype", "xfs"),
    ])
    .unwrap();
    assert_eq!(
        (
            set.pool.as_str(),
            set.allocation,
            set.require_enforcement,
            set.shared_access,
            set.on_node_loss,
            set.image_fs,
            set.on_overflow,
        ),
        (
            "nvme-1",
            Some(Allocation::Thick),
            true,
            true,
            OnNodeLoss::Release,
            Some(FsType::Xfs),
            OnOverflow::Report
        )
    );
    assert_eq!(set.raw.len(), 7);
    assert_eq!(given(&[(PARAM_FS_TYPE, "")]).unwrap().image_fs, None);
}

#[test]
fn a_bad_value_is_refused_naming_its_key() {
    for bad in [
        ("pool", "NVMe"),
        ("pool", "../x"),
        ("pool", ""),
        ("blockAllocation", "sparse"),
        ("requireEnforcement", "yes"),
        ("sharedAccess", "True"),
        ("onNodeLoss", "delete"),
        ("onNodeLoss", ""),
        ("onOverflow", "Evict"),
        ("onOverflow", "delete"),
        ("onOverflow", ""),
    ] {
        let err = given(&[bad]).unwrap_err();
        assert!(err.contains(bad.0), "{err}");
    }
    for fs_type in ["zfs", "EXT4", "../xfs"] {
        let err = given(&[(PARAM_FS_TYPE, fs_type)]).unwrap_err();
        assert!(err.contains(fs_type), "{err}");
    }
}

#[test]
fn lenient_keeps_each_key_valid_on_its_own() {
    let lenient = |pairs: &[(&str, &str)]| {
        ClassParameters::lenient(
            &pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    };
    let class = lenient(&[("pool", "fast"), ("bogus", "x"), ("onOverflow", "maybe")]);
    assert_eq!(class.pool, "fast");
    assert_eq!(class.on_overflow, OnOverflow::Evict);
    assert_eq!(class.raw.keys().collect::<Vec<_>>(), ["pool"]);
    assert_eq!(lenient(&[("pool", "Bad")]).pool, "default");
}

/// The first column of the StorageClass parameter table in a doc (the table whose header
/// begins `| key | values |`): the keys it lists.
fn documented_keys(doc: &str) -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(doc);
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let headers: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].starts_with("| key | values |"))
        .collect();
    assert_eq!(headers.len(), 1, "{doc}: one StorageClass parameter table");
    lines[headers[0] + 2..]
        .iter()
        .take_while(|line| line.starts_with('|'))
        .map(|row| {
            let key = row.split('|').nth(1).unwrap().trim();
            let bare = key.strip_prefix('`').and_then(|k| k.strip_suffix('`'));
            bare.unwrap_or_else(|| panic!("{doc}: {key:?} is not a `key`"))
                .to_string()
        })
        .collect()
}

#[test]
fn the_docs_list_exactly_the_keys_the_code_accepts() {
    let accepted: BTreeSet<String> = ACCEPTED.iter().map(|k| k.to_string()).collect();
    for doc in ["docs/reference.md", "docs/operations/storage.md"] {
        let listed = documented_keys(doc);
        let set: BTreeSet<String> = listed.iter().cloned().collect();
        assert_eq!(
            set.len(),
            listed.len(),
            "{doc} lists a key twice: {listed:?}"
        );
        let missing: Vec<_> = accepted.difference(&set).collect();
        let unknown: Vec<_> = set.difference(&accepted).collect();
        assert!(
            missing.is_empty() && unknown.is_empty(),
            "{doc}'s StorageClass parameter table: missing {missing:?}, not accepted {unknown:?}"
        );
    }
    let reference =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/reference.md"))
            .unwrap();
    for said in [
        PARAM_FS_TYPE.to_string(),
        format!("{MAX_PARAMETERS} keys"),
        format!("{} KiB", MAX_PARAMETER_BYTES >> 10),
    ] {
        assert!(reference.contains(&said), "docs/reference.md says {said}");
    }
}
