//! Request validation (`stickyvol::faces::request`): what a CSI client controls. The first byte picks
//! what the rest is: a volume or snapshot id, a host path, StorageClass parameters or mount
//! options as text, or one of the CSI requests the node plugin and controller validate, as the
//! protobuf bytes gRPC hands over. Each is validated as the service does it, and checked:
//! - an id accepted round-trips to the same string (parse, Display, serde) and is a plain file
//!   name; a refused one is NOT_FOUND (INVALID_ARGUMENT when empty);
//! - a path is accepted exactly when it is absolute, normalized and strictly beneath the
//!   kubelet directory (an independent statement of the rule), and comes back unchanged;
//! - accepted parameters and mount options are the documented ones, kept verbatim / sorted,
//!   deduplicated and each honoured by a bind mount;
//! - accepted pod info (NodePublishVolume's volume_context) is plain names, kept verbatim.
#![no_main]

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use prost::Message;
use stickyvol::class;
use stickyvol::csi;
use stickyvol::error::Error;
use stickyvol::faces::request::{self, Capability};
use stickyvol::host::mount;
use stickyvol::volume::state::id::{SnapshotId, VolumeId};
use stickyvol::volume::state::record::VolumeKind;

const KUBELET: &str = "/var/lib/kubelet";

fn check_volume_id(text: &str) {
    match request::volume_id(text) {
        Ok(id) => {
            assert_eq!(id.as_str(), text);
            assert_eq!(id.to_string(), text);
            assert_eq!(VolumeId::parse(id.as_str()).as_ref(), Some(&id));
            let json = serde_json::to_string(&id).unwrap();
            assert_eq!(serde_json::from_str::<VolumeId>(&json).unwrap(), id);
            assert!(text.starts_with("sv-"));
            plain_file_name(text);
        }
        Err(Error::InvalidArgument(_)) => assert!(text.is_empty()),
        Err(Error::NotFound(_)) => assert!(!text.is_empty()),
        Err(other) => panic!("volume id {text:?}: {other:?}"),
    }
}

fn check_snapshot_id(text: &str) {
    match request::snapshot_id("snapshot_id", text) {
        Ok(id) => {
            assert_eq!(id.as_str(), text);
            assert_eq!(id.to_string(), text);
            assert_eq!(SnapshotId::parse(id.as_str()).as_ref(), Some(&id));
            let json = serde_json::to_string(&id).unwrap();
            assert_eq!(serde_json::from_str::<SnapshotId>(&json).unwrap(), id);
            assert!(text.starts_with("ss-"));
            assert!(
                VolumeId::parse(text).is_none(),
                "a snapshot id is not a volume id"
            );
            plain_file_name(text);
        }
        Err(Error::InvalidArgument(_)) => assert!(text.is_empty()),
        Err(Error::NotFound(_)) => assert!(!text.is_empty()),
        Err(other) => panic!("snapshot id {text:?}: {other:?}"),
    }
}

/// Ids become file names: nothing but lowercase hex, letters of the prefix and dashes.
fn plain_file_name(text: &str) {
    assert!(text.len() <= 128);
    assert!(
        text.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
        "{text:?}"
    );
}

/// The rule, stated independently: "/" then non-empty components, none "." or "..", no NUL,
/// strictly beneath the kubelet directory.
fn normalized_beneath_kubelet(text: &str) -> bool {
    let Some(rest) = text.strip_prefix('/') else {
        return false;
    };
    let normalized = !text.contains('\0')
        && rest
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..");
    normalized && text.starts_with(&format!("{KUBELET}/"))
}

fn check_path(field: &str, text: &str) {
    let result = request::path_beneath(Path::new(KUBELET), field, text);
    let expected = normalized_beneath_kubelet(text);
    match result {
        Ok(path) => {
            assert!(expected, "{text:?} accepted");
            assert_eq!(path.as_os_str(), text);
            assert!(path.is_absolute() && path.starts_with(KUBELET) && path != Path::new(KUBELET));
        }
        Err(Error::InvalidArgument(_)) => assert!(!expected, "{text:?} refused"),
        Err(other) => panic!("{field} {text:?}: {other:?}"),
    }
}

