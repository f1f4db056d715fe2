//! StorageClass parameters: every key stickyvol accepts, its default and its rule, the limits on
//! the whole map, and `ClassParameters`, the one typed value they are parsed into. Readers:
//! CreateVolume, ValidateVolumeCapabilities and GetCapacity (`faces::request`, `faces::controller`),
//! the controller's class check (a Warning Event on a class with a mistake), the node-loss
//! reconciler (`onNodeLoss`), and the node's overflow check (`onOverflow`, from a record's
//! parameters). It uses nothing above `config` and `host::fsimage`, so `volume/` may use it.
//!
//! docs/reference.md and docs/operations/storage.md list the keys of `ACCEPTED`; a unit test holds
//! them to it.

use std::collections::{BTreeMap, HashMap};

use crate::config::{DEFAULT_POOL, is_pool_name};
use crate::host::fsimage::FsType;

pub mod mutable;
mod values;
pub use mutable::{IoLimits, Mutable};
pub use values::{Allocation, Encryption, OnNodeLoss, OnOverflow};

/// The [pool](crate::config) (`--pool NAME=PATH`) that holds the volume; default `default`.
pub const PARAM_POOL: &str = "pool";
/// `thin` (sparse, the default) or `thick` (fallocated) block files.
pub const PARAM_BLOCK_ALLOCATION: &str = "blockAllocation";
/// `"true"` refuses filesystem volumes on pools that cannot limit sizes; default `"false"`.
pub const PARAM_REQUIRE_ENFORCEMENT: &str = "requireEnforcement";
/// `"true"` lets claims ask ReadWriteMany / ReadOnlyMany; default `"false"`.
pub const PARAM_SHARED_ACCESS: &str = "sharedAccess";
/// `keep` (the default) or `release` claims whose node is lost.
pub const PARAM_ON_NODE_LOSS: &str = "onNodeLoss";
/// `evict` (the default) or `report` when a directory volume on a pool that cannot limit sizes
/// grows past its size.
pub const PARAM_ON_OVERFLOW: &str = "onOverflow";
/// `none` (the default) or `luks2`: an image or block volume's data encrypted at rest, its key from the
/// class's node-stage Secret.
pub const PARAM_ENCRYPTION: &str = "encryption";

/// The keys stickyvol itself understands, in the order refusals list them; anything else
/// outside `PROVISIONER_PARAMETER_PREFIX` is refused so a typo never goes unnoticed.
pub const ACCEPTED: &[&str] = &[
    PARAM_POOL,
    PARAM_BLOCK_ALLOCATION,
    PARAM_REQUIRE_ENFORCEMENT,
    PARAM_SHARED_ACCESS,
    PARAM_ON_NODE_LOSS,
    PARAM_ON_OVERFLOW,
    PARAM_ENCRYPTION,
];

/// Keys external-provisioner adds or passes through (PVC/PV names, secret references, fstype);
/// accepted, and apart from `PARAM_FS_TYPE` ignored.
pub const PROVISIONER_PARAMETER_PREFIX: &str = "csi.storage.k8s.io/";

/// The key csi-provisioner turns into the capability's fs_type (an image volume's filesystem);
/// GetCapacity may see it among the parameters.
pub const PARAM_FS_TYPE: &str = "csi.storage.k8s.io/fstype";

/// Most parameters a class may pass, and most bytes of their keys and values together: what
/// the Kubernetes API allows a StorageClass. They are kept in the volume's record, whose journal
/// entry must stay far below the journal's frame limit even with every byte JSON-escaped.
pub const MAX_PARAMETERS: usize = 512;
pub const MAX_PARAMETER_BYTES: usize = 256 << 10;

/// Refuses a parameter map (of a `what`: StorageClass, VolumeSnapshotClass) larger than the
/// bounds above.
pub fn bounded(what: &str, params: &HashMap<String, String>) -> Result<(), String> {
    let bytes: usize = params.iter().map(|(k, v)| k.len() + v.len()).sum();
    if params.len() > MAX_PARAMETERS || bytes > MAX_PARAMETER_BYTES {
        return Err(format!(
            "{what} parameters: {} keys of {bytes} bytes; at most {MAX_PARAMETERS} keys of {MAX_PARAMETER_BYTES} bytes are accepted",
            params.len()
        ));
    }
    Ok(())
}

/// A filesystem type, as a class's `PARAM_FS_TYPE` or a mount capability's fs_type gives it:
/// none (empty) is a directory volume, a filesystem we can make an image volume holding it.
pub fn image_fs(fs_type: &str) -> Result<Option<FsType>, String> {
    if fs_type.is_empty() {
        return Ok(None);
    }
    FsType::parse(fs_type).map(Some).ok_or_else(|| {
        format!(
            "fs_type {fs_type:?} is not one stickyvol makes; accepted: {} (an image volume), or none (a directory)",
            FsType::ALL.map(FsType::name).join(", ")
        )
    })
}

