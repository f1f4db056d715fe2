//! The StorageClass parameters whose value is one of a few words, as types: `blockAllocation`
//! (`Allocation`, kept in each volume's record), `onNodeLoss` (`OnNodeLoss`, read by the
//! node-loss reconciler from the class) and `onOverflow` (`OnOverflow`, read by the node's
//! overflow check from the record's parameters). Each `parse` is the one rule every reader
//! applies: absent is the default, anything but the listed words is refused with a message that
//! names the parameter (a typo must not silently mean the default for one reader and fail for
//! another).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::{PARAM_BLOCK_ALLOCATION, PARAM_ENCRYPTION, PARAM_ON_NODE_LOSS, PARAM_ON_OVERFLOW};

/// The refusal of `value` for `key`, naming what is accepted.
pub(super) fn not(key: &str, value: &str, expected: &str) -> String {
    format!("StorageClass parameter {key}: {value:?} is not {expected}")
}

/// How a block volume's file holds its space (`blockAllocation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Allocation {
    /// Sparse: blocks are allocated as the workload writes (the promise is kept by accounting).
    #[default]
    Thin,
    /// Fallocated at creation and on growth: writes can never fail for lack of space.
    Thick,
}

impl Allocation {
    /// Absent means `thin`; anything but `thin` or `thick` is refused.
    pub fn parse(value: Option<&str>) -> Result<Self, String> {
        match value {
            None | Some("thin") => Ok(Self::Thin),
            Some("thick") => Ok(Self::Thick),
            Some(other) => Err(not(PARAM_BLOCK_ALLOCATION, other, "thin or thick")),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Allocation::Thin => "thin",
            Allocation::Thick => "thick",
        }
    }
}

/// Whether an image or block volume's data is encrypted at rest (`encryption`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Encryption {
    #[default]
    None,
    /// LUKS2 through dm-crypt, the key from the class's node-stage Secret.
    Luks2,
}

impl Encryption {
    /// Absent means `none`; anything but `none` or `luks2` is refused.
    pub fn parse(value: Option<&str>) -> Result<Self, String> {
        match value {
            None | Some("none") => Ok(Self::None),
            Some("luks2") => Ok(Self::Luks2),
            Some(other) => Err(not(PARAM_ENCRYPTION, other, "none or luks2")),
        }
    }
}

/// What happens to a StatefulSet's claim pinned to a lost node (`onNodeLoss`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnNodeLoss {
    /// Nothing: an operator decides (the data may come back with the node).
    #[default]
    Keep,
    /// The claim and its waiting pod are deleted so the StatefulSet starts over, empty, on a live
    /// node; the data stays on the lost node.
    Release,
}

impl OnNodeLoss {
    /// Absent means `keep`; anything but `keep` or `release` is refused.
    pub fn parse(value: Option<&str>) -> Result<Self, String> {
        match value {
            None | Some("keep") => Ok(Self::Keep),
            Some("release") => Ok(Self::Release),
            Some(other) => Err(not(PARAM_ON_NODE_LOSS, other, "keep or release")),
        }
    }

    /// The policy of a class with these parameters, read alone: a mistake in another key does
    /// not turn a class's `release` into `keep` (CreateVolume and the class check name it).
    pub fn of_class(parameters: &BTreeMap<String, String>) -> Result<Self, String> {
        Self::parse(parameters.get(PARAM_ON_NODE_LOSS).map(String::as_str))
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Keep => "keep",
            Self::Release => "release",
        }
    }
}

impl fmt::Display for OnNodeLoss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What happens when a directory volume whose size nothing enforces is found above it
/// (`onOverflow`; see `crate::volume::overflow`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnOverflow {
    /// Its pods are evicted (through the Eviction API), as kubelet evicts an emptyDir's pod.
    #[default]
    Evict,
    /// Reported only: the volume's condition, a metric and an Event on its claim.
    Report,
}

impl OnOverflow {
    /// Absent means `evict`; anything but `evict` or `report` is refused.
    pub fn parse(value: Option<&str>) -> Result<Self, String> {
        match value {
            None | Some("evict") => Ok(Self::Evict),
            Some("report") => Ok(Self::Report),
            Some(other) => Err(not(PARAM_ON_OVERFLOW, other, "evict or report")),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Evict => "evict",
            Self::Report => "report",
        }
    }
}

impl fmt::Display for OnOverflow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_is_the_default_and_only_two_values_are_accepted() {
        assert_eq!(OnNodeLoss::parse(None), Ok(OnNodeLoss::Keep));
        assert_eq!(OnNodeLoss::parse(Some("keep")), Ok(OnNodeLoss::Keep));
        assert_eq!(OnNodeLoss::parse(Some("release")), Ok(OnNodeLoss::Release));
        for bad in ["", "Release", "delete", "release ", "true"] {
            let err = OnNodeLoss::parse(Some(bad)).unwrap_err();
            assert!(err.contains(PARAM_ON_NODE_LOSS), "{err}");
        }
    }

    #[test]
    fn evict_is_the_default_and_only_two_values_are_accepted() {
        assert_eq!(OnOverflow::parse(None), Ok(OnOverflow::Evict));
        assert_eq!(OnOverflow::parse(Some("evict")), Ok(OnOverflow::Evict));
        assert_eq!(OnOverflow::parse(Some("report")), Ok(OnOverflow::Report));
        for bad in ["", "Evict", "delete", "report ", "true"] {
            let err = OnOverflow::parse(Some(bad)).unwrap_err();
            assert!(err.contains(PARAM_ON_OVERFLOW), "{err}");
        }
    }

    #[test]
    fn thin_is_the_default_and_only_two_values_are_accepted() {
        assert_eq!(Allocation::parse(None), Ok(Allocation::Thin));
        assert_eq!(Allocation::parse(Some("thin")), Ok(Allocation::Thin));
        assert_eq!(Allocation::parse(Some("thick")), Ok(Allocation::Thick));
        for bad in ["", "Thick", "sparse", "thin "] {
            let err = Allocation::parse(Some(bad)).unwrap_err();
            assert!(err.contains(PARAM_BLOCK_ALLOCATION), "{err}");
        }
    }
}