fn check_expand_path(text: &str) {
    let device = text.strip_prefix("/dev/").is_some_and(|name| {
        !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\0'])
    });
    let expected = normalized_beneath_kubelet(text) || device;
    match request::expand_volume_path(Path::new(KUBELET), text) {
        Ok(path) => {
            assert!(expected, "{text:?} accepted");
            assert_eq!(path.as_os_str(), text);
        }
        Err(Error::InvalidArgument(_)) => assert!(!expected, "{text:?} refused"),
        Err(other) => panic!("volume_path {text:?}: {other:?}"),
    }
}

fn check_mount_flags(options: &[String]) {
    let Ok(flags) = request::mount_flags(options) else {
        return;
    };
    assert!(
        flags.windows(2).all(|w| w[0] < w[1]),
        "sorted, deduplicated"
    );
    for flag in &flags {
        assert!(!flag.is_empty() && !flag.contains(',') && flag.trim() == flag);
        assert!(mount::bind_flag(flag).is_some(), "{flag:?}");
        assert!(
            options.iter().any(|option| option.contains(flag.as_str())),
            "{flag:?} came from the request"
        );
    }
}

fn check_parameters(params: &HashMap<String, String>) {
    let Ok(parsed) = request::parameters(params) else {
        return;
    };
    let raw: BTreeMap<_, _> = params.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    assert_eq!(parsed.raw, raw);
    for key in params.keys() {
        assert!(
            class::ACCEPTED.contains(&key.as_str())
                || key.starts_with(class::PROVISIONER_PARAMETER_PREFIX),
            "{key:?}"
        );
    }
    match params.get(class::PARAM_POOL) {
        Some(pool) => assert_eq!(&parsed.pool, pool),
        None => assert_eq!(parsed.pool, "default"),
    }
    assert!((1..=63).contains(&parsed.pool.len()));
    assert!(
        parsed
            .pool
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    );
    for (key, value) in [
        (class::PARAM_REQUIRE_ENFORCEMENT, parsed.require_enforcement),
        (class::PARAM_SHARED_ACCESS, parsed.shared_access),
    ] {
        assert_eq!(value, params.get(key).is_some_and(|v| v == "true"));
    }
    assert_eq!(
        parsed.on_overflow.as_str(),
        params
            .get(class::PARAM_ON_OVERFLOW)
            .map_or("evict", String::as_str)
    );
}

/// Accepted pod info is kubelet's three keys verbatim, each a plain name that cannot reshape the
/// API path it goes into.
fn check_pod_info(context: &HashMap<String, String>) {
    let Ok(Some(pod)) = request::pod_info(context) else {
        return;
    };
    assert_eq!(Some(&pod.name), context.get(request::POD_NAME_KEY));
    assert_eq!(
        Some(&pod.namespace),
        context.get(request::POD_NAMESPACE_KEY)
    );
    assert_eq!(Some(&pod.uid), context.get(request::POD_UID_KEY));
    for part in [&pod.name, &pod.namespace, &pod.uid] {
        assert!(!part.is_empty() && part.len() <= 253);
        assert!(
            part.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        );
        assert!(part.as_bytes()[0].is_ascii_alphanumeric());
        assert!(part.as_bytes()[part.len() - 1].is_ascii_alphanumeric());
    }
}

fn check_capability(cap: &csi::VolumeCapability, parsed: &Capability) {
    use csi::volume_capability::AccessType;
    match (&cap.access_type, parsed.kind) {
        (Some(AccessType::Block(_)), VolumeKind::Block) => assert!(parsed.mount_flags.is_empty()),
        (Some(AccessType::Mount(mount)), VolumeKind::Filesystem) => {
            assert!(mount.fs_type.is_empty());
            let flags = request::mount_flags(&mount.mount_flags).ok();
            assert_eq!(flags.as_ref(), Some(&parsed.mount_flags));
        }
        other => panic!("{other:?}"),
    }
}

