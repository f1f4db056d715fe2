//! Command-line flags for `stickyvol serve`, and the validated configuration derived from them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};

/// What this instance serves (see design.md §1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Identity, Controller and Node on one socket: what the DaemonSet runs on every node.
    All,
    /// Identity and Controller capabilities only, no host work: what the StatefulSet runs
    /// beside csi-resizer.
    Controller,
    /// Identity and Node only.
    Node,
}

impl Mode {
    /// Whether this instance owns a data directory and does host work.
    pub fn works_on_host(self) -> bool {
        self != Mode::Controller
    }
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// CSI endpoint, a unix socket URL [default: unix://<kubelet-dir>/plugins/<driver-name>/csi.sock]
    #[arg(long, env = "CSI_ENDPOINT")]
    pub endpoint: Option<String>,

    /// This node's name; it becomes the volumes' topology (`topology.<driver-name>/node`), so it
    /// must be a valid label value (Kubernetes: the node name from the downward API).
    #[arg(long, env = "NODE_ID")]
    pub node_id: String,

    /// Kubelet's root directory; every target and staging path must lie beneath it.
    #[arg(long, env = "KUBELET_DIR", default_value = "/var/lib/kubelet")]
    pub kubelet_dir: PathBuf,

    /// Where volumes and their records live [default: <kubelet-dir>/volumes/<driver-name>]
    #[arg(long, env = "DATA_DIR")]
    pub data_dir: Option<PathBuf>,

    /// CSI driver name reported by GetPluginInfo.
    #[arg(long, env = "DRIVER_NAME", default_value = "stickyvol.csi.io")]
    pub driver_name: String,

    /// Which services this instance serves.
    #[arg(long, env = "STICKYVOL_MODE", value_enum, default_value_t = Mode::All)]
    pub mode: Mode,

    /// Maximum number of volumes on this node reported to the scheduler (0: no limit).
    #[arg(long, env = "MAX_VOLUMES_PER_NODE", default_value_t = 0)]
    pub max_volumes_per_node: i64,

    /// Serve Prometheus metrics on http://HOST:PORT/metrics (off unless given).
    #[arg(long, env = "METRICS_ADDRESS", value_name = "HOST:PORT")]
    pub metrics_address: Option<SocketAddr>,
}

/// Validated configuration shared by all services.
#[derive(Debug, Clone)]
pub struct Config {
    pub socket_path: PathBuf,
    pub node_id: String,
    pub kubelet_dir: PathBuf,
    pub data_dir: PathBuf,
    pub driver_name: String,
    pub mode: Mode,
    pub max_volumes_per_node: i64,
    pub metrics_address: Option<SocketAddr>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("--endpoint must be a unix socket URL such as unix:///run/csi.sock, got {0:?}")]
    Endpoint(String),
    #[error(
        "--node-id {0:?} is not a valid label value (1-63 of [A-Za-z0-9._-], alphanumeric at both ends)"
    )]
    NodeId(String),
    #[error(
        "--driver-name {0:?} is not a valid CSI driver name (a DNS-1123 subdomain of at most 63 bytes)"
    )]
    DriverName(String),
    #[error("{flag} must be an absolute path, got {path:?}")]
    RelativePath { flag: &'static str, path: PathBuf },
    #[error("--max-volumes-per-node must not be negative")]
    MaxVolumes,
}

impl Config {
    pub fn from_args(args: ServeArgs) -> Result<Config, ConfigError> {
        if !is_label_value(&args.node_id) {
            return Err(ConfigError::NodeId(args.node_id));
        }
        if !is_driver_name(&args.driver_name) {
            return Err(ConfigError::DriverName(args.driver_name));
        }
        if args.max_volumes_per_node < 0 {
            return Err(ConfigError::MaxVolumes);
        }
        require_absolute("--kubelet-dir", &args.kubelet_dir)?;
        let data_dir = args
            .data_dir
            .unwrap_or_else(|| args.kubelet_dir.join("volumes").join(&args.driver_name));
        require_absolute("--data-dir", &data_dir)?;
        let endpoint = args.endpoint.unwrap_or_else(|| {
            format!(
                "unix://{}",
                args.kubelet_dir
                    .join("plugins")
                    .join(&args.driver_name)
                    .join("csi.sock")
                    .display()
            )
        });
        let socket_path = parse_unix_endpoint(&endpoint)?;
        Ok(Config {
            socket_path,
            node_id: args.node_id,
            kubelet_dir: args.kubelet_dir,
            data_dir,
            driver_name: args.driver_name,
            mode: args.mode,
            max_volumes_per_node: args.max_volumes_per_node,
            metrics_address: args.metrics_address,
        })
    }