/// A StorageClass's parameters, validated and typed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassParameters {
    /// Every parameter as given (records keep them for idempotency checks).
    pub raw: BTreeMap<String, String>,
    pub pool: String,
    /// None when the class does not say: the pool's default (`Pool::default_allocation`).
    pub allocation: Option<Allocation>,
    pub require_enforcement: bool,
    /// Multi-node access modes are accepted (the volume still lives on one node).
    pub shared_access: bool,
    /// Read by the node-loss reconciler from the class; checked here so a bad value is refused
    /// when the first claim is provisioned, not found when a node is lost.
    pub on_node_loss: OnNodeLoss,
    /// The class's volumes are image volumes with this filesystem, when the parameters say so
    /// (the capability says it too, and is what CreateVolume follows).
    pub image_fs: Option<FsType>,
    /// Read by the node's overflow check from the record's parameters; checked here likewise.
    pub on_overflow: OnOverflow,
    pub encryption: Encryption,
}

impl ClassParameters {
    /// Provisioner-added keys pass, ours are checked, others refused; the error names the key
    /// (the first, in key order, when there are several mistakes).
    pub fn parse(params: &HashMap<String, String>) -> Result<Self, String> {
        bounded("StorageClass", params)?;
        let mut keys: Vec<_> = params.keys().collect();
        keys.sort();
        if let Some(key) = keys.into_iter().find(|key| {
            !key.starts_with(PROVISIONER_PARAMETER_PREFIX) && !ACCEPTED.contains(&key.as_str())
        }) {
            return Err(format!(
                "unknown StorageClass parameter {key:?} (stickyvol accepts {} and {PROVISIONER_PARAMETER_PREFIX}* keys)",
                ACCEPTED.join(", ")
            ));
        }
        let get = |key: &str| params.get(key).map(String::as_str);
        let pool = match get(PARAM_POOL) {
            None => DEFAULT_POOL.to_string(),
            Some(name) if is_pool_name(name) => name.to_string(),
            Some(name) => {
                return Err(values::not(
                    PARAM_POOL,
                    name,
                    "a pool name (1-63 of [a-z0-9-])",
                ));
            }
        };
        let allocation = get(PARAM_BLOCK_ALLOCATION)
            .map(|value| Allocation::parse(Some(value)))
            .transpose()?;
        let flag = |key: &str| match get(key) {
            None | Some("false") => Ok(false),
            Some("true") => Ok(true),
            Some(other) => Err(values::not(key, other, "\"true\" or \"false\"")),
        };
        let require_enforcement = flag(PARAM_REQUIRE_ENFORCEMENT)?;
        let shared_access = flag(PARAM_SHARED_ACCESS)?;
        let on_node_loss = OnNodeLoss::parse(get(PARAM_ON_NODE_LOSS))?;
        let image_fs = match get(PARAM_FS_TYPE) {
            None => None,
            Some(fs_type) => image_fs(fs_type)?,
        };
        let on_overflow = OnOverflow::parse(get(PARAM_ON_OVERFLOW))?;
        let encryption = Encryption::parse(get(PARAM_ENCRYPTION))?;
        Ok(Self {
            raw: params.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            pool,
            allocation,
            require_enforcement,
            shared_access,
            on_node_loss,
            image_fs,
            on_overflow,
            encryption,
        })
    }

    /// A mistake only the StorageClass object shows: csi-provisioner strips its own keys (the
    /// secrets' references) before CreateVolume. An encrypted class without a node-stage Secret
    /// makes volumes no stage can open.
    pub fn class_mistake(&self) -> Option<String> {
        let secret = |key: &str| {
            self.raw.contains_key(&format!(
                "{PROVISIONER_PARAMETER_PREFIX}node-stage-secret-{key}"
            ))
        };
        (self.encryption == Encryption::Luks2 && !(secret("name") && secret("namespace"))).then(|| {
            format!(
                "StorageClass parameter {PARAM_ENCRYPTION}: luks2 needs the Secret holding the key: set {PROVISIONER_PARAMETER_PREFIX}node-stage-secret-name and {PROVISIONER_PARAMETER_PREFIX}node-stage-secret-namespace (its entry \"key\" is the key)"
            )
        })
    }

    /// The parameters of a class with mistakes, without them: each key kept only if it is valid
    /// on its own. GetCapacity answers with these, so that a class with a misspelt key still gets
    /// capacity where its pool is (the scheduler then picks a node, and CreateVolume's
    /// INVALID_ARGUMENT, which names the key, reaches the claim), while a class whose pool a node
    /// lacks still gets none there.
    pub fn lenient(params: &HashMap<String, String>) -> Self {
        let valid: HashMap<String, String> = params
            .iter()
            .filter(|(k, v)| Self::parse(&HashMap::from([((*k).clone(), (*v).clone())])).is_ok())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Self::parse(&valid)
            .or_else(|_| Self::parse(&HashMap::new()))
            .expect("no parameters are valid parameters")
    }
}

#[cfg(test)]
mod tests;
