//! The mutable parameters: a VolumeAttributesClass's `parameters`, which csi-provisioner passes
//! to CreateVolume and csi-resizer to ControllerModifyVolume as `mutable_parameters`, and which
//! change with the claim's class at any time: IO limits of a block or an image volume, applied
//! to the cgroup of every pod that uses it (`volume::iolimits`), `onOverflow`, which takes
//! the place of the StorageClass's for a directory volume (`volume::overflow`), and
//! `onNodeLoss`, which takes the place of the StorageClass's for the node-loss reconciler (it
//! reads the class the PV names; nothing on the node).
//!
//! No key means no limit, and the StorageClass's policies: a class without one (or the class
//! removed) lifts a limit.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::{OnNodeLoss, OnOverflow, PARAM_ON_NODE_LOSS, PARAM_ON_OVERFLOW};

/// Reads a second, at most, from the volume's device.
pub const PARAM_READ_IOPS: &str = "readIOPS";
/// Writes a second, at most, to the volume's device.
pub const PARAM_WRITE_IOPS: &str = "writeIOPS";
/// Bytes read a second, at most (a plain number, or with a suffix: k, M, G, Ki, Mi, Gi).
pub const PARAM_READ_BYTES_PER_SECOND: &str = "readBytesPerSecond";
/// Bytes written a second, at most (as `readBytesPerSecond`).
pub const PARAM_WRITE_BYTES_PER_SECOND: &str = "writeBytesPerSecond";

/// The mutable keys stickyvol understands, in the order refusals list them.
pub const MUTABLE: &[&str] = &[
    PARAM_READ_IOPS,
    PARAM_WRITE_IOPS,
    PARAM_READ_BYTES_PER_SECOND,
    PARAM_WRITE_BYTES_PER_SECOND,
    PARAM_ON_OVERFLOW,
    PARAM_ON_NODE_LOSS,
];

/// Everything a VolumeAttributesClass may set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mutable {
    #[serde(flatten)]
    pub io: IoLimits,
    /// In place of the StorageClass's `onOverflow` (None: the StorageClass's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_overflow: Option<OnOverflow>,
    /// In place of the StorageClass's `onNodeLoss` (None: the StorageClass's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_node_loss: Option<OnNodeLoss>,
}

impl Mutable {
    /// What `params` set; an unknown key or a bad value is refused naming the key.
    pub fn parse(params: &HashMap<String, String>) -> Result<Mutable, String> {
        let on_overflow = (params.get(PARAM_ON_OVERFLOW))
            .map(|value| OnOverflow::parse(Some(value)))
            .transpose()?;
        let on_node_loss = (params.get(PARAM_ON_NODE_LOSS))
            .map(|value| OnNodeLoss::parse(Some(value)))
            .transpose()?;
        let mut io_keys = params.clone();
        io_keys.remove(PARAM_ON_OVERFLOW);
        io_keys.remove(PARAM_ON_NODE_LOSS);
        Ok(Mutable {
            io: IoLimits::parse(&io_keys)?,
            on_overflow,
            on_node_loss,
        })
    }

    /// The same, if each limit is within what a class may name (read back from JSON).
    pub fn checked(self) -> Result<Mutable, String> {
        Ok(Mutable {
            io: self.io.checked()?,
            ..self
        })
    }

    /// `writeIOPS=200 onOverflow=report onNodeLoss=release`, or `none`: for logs and messages.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if !self.io.is_unlimited() || (self.on_overflow, self.on_node_loss) == (None, None) {
            parts.push(self.io.describe());
        }
        if let Some(policy) = self.on_overflow {
            parts.push(format!("{PARAM_ON_OVERFLOW}={policy}"));
        }
        if let Some(policy) = self.on_node_loss {
            parts.push(format!("{PARAM_ON_NODE_LOSS}={}", policy.as_str()));
        }
        parts.join(" ")
    }
}

