//! What a PV says about a change of its volume's IO limits (a VolumeAttributesClass changed on
//! its claim): the controller, which csi-resizer asks (ControllerModifyVolume), writes the limits
//! wanted and labels the PV with its node; that node's plugin sets them
//! (`cluster::node::modify`) and writes back what came of it, taking the label off; the
//! controller answers csi-resizer from that.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// On a PV whose volume's limits are to change: the node to change them (a label, so each node
/// watches its own).
pub const MODIFY_ON: &str = "stickyvol.csi.io/modify-on";
/// The limits wanted, as JSON (`class::IoLimits`).
pub const IO_LIMITS_WANTED: &str = "stickyvol.csi.io/io-limits-wanted";
/// What the node made of them (`Modified` as JSON).
pub const IO_LIMITS_DONE: &str = "stickyvol.csi.io/io-limits-done";

/// The outcome a node writes back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Modified {
    /// The `IO_LIMITS_WANTED` text it answers (a later change is not answered by it).
    pub wanted: String,
    /// Why they could not be set (None: set for the volume and every pod using it).
    pub error: Option<String>,
    /// The error was the request's (an invalid limit, a directory volume): asking again the
    /// same cannot succeed.
    #[serde(default)]
    pub refused: bool,
}

impl Modified {
    /// The outcome on a PV's annotations, if one can be read.
    pub fn on(annotations: Option<&BTreeMap<String, String>>) -> Option<Modified> {
        serde_json::from_str(annotations?.get(IO_LIMITS_DONE)?).ok()
    }
}
