//! The StorageClass parameter `onNodeLoss`: what the reconciler may do with a claim whose node is
//! lost. Parsed here once, for CreateVolume (which refuses a bad value) and for the reconciler
//! (which reads the class of each PV).

use std::fmt;

/// StorageClass parameter key.
pub const PARAM_ON_NODE_LOSS: &str = "onNodeLoss";

/// What happens to a StatefulSet's claim pinned to a lost node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnNodeLoss {
    /// Nothing: an operator decides (the data may come back with the node).
    #[default]
    Keep,
    /// The claim and its waiting pod are deleted so the StatefulSet starts over, empty, on a live
    /// node; the data stays on the lost node.
    Release,
}

impl OnNodeLoss {
    /// The parameter's value: absent means `keep`; anything but `keep` or `release` is refused
    /// (a typo must not silently mean "keep" for one reader and fail for another).
    pub fn parse(value: Option<&str>) -> Result<Self, String> {
        match value {
            None | Some("keep") => Ok(Self::Keep),
            Some("release") => Ok(Self::Release),
            Some(other) => Err(format!(
                "StorageClass parameter {PARAM_ON_NODE_LOSS}: {other:?} is not keep or release"
            )),
        }
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
}