/// The most operations or bytes a second a limit may name: far above any device, and small
/// enough for every cgroup file's parser.
const MAX_LIMIT: u64 = 1 << 50;

/// A volume's IO limits; None is "no limit".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_iops: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_iops: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_bytes_per_second: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_bytes_per_second: Option<u64>,
}

impl IoLimits {
    /// The limits `params` name; an unknown key or a value that is not a positive number is
    /// refused with a sentence naming the key.
    pub fn parse(params: &HashMap<String, String>) -> Result<IoLimits, String> {
        let mut keys: Vec<_> = params.keys().collect();
        keys.sort();
        let io_keys = &MUTABLE[..4];
        if let Some(unknown) = keys.iter().find(|key| !io_keys.contains(&key.as_str())) {
            let shown: String = unknown.chars().take(80).collect();
            return Err(format!(
                "mutable parameter {shown:?} is not one stickyvol knows; accepted: {}",
                MUTABLE.join(", ")
            ));
        }
        let get = |key: &str, suffixes: bool| -> Result<Option<u64>, String> {
            params
                .get(key)
                .map(|value| limit(key, value, suffixes))
                .transpose()
        };
        Ok(IoLimits {
            read_iops: get(PARAM_READ_IOPS, false)?,
            write_iops: get(PARAM_WRITE_IOPS, false)?,
            read_bytes_per_second: get(PARAM_READ_BYTES_PER_SECOND, true)?,
            write_bytes_per_second: get(PARAM_WRITE_BYTES_PER_SECOND, true)?,
        })
    }

    /// The same limits, if each is within what a class may name (limits read back from JSON,
    /// which no parser of ours wrote).
    pub fn checked(self) -> Result<IoLimits, String> {
        let named = [
            (PARAM_READ_IOPS, self.read_iops),
            (PARAM_WRITE_IOPS, self.write_iops),
            (PARAM_READ_BYTES_PER_SECOND, self.read_bytes_per_second),
            (PARAM_WRITE_BYTES_PER_SECOND, self.write_bytes_per_second),
        ];
        match named
            .iter()
            .find(|(_, v)| v.is_some_and(|v| !(1..=MAX_LIMIT).contains(&v)))
        {
            Some((key, value)) => Err(format!(
                "{key} {} is not from 1 to 2^50",
                value.unwrap_or_default()
            )),
            None => Ok(self),
        }
    }

    pub fn is_unlimited(&self) -> bool {
        *self == IoLimits::default()
    }

    /// `readIOPS=200 writeBytesPerSecond=1048576`, or `none`: for logs and messages.
    pub fn describe(&self) -> String {
        let named = [
            (PARAM_READ_IOPS, self.read_iops),
            (PARAM_WRITE_IOPS, self.write_iops),
            (PARAM_READ_BYTES_PER_SECOND, self.read_bytes_per_second),
            (PARAM_WRITE_BYTES_PER_SECOND, self.write_bytes_per_second),
        ];
        let set: Vec<_> = (named.iter())
            .filter_map(|(key, value)| value.map(|v| format!("{key}={v}")))
            .collect();
        match set.is_empty() {
            true => "none".into(),
            false => set.join(" "),
        }
    }
}