    /// The topology segment key that pins volumes to this node.
    pub fn topology_key(&self) -> String {
        format!("topology.{}/node", self.driver_name)
    }
}

/// `<kubelet-dir>/volumes/<driver-name>`: beside kubelet's own state, as the emptyDir-PV idea has it.
pub fn default_data_dir(kubelet_dir: &Path, driver_name: &str) -> PathBuf {
    kubelet_dir.join("volumes").join(driver_name)
}

fn require_absolute(flag: &'static str, path: &Path) -> Result<(), ConfigError> {
    if path.is_absolute() {
        Ok(())
    } else {
        Err(ConfigError::RelativePath {
            flag,
            path: path.to_path_buf(),
        })
    }
}

/// Accepts `unix:///abs/path` (and, like other drivers, `unix:/abs/path`).
fn parse_unix_endpoint(endpoint: &str) -> Result<PathBuf, ConfigError> {
    let path = endpoint
        .strip_prefix("unix://")
        .or_else(|| endpoint.strip_prefix("unix:"))
        .ok_or_else(|| ConfigError::Endpoint(endpoint.to_string()))?;
    let path = PathBuf::from(path);
    if !path.is_absolute() || path.file_name().is_none() {
        return Err(ConfigError::Endpoint(endpoint.to_string()));
    }
    Ok(path)
}

/// Kubernetes label value rules: node labels carry the topology segment.
pub fn is_label_value(value: &str) -> bool {
    is_bounded_name(value, |b| {
        b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')
    })
}

/// CSI driver names, lowercase: the name also prefixes the topology label key, which must be
/// a DNS-1123 subdomain.
fn is_driver_name(name: &str) -> bool {
    is_bounded_name(name, |b| {
        b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'.')
    })
}

/// 1–63 bytes, alphanumeric at both ends, every byte `allowed`.
fn is_bounded_name(value: &str, allowed: impl Fn(u8) -> bool) -> bool {
    let bytes = value.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && bytes.iter().all(|b| allowed(*b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(node_id: &str) -> ServeArgs {
        ServeArgs {
            endpoint: None,
            node_id: node_id.into(),
            kubelet_dir: "/var/lib/kubelet".into(),
            data_dir: None,
            driver_name: "stickyvol.csi.io".into(),
            mode: Mode::All,
            max_volumes_per_node: 0,
            metrics_address: None,
        }
    }

    #[test]
    fn defaults_derive_from_kubelet_dir_and_driver_name() {
        let config = Config::from_args(args("node-1")).unwrap();
        assert_eq!(
            config.socket_path,
            PathBuf::from("/var/lib/kubelet/plugins/stickyvol.csi.io/csi.sock")
        );
        assert_eq!(
            config.data_dir,
            PathBuf::from("/var/lib/kubelet/volumes/stickyvol.csi.io")
        );
        assert_eq!(config.topology_key(), "topology.stickyvol.csi.io/node");
    }

    #[test]
    fn endpoint_must_be_unix() {
        for bad in [
            "tcp://127.0.0.1:10000",
            "unix://relative.sock",
            "/plain/path",
            "unix://",
        ] {
            let mut a = args("n");
            a.endpoint = Some(bad.into());
            assert!(Config::from_args(a).is_err(), "{bad} accepted");
        }
        let mut a = args("n");
        a.endpoint = Some("unix:/run/x.sock".into());
        assert_eq!(
            Config::from_args(a).unwrap().socket_path,
            PathBuf::from("/run/x.sock")
        );
    }

    #[test]
    fn node_id_must_be_a_label_value() {
        for bad in ["", "-a", "a-", "a b", &"x".repeat(64), "a/b"] {
            assert!(Config::from_args(args(bad)).is_err(), "{bad:?} accepted");
        }
        for good in ["a", "node-1.example", "A_b-C"] {
            assert!(Config::from_args(args(good)).is_ok(), "{good:?} refused");
        }
    }
}
