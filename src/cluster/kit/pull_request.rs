//! What a PV says about a pull into its volume (`cluster::node::transfer::requests` does it; the
//! controller's moves and an admin ask for it): the node to do it (a label, so each node watches
//! its own), the source PV, the claim the volume is for once it holds the data, and the outcome
//! the node writes back.

use serde::{Deserialize, Serialize};

/// On a PV of this node to fill: the node it is on.
pub const PULL_TO: &str = "stickyvol.csi.io/pull-to";
/// The source's PV name.
pub const PULL_FROM: &str = "stickyvol.csi.io/pull-from";
/// With `PULL_FROM`: the source's data is read from its dead node's disk, mounted on the target
/// node as `<data-dir>/adopt/<this name>`, not from that node's plugin.
pub const PULL_FROM_DISK: &str = "stickyvol.csi.io/pull-from-disk";
/// `namespace/name` of the claim the volume serves once filled (a move's temporary claim
/// provisioned it): the node records it, so that its Events go to the right claim.
pub const PULL_CLAIM: &str = "stickyvol.csi.io/pull-claim";
/// What the pull came to (`PullResult` as JSON).
pub const PULL_RESULT: &str = "stickyvol.csi.io/pull-result";

/// The outcome written back on the PV.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PullResult {
    /// The source PV the result is for.
    pub from: String,
    /// The stream's checksum, which the import checked (None: failed).
    pub sha256: Option<String>,
    pub bytes: Option<u64>,
    /// Why it failed.
    pub error: Option<String>,
}

impl PullResult {
    /// The result written on a PV's annotations, if any can be read.
    pub fn on(annotations: Option<&std::collections::BTreeMap<String, String>>) -> Option<Self> {
        let text = annotations?.get(PULL_RESULT)?;
        serde_json::from_str(text).ok()
    }
}