/// A limit's value: a positive whole number, with a unit suffix where `suffixes` allows.
fn limit(key: &str, value: &str, suffixes: bool) -> Result<u64, String> {
    let units: &[(&str, u64)] = &[
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
    ];
    let (digits, unit) = match units.iter().find(|(s, _)| suffixes && value.ends_with(s)) {
        Some((suffix, unit)) => (&value[..value.len() - suffix.len()], *unit),
        None => (value, 1),
    };
    let number = (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse::<u64>().ok())
        .flatten()
        .and_then(|n| n.checked_mul(unit))
        .filter(|&n| (1..=MAX_LIMIT).contains(&n));
    number.ok_or_else(|| {
        let shown: String = value.chars().take(40).collect();
        let form = match suffixes {
            true => "a whole number of bytes from 1 to 2^50, optionally with k, M, G, Ki, Mi or Gi",
            false => "a whole number from 1 to 2^50",
        };
        format!("mutable parameter {key} {shown:?} is not {form}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Result<IoLimits, String> {
        IoLimits::parse(
            &pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn limits_parse_with_units_for_bytes_only() {
        let limits = parse(&[
            ("writeIOPS", "200"),
            ("readBytesPerSecond", "10Mi"),
            ("writeBytesPerSecond", "5M"),
        ])
        .unwrap();
        assert_eq!(limits.write_iops, Some(200));
        assert_eq!(limits.read_bytes_per_second, Some(10 << 20));
        assert_eq!(limits.write_bytes_per_second, Some(5_000_000));
        assert_eq!(limits.read_iops, None);
        assert_eq!(
            limits.describe(),
            "writeIOPS=200 readBytesPerSecond=10485760 writeBytesPerSecond=5000000"
        );
        assert!(parse(&[]).unwrap().is_unlimited());
        assert_eq!(IoLimits::default().describe(), "none");
    }

    #[test]
    fn on_overflow_is_mutable_too_and_reads_back_as_written() {
        let pairs: HashMap<String, String> = [("onOverflow", "report"), ("writeIOPS", "5")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let wanted = Mutable::parse(&pairs).unwrap();
        assert_eq!(wanted.on_overflow, Some(OnOverflow::Report));
        assert_eq!(wanted.describe(), "writeIOPS=5 onOverflow=report");
        let json = serde_json::to_string(&wanted).unwrap();
        assert_eq!(json, r#"{"write_iops":5,"on_overflow":"report"}"#);
        assert_eq!(serde_json::from_str::<Mutable>(&json).unwrap(), wanted);
        let bad: HashMap<String, String> =
            [("onOverflow".to_string(), "ignore".to_string())].into();
        assert!(Mutable::parse(&bad).unwrap_err().contains("onOverflow"));
    }

    #[test]
    fn on_node_loss_is_mutable_too_and_reads_back_as_written() {
        let pairs: HashMap<String, String> = [("onNodeLoss", "release"), ("onOverflow", "report")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let wanted = Mutable::parse(&pairs).unwrap();
        assert_eq!(wanted.on_node_loss, Some(super::super::OnNodeLoss::Release));
        assert!(wanted.io.is_unlimited());
        assert_eq!(wanted.describe(), "onOverflow=report onNodeLoss=release");
        let json = serde_json::to_string(&wanted).unwrap();
        assert_eq!(json, r#"{"on_overflow":"report","on_node_loss":"release"}"#);
        assert_eq!(serde_json::from_str::<Mutable>(&json).unwrap(), wanted);
        let bad: HashMap<String, String> =
            [("onNodeLoss".to_string(), "sometimes".to_string())].into();
        assert!(Mutable::parse(&bad).unwrap_err().contains("onNodeLoss"));
        assert_eq!(Mutable::default().describe(), "none");
    }

    #[test]
    fn a_bad_key_or_value_is_refused_naming_the_key() {
        let err = parse(&[("writeIops", "200")]).unwrap_err();
        assert!(
            err.contains("\"writeIops\"") && err.contains("writeIOPS"),
            "{err}"
        );
        for (key, value) in [
            ("writeIOPS", "0"),
            ("writeIOPS", "-1"),
            ("writeIOPS", "1k"),
            ("readIOPS", " 5"),
            ("readIOPS", "1125899906842625"),
            ("readBytesPerSecond", "Mi"),
            ("readBytesPerSecond", "1.5Mi"),
            ("readBytesPerSecond", "99999999999Gi"),
        ] {
            let err = parse(&[(key, value)]).unwrap_err();
            assert!(
                err.starts_with(&format!("mutable parameter {key} ")),
                "{err}"
            );
        }
    }
}
