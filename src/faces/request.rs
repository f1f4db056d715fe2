//! Turning CSI request fields into typed, validated values, before anything touches the host.
//!
//! Rules: a required field that is empty is INVALID_ARGUMENT; a volume id that is not ours is
//! NOT_FOUND (it never becomes part of a path); host paths must be absolute, normalized and
//! strictly beneath the kubelet directory.

use std::collections::{BTreeMap, HashMap};
use std::path::{Component, Path, PathBuf};

use crate::class::{
    self, ClassParameters, Encryption, IoLimits, Mutable, PROVISIONER_PARAMETER_PREFIX,
};
use crate::csi;
use crate::csi::volume_capability::AccessType;
use crate::csi::volume_capability::access_mode::Mode as CsiMode;
use crate::csi::volume_content_source::Type as SourceType;
use crate::error::{Error, Result};
use crate::host::crypt::Key;
use crate::host::mount;
pub use crate::volume::capability::Capability;
use crate::volume::encryption;
use crate::volume::state::id::{SnapshotId, VolumeId};
use crate::volume::state::record::{AccessMode, ContentSource, PodRef, VolumeKind};

pub fn required<'a>(field: &str, value: &'a str) -> Result<&'a str> {
    if value.is_empty() {
        Err(Error::InvalidArgument(format!("{field} is required")))
    } else {
        Ok(value)
    }
}

/// Longest CreateVolume name we keep: far above what COs send (Kubernetes PV names are at most
/// 253 bytes, csi-sanity sends 128), low enough that a record stays small.
pub const MAX_NAME_BYTES: usize = 1024;

/// A CreateVolume name: required and bounded.
pub fn volume_name(value: &str) -> Result<&str> {
    required("name", value)?;
    if value.len() > MAX_NAME_BYTES {
        return Err(Error::InvalidArgument(format!(
            "name is {} bytes long; at most {MAX_NAME_BYTES} are accepted",
            value.len()
        )));
    }
    Ok(value)
}

/// A volume id from a request: empty is INVALID_ARGUMENT, anything not ours NOT_FOUND.
pub fn volume_id(value: &str) -> Result<VolumeId> {
    required("volume_id", value)?;
    VolumeId::parse(value)
        .ok_or_else(|| Error::NotFound(format!("volume {value:?} does not exist")))
}

/// A snapshot id from a request: empty is INVALID_ARGUMENT, anything not ours NOT_FOUND.
pub fn snapshot_id(field: &str, value: &str) -> Result<SnapshotId> {
    required(field, value)?;
    SnapshotId::parse(value)
        .ok_or_else(|| Error::NotFound(format!("snapshot {value:?} does not exist")))
}

/// CreateVolume's volume_content_source: a snapshot or a volume, by an id of ours.
pub fn content_source(source: &csi::VolumeContentSource) -> Result<ContentSource> {
    match &source.r#type {
        Some(SourceType::Snapshot(snapshot)) => Ok(ContentSource::Snapshot(snapshot_id(
            "volume_content_source.snapshot.snapshot_id",
            &snapshot.snapshot_id,
        )?)),
        Some(SourceType::Volume(volume)) => {
            required("volume_content_source.volume.volume_id", &volume.volume_id)?;
            VolumeId::parse(&volume.volume_id)
                .map(ContentSource::Volume)
                .ok_or_else(|| {
                    Error::NotFound(format!(
                        "source volume {:?} does not exist",
                        volume.volume_id
                    ))
                })
        }
        None => Err(Error::InvalidArgument(
            "volume_content_source must name a snapshot or a volume".into(),
        )),
    }
}

/// The CSI form of a content source, as CreateVolume's response echoes it.
pub fn csi_content_source(source: &ContentSource) -> csi::VolumeContentSource {
    use crate::csi::volume_content_source::{SnapshotSource, VolumeSource};
    csi::VolumeContentSource {
        r#type: Some(match source {
            ContentSource::Snapshot(id) => SourceType::Snapshot(SnapshotSource {
                snapshot_id: id.to_string(),
            }),
            ContentSource::Volume(id) => SourceType::Volume(VolumeSource {
                volume_id: id.to_string(),
            }),
        }),
    }
}

/// VolumeSnapshotClass parameters: none of our own yet; csi-snapshotter's `csi.storage.k8s.io/*`
/// keys pass, anything else is refused so a typo never goes unnoticed.
pub fn snapshot_parameters(params: &HashMap<String, String>) -> Result<BTreeMap<String, String>> {
    class_parameters("VolumeSnapshotClass", params, &[])
}