fn capability(cap: Option<&csi::VolumeCapability>) {
    if let (Some(cap), Ok(parsed)) = (cap, request::capability(cap)) {
        check_capability(cap, &parsed);
        let _ = parsed.unsupported_reason(false);
    }
}

/// `key=value` lines.
fn text_parameters(text: &str) -> HashMap<String, String> {
    text.lines()
        .map(|line| match line.split_once('=') {
            Some((key, value)) => (key.to_string(), value.to_string()),
            None => (line.to_string(), String::new()),
        })
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let Some((&what, rest)) = data.split_first() else {
        return;
    };
    // gRPC refuses strings that are not UTF-8 before we see them (prost checks).
    let text = std::str::from_utf8(rest).ok();
    match what % 9 {
        0 => text.into_iter().for_each(|text| {
            check_volume_id(text);
            check_snapshot_id(text);
        }),
        1 => text.into_iter().for_each(|text| {
            check_path("target_path", text);
            check_expand_path(text);
        }),
        2 => text
            .into_iter()
            .for_each(|text| check_parameters(&text_parameters(text))),
        3 => text.into_iter().for_each(|text| {
            check_mount_flags(&text.split('\n').map(String::from).collect::<Vec<_>>());
            let _ = request::snapshot_parameters(&text_parameters(text));
        }),
        4 => {
            let Ok(req) = csi::NodePublishVolumeRequest::decode(rest) else {
                return;
            };
            check_volume_id(&req.volume_id);
            check_path("target_path", &req.target_path);
            if !req.staging_target_path.is_empty() {
                check_path("staging_target_path", &req.staging_target_path);
            }
            capability(req.volume_capability.as_ref());
            check_pod_info(&req.volume_context);
        }
        5 => {
            let Ok(req) = csi::CreateVolumeRequest::decode(rest) else {
                return;
            };
            if let Ok(name) = request::volume_name(&req.name) {
                assert!(!name.is_empty() && name.len() <= request::MAX_NAME_BYTES);
            }
            if let Ok(caps) = request::capabilities(&req.volume_capabilities) {
                assert_eq!(caps.len(), req.volume_capabilities.len());
                assert!(caps.iter().all(|cap| cap.kind == caps[0].kind));
                for (cap, parsed) in req.volume_capabilities.iter().zip(&caps) {
                    check_capability(cap, parsed);
                }
            }
            check_parameters(&req.parameters);
            if let Some(source) = &req.volume_content_source
                && let Ok(parsed) = request::content_source(source)
            {
                assert_eq!(&request::csi_content_source(&parsed), source);
            }
            let _ = request::topology_allows(
                req.accessibility_requirements
                    .as_ref()
                    .map_or(&[][..], |t| &t.requisite),
                "topology.stickyvol/node",
                "node-a",
            );
        }
        6 => {
            let Ok(req) = csi::CreateSnapshotRequest::decode(rest) else {
                return;
            };
            let _ = request::volume_name(&req.name);
            check_volume_id(&req.source_volume_id);
            if let Ok(params) = request::snapshot_parameters(&req.parameters) {
                assert!(
                    params
                        .keys()
                        .all(|k| k.starts_with(class::PROVISIONER_PARAMETER_PREFIX))
                );
            }
        }
        7 => {
            let Ok(req) = csi::NodeExpandVolumeRequest::decode(rest) else {
                return;
            };
            check_volume_id(&req.volume_id);
            check_expand_path(&req.volume_path);
            capability(req.volume_capability.as_ref());
        }
        _ => {
            let Ok(req) = csi::DeleteSnapshotRequest::decode(rest) else {
                return;
            };
            check_snapshot_id(&req.snapshot_id);
        }
    }
});