/// VolumeGroupSnapshotClass parameters, as a VolumeSnapshotClass's, and `deletionPolicy`,
/// ignored: Kubernetes' storage tests copy the class's deletion policy into its parameters.
pub fn group_snapshot_parameters(
    params: &HashMap<String, String>,
) -> Result<BTreeMap<String, String>> {
    class_parameters("VolumeGroupSnapshotClass", params, &["deletionPolicy"])
}

fn class_parameters(
    class: &str,
    params: &HashMap<String, String>,
    ignored: &[&str],
) -> Result<BTreeMap<String, String>> {
    class::bounded(class, params).map_err(Error::InvalidArgument)?;
    let mut keys: Vec<_> = params.keys().collect();
    keys.sort();
    if let Some(key) = keys.into_iter().find(|key| {
        !key.starts_with(PROVISIONER_PARAMETER_PREFIX) && !ignored.contains(&key.as_str())
    }) {
        return Err(Error::InvalidArgument(format!(
            "unknown {class} parameter {key:?} (stickyvol accepts only {PROVISIONER_PARAMETER_PREFIX}* keys)"
        )));
    }
    Ok(params.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
}

/// Access modes that can be honoured by data that lives on one node.
fn access_mode(mode: i32) -> Result<AccessMode> {
    let mode = CsiMode::try_from(mode)
        .map_err(|_| Error::InvalidArgument(format!("unknown access mode {mode}")))?;
    Ok(match mode {
        CsiMode::SingleNodeWriter => AccessMode::SingleNodeWriter,
        CsiMode::SingleNodeReaderOnly => AccessMode::SingleNodeReaderOnly,
        CsiMode::SingleNodeSingleWriter => AccessMode::SingleNodeSingleWriter,
        CsiMode::SingleNodeMultiWriter => AccessMode::SingleNodeMultiWriter,
        CsiMode::MultiNodeReaderOnly => AccessMode::MultiNodeReaderOnly,
        CsiMode::MultiNodeSingleWriter => AccessMode::MultiNodeSingleWriter,
        CsiMode::MultiNodeMultiWriter => AccessMode::MultiNodeMultiWriter,
        CsiMode::Unknown => {
            return Err(Error::InvalidArgument("access_mode is required".into()));
        }
    })
}

/// Parses one capability. Unsupported modes are reported by `Capability::unsupported_reason`, not here,
/// because ValidateVolumeCapabilities must answer them with a message rather than an error.
pub fn capability(cap: Option<&csi::VolumeCapability>) -> Result<Capability> {
    let cap = cap.ok_or_else(|| Error::InvalidArgument("volume_capability is required".into()))?;
    let mode = cap.access_mode.as_ref().ok_or_else(|| {
        Error::InvalidArgument("volume_capability.access_mode is required".into())
    })?;
    let access_mode = access_mode(mode.mode)?;
    match &cap.access_type {
        Some(AccessType::Block(_)) => Ok(Capability {
            kind: VolumeKind::Block,
            access_mode,
            mount_flags: Vec::new(),
        }),
        Some(AccessType::Mount(mount)) => Ok(Capability {
            kind: mount_kind(&mount.fs_type)?,
            access_mode,
            mount_flags: mount_flags(&mount.mount_flags)?,
        }),
        None => Err(Error::InvalidArgument(
            "volume_capability.access_type (block or mount) is required".into(),
        )),
    }
}

/// A mount capability's kind: no fs_type is a directory volume, a filesystem we can make is
/// an image volume holding it.
fn mount_kind(fs_type: &str) -> Result<VolumeKind> {
    match class::image_fs(fs_type).map_err(Error::InvalidArgument)? {
        Some(fs) => Ok(VolumeKind::Image(fs)),
        None => Ok(VolumeKind::Filesystem),
    }
}

/// Parses a non-empty list of capabilities that must all ask for the same access type.
pub fn capabilities(caps: &[csi::VolumeCapability]) -> Result<Vec<Capability>> {
    if caps.is_empty() {
        return Err(Error::InvalidArgument(
            "volume_capabilities is required".into(),
        ));
    }
    let parsed = caps
        .iter()
        .map(|cap| capability(Some(cap)))
        .collect::<Result<Vec<_>>>()?;
    if parsed.iter().any(|cap| cap.kind != parsed[0].kind) {
        return Err(Error::InvalidArgument(
            "volume_capabilities mix access types (block, mount) or filesystem types".into(),
        ));
    }
    Ok(parsed)
}

/// Mount options that a bind mount can honour, sorted and deduplicated; others are refused.
pub fn mount_flags(options: &[String]) -> Result<Vec<String>> {
    let mut accepted = Vec::with_capacity(options.len());
    for option in options {
        // Kubernetes passes mountOptions through unchanged; "a,b" is one entry in some setups.
        for option in option.split(',').map(str::trim).filter(|o| !o.is_empty()) {
            if mount::bind_flag(option).is_none() {
                return Err(Error::InvalidArgument(format!(
                    "mount option {option:?} cannot be applied to a bind mount; accepted: {}",
                    mount::accepted_options().join(", ")
                )));
            }
            accepted.push(option.to_string());
        }
    }
    accepted.sort();
    accepted.dedup();
    Ok(accepted)
}

/// The key of an encrypted volume, from NodeStageVolume's secrets (the class's node-stage
/// Secret), if they hold one; a key too short or too long is INVALID_ARGUMENT (never quoted).
pub fn stage_key(secrets: &HashMap<String, String>) -> Result<Option<Key>> {
    let Some(value) = secrets.get(encryption::SECRET_KEY) else {
        return Ok(None);
    };
    Key::new(value.as_bytes().to_vec())
        .map(Some)
        .map_err(|why| {
            Error::InvalidArgument(format!(
                "node-stage secret {:?}: {why}",
                encryption::SECRET_KEY
            ))
        })
}

/// An encrypted class's volumes must be image or block volumes: a directory shares the pool's
/// filesystem and cannot be encrypted alone.
pub fn encryption_fits(kind: VolumeKind, encryption: Encryption) -> Result<bool> {
    match (encryption, kind) {
        (Encryption::None, _) => Ok(false),
        (Encryption::Luks2, VolumeKind::Image(_) | VolumeKind::Block) => Ok(true),
        (Encryption::Luks2, VolumeKind::Filesystem) => Err(Error::InvalidArgument(
            "StorageClass parameter encryption: luks2 applies to image volumes (a class with csi.storage.k8s.io/fstype: ext4 or xfs) and block volumes; a directory volume shares its pool's filesystem and cannot be encrypted alone".into(),
        )),
    }
}

/// StorageClass parameters (CreateVolume, ValidateVolumeCapabilities, GetCapacity): a mistake
/// is INVALID_ARGUMENT naming the key (see `ClassParameters::parse`).
pub fn parameters(params: &HashMap<String, String>) -> Result<ClassParameters> {
    ClassParameters::parse(params).map_err(Error::InvalidArgument)
}

/// A VolumeAttributesClass's parameters (CreateVolume's and ControllerModifyVolume's
/// `mutable_parameters`): a mistake is INVALID_ARGUMENT naming the key.
pub fn mutable(params: &HashMap<String, String>) -> Result<Mutable> {
    class::bounded("VolumeAttributesClass", params).map_err(Error::InvalidArgument)?;
    Mutable::parse(params).map_err(Error::InvalidArgument)
}

/// IO limits are a device's: a directory volume shares its pool's device with every other
/// volume there, so a limit on it could not be its own.
pub fn limits_fit(kind: VolumeKind, limits: &IoLimits) -> Result<()> {
    match (kind, limits.is_unlimited()) {
        (VolumeKind::Filesystem, false) => Err(Error::InvalidArgument(format!(
            "IO limits ({}) apply to block and image volumes; a directory volume shares its pool's device with the pool's other volumes, so its IO cannot be limited alone: use a class with csi.storage.k8s.io/fstype (an image volume) or a block claim",
            limits.describe()
        ))),
        _ => Ok(()),
    }
}

/// volume_context keys kubelet adds to NodePublishVolume when the CSIDriver has
/// `podInfoOnMount: true`.
pub const POD_NAME_KEY: &str = "csi.storage.k8s.io/pod.name";
pub const POD_NAMESPACE_KEY: &str = "csi.storage.k8s.io/pod.namespace";
pub const POD_UID_KEY: &str = "csi.storage.k8s.io/pod.uid";

/// The pod a NodePublishVolume is for: None when kubelet sent no pod info; INVALID_ARGUMENT
/// when it is partial or not a pod's name, namespace and uid (they end up in API requests).
pub fn pod_info(context: &HashMap<String, String>) -> Result<Option<PodRef>> {
    let get = |key: &str| context.get(key).map(String::as_str);
    let (name, namespace, uid) = match (get(POD_NAME_KEY), get(POD_NAMESPACE_KEY), get(POD_UID_KEY))
    {
        (None, None, None) => return Ok(None),
        (Some(name), Some(namespace), Some(uid)) => (name, namespace, uid),
        _ => {
            return Err(Error::InvalidArgument(format!(
                "volume_context has part of the pod info only: {POD_NAME_KEY}, {POD_NAMESPACE_KEY} and {POD_UID_KEY} come together"
            )));
        }
    };
    let invalid = |key: &str, value: &str, expected: &str| {
        // Bounded in the message: the value is a caller's.
        let shown: String = value.chars().take(80).collect();
        Err(Error::InvalidArgument(format!(
            "volume_context {key} {shown:?} is not {expected}"
        )))
    };
    if !crate::config::is_object_name(name) {
        return invalid(POD_NAME_KEY, name, "a pod name");
    }
    if !(crate::config::is_object_name(namespace)
        && namespace.len() <= 63
        && !namespace.contains('.'))
    {
        return invalid(POD_NAMESPACE_KEY, namespace, "a namespace name");
    }
    let uid_ok = (1..=64).contains(&uid.len())
        && uid.starts_with(|c: char| c.is_ascii_alphanumeric())
        && uid.ends_with(|c: char| c.is_ascii_alphanumeric())
        && uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if !uid_ok {
        return invalid(POD_UID_KEY, uid, "a pod uid");
    }
    Ok(Some(PodRef {
        namespace: namespace.to_string(),
        name: name.to_string(),
        uid: uid.to_string(),
    }))
}

/// A target or staging path: absolute, normalized, strictly beneath `root` (the kubelet dir).
pub fn path_beneath(root: &Path, field: &str, value: &str) -> Result<PathBuf> {
    required(field, value)?;
    let path = Path::new(value);
    let invalid = |why: &str| Err(Error::InvalidArgument(format!("{field} {value:?} {why}")));
    if !path.is_absolute() {
        return invalid("must be an absolute path");
    }
    if value.contains('\0') {
        return invalid("contains a NUL byte");
    }
    let normalized: PathBuf = path.components().collect();
    let has_dots = path
        .components()
        .any(|c| matches!(c, Component::ParentDir | Component::CurDir));
    if has_dots || normalized.as_os_str() != path.as_os_str() {
        return invalid("must be normalized (no '.', '..', '//' or trailing '/')");
    }
    if !path.starts_with(root) || path == root {
        return invalid(&format!(
            "must lie beneath the kubelet directory {}",
            root.display()
        ));
    }
    Ok(normalized)
}

/// NodeExpandVolume's `volume_path`: a path beneath the kubelet dir, or, for a block volume, a
/// device node `/dev/NAME`: kubelet sends a block volume's device there, not a path in its own
/// directory (pkg/volume/csi/expander.go passes the DevicePath, e.g. `/dev/loop2`). The path is
/// only validated: growing works on the volume's own file and devices.
pub fn expand_volume_path(kubelet_dir: &Path, value: &str) -> Result<PathBuf> {
    let beneath = path_beneath(kubelet_dir, "volume_path", value);
    if beneath.is_ok() {
        return beneath;
    }
    let is_device_node = value.strip_prefix("/dev/").is_some_and(|name| {
        !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\0'])
    });
    if is_device_node {
        return Ok(PathBuf::from(value));
    }
    Err(Error::InvalidArgument(format!(
        "volume_path {value:?} must be a normalized absolute path beneath the kubelet directory \
         {} or a device node /dev/NAME",
        kubelet_dir.display()
    )))
}

/// Whether `requisite` topologies allow a volume on this node (empty means anywhere).
pub fn topology_allows(requisite: &[csi::Topology], key: &str, node_id: &str) -> bool {
    requisite.is_empty()
        || requisite
            .iter()
            .any(|t| t.segments.get(key).is_some_and(|v| v == node_id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::state::record::FsType;
    use proptest::prelude::*;

    #[test]
    fn an_expand_path_is_beneath_the_kubelet_dir_or_a_device_node() {
        let kubelet = Path::new("/var/lib/kubelet");
        for ok in [
            "/var/lib/kubelet/pods/x/volumes/y/mount",
            "/dev/loop2",
            "/dev/sdb",
        ] {
            assert_eq!(
                expand_volume_path(kubelet, ok).unwrap(),
                PathBuf::from(ok),
                "{ok}"
            );
        }
        for bad in [
            "",
            "/dev/",
            "/dev/..",
            "/dev/.",
            "/dev/../etc/passwd",
            "/dev/mapper/x",
            "/dev/loop2\0",
            "dev/loop2",
            "/etc/passwd",
            "/var/lib/kubelet",
            "/var/lib/kubelet/../x",
        ] {
            assert!(
                matches!(
                    expand_volume_path(kubelet, bad),
                    Err(Error::InvalidArgument(_))
                ),
                "{bad:?} was accepted"
            );
        }
    }

    fn mount_cap(mode: CsiMode, flags: &[&str], fs_type: &str) -> csi::VolumeCapability {
        csi::VolumeCapability {
            access_type: Some(AccessType::Mount(csi::volume_capability::MountVolume {
                fs_type: fs_type.into(),
                mount_flags: flags.iter().map(|s| s.to_string()).collect(),
                volume_mount_group: String::new(),
            })),
            access_mode: Some(csi::volume_capability::AccessMode { mode: mode as i32 }),
        }
    }

    #[test]
    fn paths_must_be_normalized_and_beneath_the_kubelet_dir() {
        let root = Path::new("/var/lib/kubelet");
        let ok = path_beneath(root, "target_path", "/var/lib/kubelet/pods/x/mount").unwrap();
        assert_eq!(ok, PathBuf::from("/var/lib/kubelet/pods/x/mount"));
        for bad in [
            "",
            "relative/path",
            "/var/lib/kubelet",
            "/var/lib/kubelet/",
            "/var/lib/kubeletx/pods",
            "/var/lib/kubelet/../../etc",
            "/var/lib/kubelet/./pods",
            "/var/lib/kubelet//pods",
            "/var/lib/kubelet/pods/",
            "/etc/passwd",
        ] {
            let err = path_beneath(root, "target_path", bad).unwrap_err();
            assert_eq!(err.code(), tonic::Code::InvalidArgument, "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn accepted_paths_never_escape(value in "(/|[a-z.]{1,3}){1,12}") {
            let root = Path::new("/k");
            if let Ok(path) = path_beneath(root, "target_path", &value) {
                prop_assert!(path.starts_with(root));
                prop_assert!(!path.components().any(|c| c == Component::ParentDir));
            }
        }
    }

    #[test]
    fn volume_ids_empty_is_invalid_and_foreign_is_not_found() {
        assert_eq!(
            volume_id("").unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
        assert_eq!(
            volume_id("../../x").unwrap_err().code(),
            tonic::Code::NotFound
        );
        let id = VolumeId::generate(&crate::volume::state::id::NodeTag::of("test"));
        assert_eq!(volume_id(id.as_str()).unwrap(), id);
    }

    #[test]
    fn mount_capabilities_accept_bind_options_only() {
        let cap = capability(Some(&mount_cap(
            CsiMode::SingleNodeWriter,
            &["noexec", "ro,nosuid", "noexec"],
            "",
        )))
        .unwrap();
        assert_eq!(cap.mount_flags, vec!["noexec", "nosuid", "ro"]);
        assert!(
            cap.bind_flags(false)
                .contains(sys_mount::MountFlags::RDONLY | sys_mount::MountFlags::NOEXEC)
        );
        let err = capability(Some(&mount_cap(
            CsiMode::SingleNodeWriter,
            &["size=1G"],
            "",
        )))
        .unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.to_string().contains("size=1G"));
        let err = capability(Some(&mount_cap(CsiMode::Unknown, &[], ""))).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
    }

    #[test]
    fn an_fs_type_we_make_asks_for_an_image_volume_and_others_are_refused() {
        for (fs_type, kind) in [
            ("", VolumeKind::Filesystem),
            ("ext4", VolumeKind::Image(FsType::Ext4)),
            ("xfs", VolumeKind::Image(FsType::Xfs)),
        ] {
            let cap = capability(Some(&mount_cap(CsiMode::SingleNodeWriter, &[], fs_type)));
            assert_eq!(cap.unwrap().kind, kind, "{fs_type:?}");
        }
        for fs_type in ["ext3", "btrfs", "EXT4", "ext4,xfs", "../xfs"] {
            let err =
                capability(Some(&mount_cap(CsiMode::SingleNodeWriter, &[], fs_type))).unwrap_err();
            assert_eq!(err.code(), tonic::Code::InvalidArgument, "{fs_type:?}");
        }
        let params = HashMap::from([(class::PARAM_FS_TYPE.to_string(), "zfs".to_string())]);
        let err = parameters(&params).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
    }

    #[test]
    fn multi_node_modes_need_shared_access() {
        let cap = capability(Some(&mount_cap(CsiMode::MultiNodeMultiWriter, &[], ""))).unwrap();
        let reason = cap.unsupported_reason(false).unwrap();
        assert!(reason.contains("sharedAccess"), "{reason}");
        assert!(cap.unsupported_reason(true).is_none());
        let cap = capability(Some(&mount_cap(CsiMode::SingleNodeMultiWriter, &[], ""))).unwrap();
        assert!(cap.unsupported_reason(false).is_none());
    }

    #[test]
    fn class_mistakes_and_oversized_parameter_maps_are_invalid_arguments() {
        let key = |i: usize| format!("{PROVISIONER_PARAMETER_PREFIX}k{i}");
        let at_most: HashMap<_, _> = (0..class::MAX_PARAMETERS)
            .map(|i| (key(i), "v".into()))
            .collect();
        assert!(parameters(&at_most).is_ok());
        assert!(snapshot_parameters(&at_most).is_ok());
        let mut too_many = at_most.clone();
        too_many.insert(key(class::MAX_PARAMETERS), "v".into());
        let misspelt = HashMap::from([("sizeLimit".to_string(), "1".to_string())]);
        for err in [
            parameters(&too_many).err().unwrap(),
            snapshot_parameters(&too_many).err().unwrap(),
            parameters(&misspelt).err().unwrap(),
            snapshot_parameters(&misspelt).err().unwrap(),
            group_snapshot_parameters(&misspelt).err().unwrap(),
        ] {
            assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
        }
        // What Kubernetes' storage tests put in a group class, and only in one.
        let policy = HashMap::from([("deletionPolicy".to_string(), "Retain".to_string())]);
        assert!(group_snapshot_parameters(&policy).is_ok());
        assert!(snapshot_parameters(&policy).is_err());
    }

    #[test]
    fn pod_info_comes_whole_and_well_formed_or_not_at_all() {
        let context = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let uid = "0f6c1a52-1b7e-4c54-9d7e-2c1f3e0b9a11";
        let whole = [
            (POD_NAME_KEY, "web-0"),
            (POD_NAMESPACE_KEY, "shop"),
            (POD_UID_KEY, uid),
            ("csi.storage.k8s.io/serviceAccount.name", "default"),
        ];
        assert_eq!(
            pod_info(&context(&whole)).unwrap(),
            Some(PodRef {
                namespace: "shop".into(),
                name: "web-0".into(),
                uid: uid.into()
            })
        );
        assert_eq!(pod_info(&context(&[])).unwrap(), None);
        assert_eq!(pod_info(&context(&[("other", "x")])).unwrap(), None);
        let long = "a".repeat(254);
        let long_ns = "a".repeat(64);
        let bad: [&[(&str, &str)]; 9] = [
            &whole[..2],
            &[(POD_UID_KEY, uid)],
            &[(POD_NAME_KEY, "Web"), whole[1], whole[2]],
            &[(POD_NAME_KEY, &long), whole[1], whole[2]],
            &[(POD_NAME_KEY, "a/../b"), whole[1], whole[2]],
            &[whole[0], (POD_NAMESPACE_KEY, &long_ns), whole[2]],
            &[whole[0], (POD_NAMESPACE_KEY, "a.b"), whole[2]],
            &[whole[0], whole[1], (POD_UID_KEY, "x\ny")],
            &[whole[0], whole[1], (POD_UID_KEY, "-x")],
        ];
        for pairs in bad {
            let err = pod_info(&context(pairs)).unwrap_err();
            assert_eq!(err.code(), tonic::Code::InvalidArgument, "{pairs:?}");
        }
    }

    #[test]
    fn topology_requisites_must_name_this_node() {
        let key = "topology.stickyvol.csi.io/node";
        let topo = |node: &str| csi::Topology {
            segments: [(key.to_string(), node.to_string())].into(),
        };
        assert!(topology_allows(&[], key, "a"));
        assert!(topology_allows(&[topo("b"), topo("a")], key, "a"));
        assert!(!topology_allows(&[topo("b")], key, "a"));
    }
}
