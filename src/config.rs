//! Command-line flags for `stickyvol serve` and `stickyvol doctor`, and the validated
//! configuration derived from them.

use std::net::{Ipv6Addr, SocketAddr, SocketAddrV6};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, ValueEnum};

/// What this instance serves (see docs/design.md, "Where things run").
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

    /// Where the admin API (`stickyvol volumes`, `stickyvol volume …`) is served, a unix socket
    /// path in a directory no sidecar mounts, never the CSI socket's (modes all and node only)
    /// [default: /run/stickyvol-admin/admin.sock]
    #[arg(long, env = "ADMIN_SOCKET", value_name = "PATH")]
    pub admin_socket: Option<PathBuf>,

    /// This node's name; it becomes the volumes' topology (`topology.<driver-name>/node`), so it
    /// must be a valid label value (Kubernetes: the node name from the downward API).
    #[arg(long, env = "NODE_ID")]
    pub node_id: String,

    #[command(flatten)]
    pub paths: PathArgs,

    /// Which services this instance serves.
    #[arg(long, env = "STICKYVOL_MODE", value_enum, default_value_t = Mode::All)]
    pub mode: Mode,

    /// Maximum number of volumes on this node reported to the scheduler (0: no limit).
    #[arg(long, env = "MAX_VOLUMES_PER_NODE", default_value_t = 0)]
    pub max_volumes_per_node: i64,

    /// Where the host's cgroup filesystem is in this container, for the IO limits of block and
    /// image volumes (a container's own /sys/fs/cgroup under cgroup v2 shows only its own
    /// cgroup: mount the host's elsewhere and name it here).
    #[arg(long, env = "CGROUP_ROOT", default_value = "/sys/fs/cgroup")]
    pub cgroup_root: PathBuf,

    /// Serve Prometheus metrics on http://HOST:PORT/metrics (off unless given). An IPv6 HOST
    /// may be given bare, as `$(POD_IP):8080` expands to: the last `:PORT` is the port.
    #[arg(
        long,
        env = "METRICS_ADDRESS",
        value_name = "HOST:PORT",
        value_parser = parse_metrics_address
    )]
    pub metrics_address: Option<SocketAddr>,

    /// The metrics server's limits (see `MetricsLimits`), hidden: tests shorten them.
    #[arg(long, hide = true, value_name = "MS")]
    pub metrics_header_timeout_ms: Option<u64>,
    #[arg(long, hide = true, value_name = "MS")]
    pub metrics_idle_timeout_ms: Option<u64>,
    #[arg(long, hide = true, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub metrics_max_connections: Option<u32>,

    /// How a pool enforces filesystem volume sizes (repeatable): auto (btrfs qgroups if quota is
    /// on, XFS/ext4 project quotas if mounted with them, else none), btrfs (enables quota if
    /// off), project, or none.
    #[arg(
        long = "enforcement",
        env = "ENFORCEMENT",
        value_name = "NAME=auto|btrfs|project|none",
        value_delimiter = ','
    )]
    pub enforcement: Vec<String>,

    /// How far a pool may promise more than it holds (repeatable; default 1: every byte a volume
    /// may still write is backed by free space).
    #[arg(
        long = "overcommit",
        env = "OVERCOMMIT",
        value_name = "NAME=RATIO",
        value_delimiter = ','
    )]
    pub overcommit: Vec<String>,

    /// Percent of the size of kubelet's filesystem (the one holding --kubelet-dir) that a pool on
    /// that filesystem never promises: kubelet evicts every pod of the node when less than its
    /// hard eviction threshold is free (`nodefs.available`, 10% by default). Pools on other
    /// filesystems keep nothing back. 0 turns it off.
    #[arg(
        long,
        env = "KUBELET_EVICTION_RESERVE",
        value_name = "PERCENT",
        default_value_t = DEFAULT_KUBELET_EVICTION_RESERVE,
        value_parser = clap::value_parser!(u8).range(0..=50)
    )]
    pub kubelet_eviction_reserve: u8,

    /// Controller mode only: the node-loss reconciler, which applies the StorageClasses'
    /// `onNodeLoss` to claims whose node is deleted or out of service (see
    /// docs/operations/node-loss.md, "Node loss"): off, on, or dry-run (decides and reports,
    /// changes nothing).
    #[arg(long, env = "NODE_LOSS", value_enum, default_value_t = NodeLossMode::Off)]
    pub node_loss: NodeLossMode,

    /// Controller mode only: restore placement, which sends every claim restored from one of
    /// our snapshots or cloned from one of our claims to the node holding its source (see
    /// docs/operations/snapshots.md, "Placement"): on or off.
    #[arg(long, env = "RESTORE_PLACEMENT", value_enum, default_value_t = Switch::Off)]
    pub restore_placement: Switch,

    /// Controller mode only: the class check, which gives every StorageClass of ours with a
    /// mistake (a misspelt key, a value not allowed) a Warning Event naming it: on or off.
    #[arg(long, env = "CHECK_CLASSES", value_enum, default_value_t = Switch::Off)]
    pub check_classes: Switch,

    /// Controller mode only: group snapshot routing, which labels every VolumeGroupSnapshotContent
    /// of ours with the node of its volumes, so that node's csi-snapshotter cuts it (see
    /// docs/operations/snapshots.md, "Group snapshots"): on or off.
    #[arg(long, env = "GROUP_SNAPSHOTS", value_enum, default_value_t = Switch::Off)]
    pub group_snapshots: Switch,

    /// Controller mode only: overflow evictions, which evicts the pods the node plugins' overflow
    /// checks ask it to, each only if it runs on the asking node and uses that node's volume
    /// (see docs/operations/storage.md, "Volumes above their size"): on or off.
    #[arg(long, env = "OVERFLOW_EVICTIONS", value_enum, default_value_t = Switch::Off)]
    pub overflow_evictions: Switch,

    /// Controller mode only: moves, which take a claim of ours to another node with its data
    /// when asked (`stickyvol cluster move`; see docs/operations/moving.md, "Moving a volume to
    /// another node"): on or off. Needs --namespace, where the nodes' transfer adverts are.
    #[arg(long, env = "MOVES", value_enum, default_value_t = Switch::Off)]
    pub moves: Switch,

    /// Seconds between the reconciler's Lease renewals (the Lease lasts three), and between
    /// its rounds while a lost node's claims are being handled; otherwise it acts on watched
    /// changes.
    #[arg(
        long,
        env = "NODE_LOSS_INTERVAL",
        value_name = "SECONDS",
        default_value_t = 5,
        value_parser = clap::value_parser!(u64).range(1..=300)
    )]
    pub node_loss_interval: u64,

    /// Looks for volumes of this node whose PV is gone (a node that came back after the
    /// cluster released its claims): every volume's PV is read at start and when the node comes
    /// back, a new one's once, and one seen absent again every this many seconds; its data
    /// moves to its pool's lost+found once its PV stays absent for two intervals (0: off; needs
    /// Kubernetes credentials: in-cluster, or $KUBECONFIG).
    #[arg(
        long,
        env = "ORPHAN_CHECK_INTERVAL",
        value_name = "SECONDS",
        default_value_t = 0,
        value_parser = clap::value_parser!(u64).range(0..=3600)
    )]
    pub orphan_check_interval: u64,

    /// Seconds between audits of the project ids in volumes limited by project quotas (a pod's
    /// files moved out of its volume's project are put back, and the volume reported); the
    /// longest a pod can write past its size (0: off; modes all and node only).
    #[arg(
        long,
        env = "PROJECT_AUDIT_INTERVAL",
        value_name = "SECONDS",
        default_value_t = 600,
        value_parser = clap::value_parser!(u64).range(0..=86400)
    )]
    pub project_audit_interval: u64,
    /// Seconds between the overflow check's rounds: a published directory volume whose size its
    /// pool cannot enforce, measured above its size, has its pods evicted (StorageClass
    /// `onOverflow: evict`, the default) or is reported (`report`). A measurement stats made
    /// within 1.5 intervals is reused, so the check walks nothing kubelet's stats walked (0: off;
    /// needs Kubernetes credentials: in-cluster, or $KUBECONFIG).
    #[arg(
        long,
        env = "OVERFLOW_CHECK_INTERVAL",
        value_name = "SECONDS",
        default_value_t = 0,
        value_parser = clap::value_parser!(u64).range(0..=3600)
    )]
    pub overflow_check_interval: u64,
    /// Seconds a volume the overflow check acts on may stay above its size with a pod still
    /// using it (its eviction refused by a PodDisruptionBudget, failing, or impossible) before
    /// its mounts are fenced read-only, in the pods' containers too (0: at the first round).
    #[arg(
        long,
        env = "OVERFLOW_FENCE_AFTER",
        value_name = "SECONDS",
        default_value_t = 120,
        value_parser = clap::value_parser!(u64).range(0..=3600)
    )]
    pub overflow_fence_after: u64,

    /// Where this node plugin listens for node-to-node transfers (`stickyvol volume pull` on
    /// another node, a claim moving there): an IP address (the pod's) and a port, which the
    /// node's advert ConfigMap in `--namespace` names. Unset: no transfers from or to this node
    /// (modes all and node only).
    #[arg(long, env = "TRANSFER_ADDRESS", value_name = "IP:PORT")]
    pub transfer_address: Option<std::net::SocketAddr>,
    /// This node plugin's ServiceAccount token for the audience `stickyvol.csi.io/transfer`
    /// (a projected volume), which a source has the API server review.
    #[arg(
        long,
        env = "TRANSFER_TOKEN_FILE",
        value_name = "PATH",
        default_value = "/var/run/secrets/stickyvol/transfer/token"
    )]
    pub transfer_token_file: PathBuf,

    /// The pod's own namespace (from the downward API): where the reconciler's Lease is, and
    /// where the orphan check keeps this node's report for `stickyvol cluster orphans`.
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: Option<String>,

    /// This replica's name in the Lease (its pod name, from the downward API).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
}

/// A capability that is on or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Switch {
    Off,
    On,
}

/// Whether the node-loss reconciler runs, and whether it acts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum NodeLossMode {
    Off,
    On,
    DryRun,
}

/// The orphan check's validated settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrphanCheckConfig {
    pub interval: Duration,
    /// Where this node's report of PV-less volumes goes; None: not reported there.
    pub report_namespace: Option<String>,
}

/// The node-loss reconciler's validated settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeLossConfig {
    pub dry_run: bool,
    pub interval: Duration,
    pub lease_namespace: String,
    pub identity: String,
}

/// Flags of `stickyvol doctor`: the paths `serve` will use, with the same names, environment
/// variables and defaults, so the init container can be given the same values.
#[derive(Debug, Clone, Args)]
pub struct DoctorArgs {
    #[command(flatten)]
    pub paths: PathArgs,
}

/// The flags naming the host paths, shared by `serve` and `doctor` so both read a DaemonSet's
/// container arguments alike.
#[derive(Debug, Clone, Args)]
pub struct PathArgs {
    /// Kubelet's root directory; every target and staging path must lie beneath it, and its
    /// mount must propagate to kubelet.
    #[arg(long, env = "KUBELET_DIR", default_value = "/var/lib/kubelet")]
    pub kubelet_dir: PathBuf,

    /// Where volumes and their records live [default: <kubelet-dir>/volumes/<driver-name>]
    #[arg(long, env = "DATA_DIR")]
    pub data_dir: Option<PathBuf>,

    /// CSI driver name, reported by GetPluginInfo.
    #[arg(long, env = "DRIVER_NAME", default_value = "stickyvol.csi.io")]
    pub driver_name: String,

    /// Where to keep which targets each volume is published at: a directory a reboot empties
    /// (e.g. /run/stickyvol, a tmpfs), since a reboot also removes the mounts and loop devices
    /// [default: the state directory, which keeps them across reboots until the next start
    /// finds them gone]
    #[arg(long, env = "RUN_DIR")]
    pub run_dir: Option<PathBuf>,

    /// An extra storage pool (repeatable): a directory, usually on its own disk, that
    /// StorageClasses choose with `pool: NAME`; created if missing. The data dir is the pool
    /// named "default".
    #[arg(
        long = "pool",
        env = "POOLS",
        value_name = "NAME=PATH",
        value_delimiter = ','
    )]
    pub pools: Vec<String>,

    /// A pool only some nodes have (repeatable): this node has it if PATH is a directory when
    /// the driver starts, and nothing is created where it is missing. Make PATH on the pool's
    /// disk, so a node whose disk is not mounted lacks the pool instead of filling the disk
    /// underneath.
    #[arg(
        long = "optional-pool",
        env = "OPTIONAL_POOLS",
        value_name = "NAME=PATH",
        value_delimiter = ','
    )]
    pub optional_pools: Vec<String>,
}

/// Name of the pool that lives in the data directory.
pub const DEFAULT_POOL: &str = "default";

/// How a pool limits the size of filesystem volumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EnforcementChoice {
    /// Probe the filesystem at start and use what it offers without changing it.
    Auto,
    /// A btrfs subvolume per volume with a qgroup limit; quota is enabled if it is off.
    Btrfs,
    /// XFS/ext4 project quotas; the filesystem must be mounted with prjquota.
    Project,
    /// Plain directories: usage is measured and reported, never limited.
    None,
}

/// One storage pool as configured.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolConfig {
    pub name: String,
    pub path: PathBuf,
    /// From `--optional-pool`: the node has the pool only where `path` exists (see `present`).
    pub optional: bool,
    pub enforcement: EnforcementChoice,
    /// ≥ 1: unused promises count 1/ratio against free space.
    pub overcommit: f64,
    /// What the pool keeps back for kubelet if it is on kubelet's filesystem (`Pool::open`
    /// compares the two).
    pub kubelet_reserve: KubeletReserve,
}

/// kubelet's default hard eviction threshold, `nodefs.available<10%`.
pub const DEFAULT_KUBELET_EVICTION_RESERVE: u8 = 10;

/// `--kubelet-eviction-reserve`: a share of kubelet's filesystem no pool on it promises.
#[derive(Debug, Clone, PartialEq)]
pub struct KubeletReserve {
    pub kubelet_dir: PathBuf,
    /// 0 to 50.
    pub percent: u8,
}

impl PoolConfig {
    /// Whether this node has the pool: always for `--pool` (its directory is created), for
    /// `--optional-pool` only if its directory exists now.
    pub fn present(&self) -> bool {
        !self.optional || self.path.is_dir()
    }
}

/// Validated configuration shared by all services.
#[derive(Debug, Clone)]
pub struct Config {
    pub socket_path: PathBuf,
    /// The admin API's socket, in the modes that serve it (where the volumes are).
    pub admin_socket: Option<PathBuf>,
    pub node_id: String,
    pub kubelet_dir: PathBuf,
    pub data_dir: PathBuf,
    pub driver_name: String,
    pub mode: Mode,
    pub max_volumes_per_node: i64,
    /// The host's cgroup filesystem, where IO limits are set.
    pub cgroup_root: PathBuf,
    pub metrics_address: Option<SocketAddr>,
    pub metrics_limits: MetricsLimits,
    /// Where publications are kept (None: beside the records).
    pub run_dir: Option<PathBuf>,
    /// The default pool (the data dir) first, then the extra pools in flag order.
    pub pools: Vec<PoolConfig>,
    /// The node-loss reconciler, when it runs (controller mode only).
    pub node_loss: Option<NodeLossConfig>,
    /// Whether restore placement runs (controller mode only).
    pub restore_placement: bool,
    /// Whether the class check runs (controller mode only).
    pub check_classes: bool,
    /// Whether group snapshot routing runs (controller mode only).
    pub group_snapshots: bool,
    /// Whether overflow evictions run (controller mode).
    pub overflow_evictions: bool,
    /// When moves run (controller mode): the driver's namespace, where the adverts are.
    pub moves: Option<String>,
    /// The looks for orphaned volumes, when they run (modes with volumes only).
    pub orphan_check: Option<OrphanCheckConfig>,
    /// Time between project-id audits, when they run (modes with volumes only).
    pub project_audit_interval: Option<Duration>,
    /// The overflow check's interval; None: off.
    pub overflow_check: Option<Duration>,
    /// How long an overflowing volume's pods may go on writing before it is fenced read-only.
    pub overflow_fence_after: Duration,
    /// Node-to-node transfers, when this node plugin serves them.
    pub transfer: Option<TransferConfig>,
}

/// Where transfers listen, the token they present, where the adverts are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferConfig {
    pub address: std::net::SocketAddr,
    pub token_file: PathBuf,
    pub namespace: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("--endpoint must be a unix socket URL such as unix:///run/csi.sock, got {0:?}")]
    Endpoint(String),
    #[error("--admin-socket {path:?}: {why}")]
    AdminSocket { path: PathBuf, why: &'static str },
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
    #[error("--node-loss: {0}")]
    NodeLoss(String),
    #[error(
        "--restore-placement, --check-classes, --overflow-evictions and --moves run only with --mode=controller"
    )]
    ControllerOnly,
    /// A setting that needs another, or a mode, it was not given.
    #[error("{0}")]
    Needs(String),
    #[error("{flag} {value:?}: {why}")]
    Pool {
        flag: &'static str,
        value: String,
        why: String,
    },
}

impl Config {
    pub fn from_args(args: ServeArgs) -> Result<Config, ConfigError> {
        // The checks run in this order, so that of several mistakes the same one is reported.
        let node_loss = node_loss(&args)?;
        let orphan_check = orphan_check(&args)?;
        let overflow_check = host_interval(
            "--overflow-check-interval",
            args.overflow_check_interval,
            args.mode,
        )?;
        let transfer = transfer(&args)?;
        let restore_placement = args.restore_placement == Switch::On;
        let check_classes = args.check_classes == Switch::On;
        let group_snapshots = args.group_snapshots == Switch::On;
        let overflow_evictions = args.overflow_evictions == Switch::On;
        let moves = moves(&args)?;
        if (restore_placement
            || check_classes
            || group_snapshots
            || overflow_evictions
            || moves.is_some())
            && args.mode != Mode::Controller
        {
            return Err(ConfigError::ControllerOnly);
        }
        if !is_label_value(&args.node_id) {
            return Err(ConfigError::NodeId(args.node_id));
        }
        if args.max_volumes_per_node < 0 {
            return Err(ConfigError::MaxVolumes);
        }
        // Read here, before `args` is taken apart below; it checks nothing.
        let metrics_limits = metrics_limits(&args);
        let paths = args.paths.validate(
            &args.enforcement,
            &args.overcommit,
            args.kubelet_eviction_reserve,
        )?;
        let endpoint = args
            .endpoint
            .unwrap_or_else(|| default_endpoint(&paths.kubelet_dir, &paths.driver_name));
        let socket_path = parse_unix_endpoint(&endpoint)?;
        let admin_socket = admin_socket(args.admin_socket, args.mode, &socket_path)?;
        // Controller mode has no volumes to audit: the default interval means nothing there.
        let project_audit_interval = (args.project_audit_interval > 0 && args.mode.works_on_host())
            .then(|| Duration::from_secs(args.project_audit_interval));
        Ok(Config {
            node_loss,
            restore_placement,
            check_classes,
            group_snapshots,
            overflow_evictions,
            moves,
            orphan_check,
            project_audit_interval,
            overflow_check,
            overflow_fence_after: Duration::from_secs(args.overflow_fence_after),
            transfer,
            socket_path,
            admin_socket,
            node_id: args.node_id,
            data_dir: paths.pools[0].path.clone(),
            kubelet_dir: paths.kubelet_dir,
            driver_name: paths.driver_name,
            mode: args.mode,
            max_volumes_per_node: args.max_volumes_per_node,
            cgroup_root: args.cgroup_root,
            metrics_address: args.metrics_address,
            metrics_limits,
            run_dir: paths.run_dir,
            pools: paths.pools,
        })
    }

    /// The pool called `name`, if this node has it.
    pub fn pool(&self, name: &str) -> Option<&PoolConfig> {
        self.pools.iter().find(|p| p.name == name)
    }

    /// The topology segment key that pins volumes to this node.
    pub fn topology_key(&self) -> String {
        format!("topology.{}/node", self.driver_name)
    }
}

/// Where the admin API listens by default: outside the CSI socket's directory, which every
/// sidecar mounts (the manifests mount this directory into the driver's container alone).
pub const DEFAULT_ADMIN_SOCKET: &str = "/run/stickyvol-admin/admin.sock";

/// The admin socket of a mode that serves the admin API; a path given to a mode that does not
/// (controller) is refused rather than ignored.
fn admin_socket(
    given: Option<PathBuf>,
    mode: Mode,
    csi_socket: &Path,
) -> Result<Option<PathBuf>, ConfigError> {
    let refuse = |path: PathBuf, why| Err(ConfigError::AdminSocket { path, why });
    if !mode.works_on_host() {
        return match given {
            Some(path) => refuse(path, "controller mode serves no admin API"),
            None => Ok(None),
        };
    }
    let path = given.unwrap_or_else(|| PathBuf::from(DEFAULT_ADMIN_SOCKET));
    if !path.is_absolute() || path.file_name().is_none() {
        return refuse(path, "must be an absolute path to a socket file");
    }
    // Whoever reaches the CSI socket's directory (the sidecars mount it) must not find the
    // admin API beside it. By path only: a symlink is the operator's own choice.
    if lexically_normal(&path).parent() == lexically_normal(csi_socket).parent() {
        return refuse(
            path,
            "must not be in the CSI socket's directory, which the sidecars mount",
        );
    }
    Ok(Some(path))
}

/// `path` with `.` and `..` resolved by name, without the filesystem.
fn lexically_normal(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut normal = PathBuf::new();
    for component in path.components() {
        match component {
            Component::ParentDir => {
                normal.pop();
            }
            Component::CurDir => {}
            other => normal.push(other),
        }
    }
    normal
}

/// The reconciler's settings: it runs only in controller mode, named in its Lease by its pod's
/// name and namespace.
fn node_loss(args: &ServeArgs) -> Result<Option<NodeLossConfig>, ConfigError> {
    if args.node_loss == NodeLossMode::Off {
        return Ok(None);
    }
    if args.mode != Mode::Controller {
        return Err(ConfigError::NodeLoss(
            "runs only with --mode=controller".into(),
        ));
    }
    let named = |flag: &str, value: &Option<String>| match value.as_deref() {
        Some(v) if is_object_name(v) => Ok(v.to_string()),
        Some(v) => Err(ConfigError::NodeLoss(format!(
            "{flag} {v:?} is not a Kubernetes object name"
        ))),
        None => Err(ConfigError::NodeLoss(format!(
            "needs {flag} (the pod's, from the downward API)"
        ))),
    };
    Ok(Some(NodeLossConfig {
        dry_run: args.node_loss == NodeLossMode::DryRun,
        interval: Duration::from_secs(args.node_loss_interval),
        lease_namespace: named("--namespace", &args.namespace)?,
        identity: named("--identity", &args.identity)?,
    }))
}

/// Moves' namespace (the adverts'), when they run.
fn moves(args: &ServeArgs) -> Result<Option<String>, ConfigError> {
    if args.moves == Switch::Off {
        return Ok(None);
    }
    match args.namespace.as_deref() {
        Some(ns) if is_object_name(ns) => Ok(Some(ns.to_string())),
        _ => Err(ConfigError::Needs(
            "--moves=on needs --namespace (POD_NAMESPACE), where the nodes' transfer adverts are"
                .into(),
        )),
    }
}

/// The interval of a check that looks at this node's volumes (0: off); asking for it in a
/// mode without volumes (controller) is refused rather than ignored.
fn host_interval(flag: &str, seconds: u64, mode: Mode) -> Result<Option<Duration>, ConfigError> {
    match (seconds, mode.works_on_host()) {
        (0, _) => Ok(None),
        (seconds, true) => Ok(Some(Duration::from_secs(seconds))),
        (_, false) => Err(ConfigError::NodeLoss(format!(
            "{flag} runs only where the volumes are (--mode=all or node)"
        ))),
    }
}

/// Transfers' settings, when `--transfer-address` asks for them: a node plugin's, an address
/// others can reach (not 0.0.0.0), and `--namespace` for the adverts.
fn transfer(args: &ServeArgs) -> Result<Option<TransferConfig>, ConfigError> {
    let Some(address) = args.transfer_address else {
        return Ok(None);
    };
    let refuse = |why: &str| Err(ConfigError::Needs(format!("--transfer-address: {why}")));
    if !args.mode.works_on_host() {
        return refuse("transfers run only where the volumes are (--mode=all or node)");
    }
    if address.ip().is_unspecified() {
        return refuse("an address other nodes can reach (the pod's IP), not 0.0.0.0 or ::");
    }
    match args.namespace.as_deref() {
        Some(ns) if is_object_name(ns) => Ok(Some(TransferConfig {
            address,
            token_file: args.transfer_token_file.clone(),
            namespace: ns.to_string(),
        })),
        _ => refuse("needs --namespace (POD_NAMESPACE), where the nodes' adverts are"),
    }
}

/// The orphan check's settings, when it runs: its interval, and the namespace where it keeps
/// this node's report (if given, a valid object name).
fn orphan_check(args: &ServeArgs) -> Result<Option<OrphanCheckConfig>, ConfigError> {
    let interval = host_interval(
        "--orphan-check-interval",
        args.orphan_check_interval,
        args.mode,
    )?;
    let Some(interval) = interval else {
        return Ok(None);
    };
    let report_namespace = match args.namespace.as_deref() {
        None => None,
        Some(ns) if is_object_name(ns) => Some(ns.to_string()),
        Some(ns) => {
            return Err(ConfigError::NodeLoss(format!(
                "--namespace {ns:?} is not a Kubernetes object name"
            )));
        }
    };
    Ok(Some(OrphanCheckConfig {
        interval,
        report_namespace,
    }))
}

/// The metrics server's limits: the defaults, less what the hidden flags shorten.
fn metrics_limits(args: &ServeArgs) -> MetricsLimits {
    let defaults = MetricsLimits::default();
    MetricsLimits {
        header_timeout: args
            .metrics_header_timeout_ms
            .map_or(defaults.header_timeout, Duration::from_millis),
        idle_timeout: args
            .metrics_idle_timeout_ms
            .map_or(defaults.idle_timeout, Duration::from_millis),
        max_connections: args
            .metrics_max_connections
            .map_or(defaults.max_connections, |n| n as usize),
    }
}

/// Validated flags of `stickyvol doctor`: the paths it checks, judged by the same rules as
/// `serve`'s, so a flag `serve` would refuse is refused here too, before any check runs.
#[derive(Debug, Clone, PartialEq)]
pub struct DoctorConfig {
    pub kubelet_dir: PathBuf,
    /// The default pool (the data dir) first, then the extra pools in flag order.
    pub pools: Vec<PoolConfig>,
    /// Where `serve --run-dir` will keep publications (None: beside the records).
    pub run_dir: Option<PathBuf>,
}

impl DoctorConfig {
    pub fn from_args(args: DoctorArgs) -> Result<DoctorConfig, ConfigError> {
        // Doctor promises nothing; the pools read as serve's read by default.
        let paths = args
            .paths
            .validate(&[], &[], DEFAULT_KUBELET_EVICTION_RESERVE)?;
        Ok(DoctorConfig {
            kubelet_dir: paths.kubelet_dir,
            pools: paths.pools,
            run_dir: paths.run_dir,
        })
    }

    /// The data directory: the default pool's path.
    pub fn data_dir(&self) -> &Path {
        &self.pools[0].path
    }
}

/// `PathArgs` checked by the rules both `serve` and `doctor` apply.
struct Paths {
    kubelet_dir: PathBuf,
    driver_name: String,
    run_dir: Option<PathBuf>,
    /// The default pool (the data dir) first.
    pools: Vec<PoolConfig>,
}

impl PathArgs {
    fn validate(
        self,
        enforcement_flags: &[String],
        overcommit_flags: &[String],
        kubelet_reserve_percent: u8,
    ) -> Result<Paths, ConfigError> {
        if !is_driver_name(&self.driver_name) {
            return Err(ConfigError::DriverName(self.driver_name));
        }
        require_absolute("--kubelet-dir", &self.kubelet_dir)?;
        let data_dir = self
            .data_dir
            .unwrap_or_else(|| default_data_dir(&self.kubelet_dir, &self.driver_name));
        require_absolute("--data-dir", &data_dir)?;
        if let Some(run_dir) = &self.run_dir {
            require_absolute("--run-dir", run_dir)?;
        }
        let pool_flags = PoolFlags {
            pools: &self.pools,
            optional_pools: &self.optional_pools,
            enforcement: enforcement_flags,
            overcommit: overcommit_flags,
            kubelet_reserve: KubeletReserve {
                kubelet_dir: self.kubelet_dir.clone(),
                percent: kubelet_reserve_percent,
            },
        };
        Ok(Paths {
            pools: pools(&data_dir, pool_flags)?,
            kubelet_dir: self.kubelet_dir,
            driver_name: self.driver_name,
            run_dir: self.run_dir,
        })
    }
}

/// `unix://<kubelet-dir>/plugins/<driver-name>/csi.sock`: where kubelet's plugin registration
/// looks for the driver, so where `serve` listens and the admin commands call by default.
pub fn default_endpoint(kubelet_dir: &Path, driver_name: &str) -> String {
    format!(
        "unix://{}",
        kubelet_dir
            .join("plugins")
            .join(driver_name)
            .join("csi.sock")
            .display()
    )
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

/// The flags that describe pools.
struct PoolFlags<'a> {
    pools: &'a [String],
    optional_pools: &'a [String],
    enforcement: &'a [String],
    overcommit: &'a [String],
    kubelet_reserve: KubeletReserve,
}

/// The pools from `--pool`, `--optional-pool`, `--enforcement` and `--overcommit`, the data dir
/// first as "default".
fn pools(data_dir: &Path, flags: PoolFlags) -> Result<Vec<PoolConfig>, ConfigError> {
    let mut pools = vec![PoolConfig {
        name: DEFAULT_POOL.into(),
        path: data_dir.to_path_buf(),
        optional: false,
        enforcement: EnforcementChoice::Auto,
        overcommit: 1.0,
        kubelet_reserve: flags.kubelet_reserve.clone(),
    }];
    let given = (flags.pools.iter().map(|f| ("--pool", f, false))).chain(
        flags
            .optional_pools
            .iter()
            .map(|f| ("--optional-pool", f, true)),
    );
    for (flag_name, flag, optional) in given {
        let (name, path) = pool_flag(flag_name, flag)?;
        let invalid = |why: String| pool_error(flag_name, flag, why);
        if name == DEFAULT_POOL {
            return Err(invalid(format!(
                "{DEFAULT_POOL:?} is the data dir's pool; use --data-dir"
            )));
        }
        if let Some(other) = pools.iter().find(|p| p.name == name) {
            return Err(invalid(format!("pool {:?} is given twice", other.name)));
        }
        if let Some(other) = pools
            .iter()
            .find(|p| p.path.starts_with(&path) || path.starts_with(&p.path))
        {
            return Err(invalid(format!(
                "overlaps pool {:?} at {}",
                other.name,
                other.path.display()
            )));
        }
        pools.push(PoolConfig {
            name: name.to_string(),
            path,
            optional,
            enforcement: EnforcementChoice::Auto,
            overcommit: 1.0,
            kubelet_reserve: flags.kubelet_reserve.clone(),
        });
    }
    for flag in flags.enforcement {
        let (name, value) = named_value("--enforcement", flag)?;
        let choice = EnforcementChoice::from_str(value, true).map_err(|_| {
            pool_error(
                "--enforcement",
                flag,
                "expected auto, btrfs, project or none".into(),
            )
        })?;
        pool_named(&mut pools, "--enforcement", flag, name)?.enforcement = choice;
    }
    for flag in flags.overcommit {
        let (name, value) = named_value("--overcommit", flag)?;
        let ratio: f64 = value
            .parse()
            .ok()
            .filter(|r: &f64| r.is_finite() && *r >= 1.0)
            .ok_or_else(|| {
                pool_error(
                    "--overcommit",
                    flag,
                    "the ratio must be a number ≥ 1".into(),
                )
            })?;
        pool_named(&mut pools, "--overcommit", flag, name)?.overcommit = ratio;
    }
    Ok(pools)
}

/// One `--pool NAME=PATH` (or `--optional-pool`): a pool name and an absolute path.
fn pool_flag<'a>(flag: &'static str, value: &'a str) -> Result<(&'a str, PathBuf), ConfigError> {
    let (name, path) = named_value(flag, value)?;
    let path = PathBuf::from(path);
    require_absolute(flag, &path)?;
    Ok((name, path))
}

/// Splits `NAME=VALUE`, checking NAME is a pool name.
fn named_value<'a>(flag: &'static str, value: &'a str) -> Result<(&'a str, &'a str), ConfigError> {
    let (name, rest) = value
        .split_once('=')
        .ok_or_else(|| pool_error(flag, value, "expected NAME=VALUE".into()))?;
    if !is_pool_name(name) {
        return Err(pool_error(
            flag,
            value,
            "pool names are 1-63 of [a-z0-9-], alphanumeric at both ends".into(),
        ));
    }
    Ok((name, rest))
}

fn pool_named<'a>(
    pools: &'a mut [PoolConfig],
    flag: &'static str,
    value: &str,
    name: &str,
) -> Result<&'a mut PoolConfig, ConfigError> {
    pools
        .iter_mut()
        .find(|p| p.name == name)
        .ok_or_else(|| pool_error(flag, value, format!("no pool is named {name:?}")))
}

fn pool_error(flag: &'static str, value: &str, why: String) -> ConfigError {
    ConfigError::Pool {
        flag,
        value: value.to_string(),
        why,
    }
}

/// Pool names appear in StorageClasses, logs and metric labels: keep them plain.
pub fn is_pool_name(name: &str) -> bool {
    is_bounded_name(name, |b| {
        b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'
    })
}

/// Accepts `unix:///abs/path` (and, like other drivers, `unix:/abs/path`).
pub fn parse_unix_endpoint(endpoint: &str) -> Result<PathBuf, ConfigError> {
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

/// A DNS-1123 subdomain (pod and namespace names fit it): 1–253 bytes of [a-z0-9.-],
/// alphanumeric at both ends.
pub fn is_object_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 253
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'.'))
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

/// `HOST:PORT` as a socket address; an IPv6 host may lack its brackets (kubelet expands
/// `$(POD_IP):8080` to `fd00::7:8080` on an IPv6 pod), the port being what follows the last `:`.
pub fn parse_metrics_address(value: &str) -> Result<SocketAddr, String> {
    if let Ok(address) = value.parse() {
        return Ok(address);
    }
    value
        .rsplit_once(':')
        .and_then(|(host, port)| Some((host.parse::<Ipv6Addr>().ok()?, port.parse().ok()?)))
        .map(|(host, port)| SocketAddr::V6(SocketAddrV6::new(host, port, 0, 0)))
        .ok_or_else(|| {
            "expected IP:PORT, e.g. 10.0.0.7:8080, [fd00::7]:8080 or fd00::7:8080".to_string()
        })
}

/// What one client may hold of the metrics server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricsLimits {
    /// Time to send a whole request head, from the connection opening or the previous response.
    pub header_timeout: Duration,
    /// Time without a byte read or written before the connection is closed.
    pub idle_timeout: Duration,
    /// Connections open at once; Prometheus needs one per scraper.
    pub max_connections: usize,
}

impl Default for MetricsLimits {
    fn default() -> Self {
        MetricsLimits {
            header_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(10),
            max_connections: 32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(node_id: &str) -> ServeArgs {
        ServeArgs {
            endpoint: None,
            admin_socket: None,
            node_id: node_id.into(),
            paths: path_args(),
            cgroup_root: "/sys/fs/cgroup".into(),
            mode: Mode::All,
            max_volumes_per_node: 0,
            metrics_address: None,
            metrics_header_timeout_ms: None,
            metrics_idle_timeout_ms: None,
            metrics_max_connections: None,
            enforcement: Vec::new(),
            overcommit: Vec::new(),
            kubelet_eviction_reserve: DEFAULT_KUBELET_EVICTION_RESERVE,
            node_loss: NodeLossMode::Off,
            restore_placement: Switch::Off,
            check_classes: Switch::Off,
            group_snapshots: Switch::Off,
            overflow_evictions: Switch::Off,
            moves: Switch::Off,
            node_loss_interval: 5,
            orphan_check_interval: 0,
            project_audit_interval: 600,
            overflow_check_interval: 0,
            overflow_fence_after: 120,
            transfer_address: None,
            transfer_token_file: PathBuf::from("/var/run/secrets/stickyvol/transfer/token"),
            namespace: None,
            identity: None,
        }
    }

    fn path_args() -> PathArgs {
        PathArgs {
            kubelet_dir: "/var/lib/kubelet".into(),
            data_dir: None,
            driver_name: "stickyvol.csi.io".into(),
            run_dir: None,
            pools: Vec::new(),
            optional_pools: Vec::new(),
        }
    }

    fn doctor_args() -> DoctorArgs {
        DoctorArgs { paths: path_args() }
    }

    #[test]
    fn metrics_address_takes_ipv4_bracketed_and_bare_ipv6() {
        let parse = |v: &str| parse_metrics_address(v).map(|a| a.to_string());
        assert_eq!(parse("10.0.0.7:8080").unwrap(), "10.0.0.7:8080");
        assert_eq!(parse("0.0.0.0:8080").unwrap(), "0.0.0.0:8080");
        assert_eq!(parse("[fd00::7]:8080").unwrap(), "[fd00::7]:8080");
        // What `$(POD_IP):8080` becomes on an IPv6 pod.
        assert_eq!(parse("fd00::7:8080").unwrap(), "[fd00::7]:8080");
        assert_eq!(parse("fd00:::8080").unwrap(), "[fd00::]:8080");
        for bad in [
            "10.0.0.7",
            "fd00::7",
            "10.0.0.7:http",
            "host:8080",
            ":8080",
            "$(POD_IP):8080",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn doctor_derives_the_paths_serve_derives() {
        let doctor = DoctorConfig::from_args(doctor_args()).unwrap();
        let serve = Config::from_args(args("n")).unwrap();
        assert_eq!(doctor.kubelet_dir, serve.kubelet_dir);
        assert_eq!(doctor.data_dir(), serve.data_dir);
        assert_eq!(doctor.pools, serve.pools);
        assert_eq!(doctor.run_dir, serve.run_dir);

        let mut a = doctor_args();
        a.paths.pools = vec!["fast=/mnt/nvme".into()];
        let doctor = DoctorConfig::from_args(a).unwrap();
        assert_eq!(doctor.pools[1].name, "fast");
        assert_eq!(doctor.pools[1].path, PathBuf::from("/mnt/nvme"));
    }

    #[test]
    fn doctor_refuses_what_serve_refuses() {
        let with = |change: fn(&mut DoctorArgs)| {
            let mut a = doctor_args();
            change(&mut a);
            a
        };
        let cases = [
            (
                "relative kubelet dir",
                with(|a| a.paths.kubelet_dir = "k".into()),
            ),
            (
                "relative data dir",
                with(|a| a.paths.data_dir = Some("d".into())),
            ),
            (
                "relative run dir",
                with(|a| a.paths.run_dir = Some("r".into())),
            ),
            (
                "bad driver name",
                with(|a| a.paths.driver_name = "Not_A_Name".into()),
            ),
            (
                "pool without a path",
                with(|a| a.paths.pools = vec!["fast".into()]),
            ),
            (
                "pool inside the data dir",
                with(|a| {
                    a.paths.pools = vec!["fast=/var/lib/kubelet/volumes/stickyvol.csi.io/x".into()]
                }),
            ),
        ];
        for (what, a) in cases {
            assert!(DoctorConfig::from_args(a).is_err(), "{what} accepted");
        }
    }

    #[test]
    fn pools_come_from_flags_with_the_data_dir_first() {
        let mut a = args("n");
        a.paths.data_dir = Some("/data".into());
        a.paths.pools = vec!["fast=/mnt/nvme".into(), "slow=/mnt/hdd".into()];
        a.enforcement = vec!["fast=btrfs".into(), "default=none".into()];
        a.overcommit = vec!["slow=2.5".into()];
        let config = Config::from_args(a).unwrap();
        let summary: Vec<_> = config
            .pools
            .iter()
            .map(|p| {
                (
                    p.name.as_str(),
                    p.path.to_str().unwrap(),
                    p.enforcement,
                    p.overcommit,
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                ("default", "/data", EnforcementChoice::None, 1.0),
                ("fast", "/mnt/nvme", EnforcementChoice::Btrfs, 1.0),
                ("slow", "/mnt/hdd", EnforcementChoice::Auto, 2.5),
            ]
        );
    }

    #[test]
    fn bad_pool_flags_are_refused() {
        let cases: [(&str, &str); 9] = [
            ("pool", "fast"),
            ("pool", "fast=relative"),
            ("pool", "Fast=/mnt/a"),
            ("pool", "default=/mnt/a"),
            ("pool", "inside=/data/sub"),
            ("pool", "outside=/"),
            ("enforcement", "default=zfs"),
            ("enforcement", "nosuch=none"),
            ("overcommit", "default=0.5"),
        ];
        for (flag, value) in cases {
            let mut a = args("n");
            a.paths.data_dir = Some("/data".into());
            match flag {
                "pool" => a.paths.pools = vec![value.into()],
                "enforcement" => a.enforcement = vec![value.into()],
                _ => a.overcommit = vec![value.into()],
            }
            assert!(Config::from_args(a).is_err(), "--{flag} {value} accepted");
        }
        let mut a = args("n");
        a.paths.pools = vec!["a=/mnt/a".into(), "a=/mnt/b".into()];
        assert!(
            Config::from_args(a).is_err(),
            "a pool name given twice was accepted"
        );
    }

    #[test]
    fn optional_pools_are_pools_that_need_their_directory() {
        let dir = tempfile::tempdir().unwrap();
        let here = dir.path().join("here");
        std::fs::create_dir(&here).unwrap();
        let mut a = args("n");
        a.paths.pools = vec!["fast=/mnt/nvme".into()];
        a.paths.optional_pools = vec![
            format!("here={}", here.display()),
            format!("gone={}", dir.path().join("gone").display()),
        ];
        a.enforcement = vec!["gone=none".into()];
        let config = Config::from_args(a).unwrap();
        let summary: Vec<_> = config
            .pools
            .iter()
            .map(|p| (p.name.as_str(), p.optional, p.present()))
            .collect();
        assert_eq!(
            summary,
            [
                ("default", false, true),
                // A --pool is created at start, so it counts as present wherever it is.
                ("fast", false, true),
                ("here", true, true),
                ("gone", true, false),
            ]
        );
        assert_eq!(
            config.pool("gone").unwrap().enforcement,
            EnforcementChoice::None
        );

        for (pools, optional) in [
            (vec!["a=/mnt/a"], vec!["a=/mnt/b"]),
            (vec!["a=/mnt/a"], vec!["b=/mnt/a/b"]),
            (vec![], vec!["default=/mnt/a"]),
            (vec![], vec!["b=relative"]),
        ] {
            let mut a = args("n");
            a.paths.pools = pools.iter().map(|p| p.to_string()).collect();
            a.paths.optional_pools = optional.iter().map(|p| p.to_string()).collect();
            assert!(
                Config::from_args(a).is_err(),
                "--pool {pools:?} --optional-pool {optional:?} accepted"
            );
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
    fn default_endpoint_is_the_plugin_socket_and_parses() {
        let endpoint = default_endpoint(Path::new("/var/lib/kubelet"), "stickyvol.csi.io");
        assert_eq!(
            endpoint,
            "unix:///var/lib/kubelet/plugins/stickyvol.csi.io/csi.sock"
        );
        assert_eq!(
            parse_unix_endpoint(&endpoint).unwrap(),
            PathBuf::from("/var/lib/kubelet/plugins/stickyvol.csi.io/csi.sock")
        );
        assert_eq!(
            default_endpoint(Path::new("/k"), "other.example.com"),
            "unix:///k/plugins/other.example.com/csi.sock"
        );
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
    fn the_admin_socket_is_apart_from_the_csi_socket_where_volumes_are() {
        let with = |mode, endpoint: &str, admin: Option<&str>| {
            let mut a = args("n");
            a.mode = mode;
            a.endpoint = Some(endpoint.into());
            a.admin_socket = admin.map(PathBuf::from);
            Config::from_args(a).map(|c| c.admin_socket)
        };
        let csi = "unix:///csi/csi.sock";
        let default = Some(PathBuf::from(DEFAULT_ADMIN_SOCKET));
        assert_eq!(with(Mode::All, csi, None).unwrap(), default);
        assert_eq!(with(Mode::Node, csi, None).unwrap(), default);
        assert_eq!(with(Mode::Controller, csi, None).unwrap(), None);
        assert_eq!(
            with(Mode::All, csi, Some("/run/a/admin.sock")).unwrap(),
            Some(PathBuf::from("/run/a/admin.sock"))
        );
        // Not inside the CSI socket's directory however it is spelt; not relative; not
        // where nothing serves it.
        for (mode, admin, why) in [
            (Mode::All, "/csi/admin.sock", "the CSI socket's directory"),
            (
                Mode::Node,
                "/run/../csi/./admin.sock",
                "the CSI socket's directory",
            ),
            (Mode::All, "admin.sock", "absolute"),
            (Mode::All, "/", "absolute"),
            (Mode::Controller, "/run/a/admin.sock", "controller mode"),
        ] {
            let err = with(mode, csi, Some(admin)).unwrap_err().to_string();
            assert!(
                err.starts_with("--admin-socket") && err.contains(why),
                "{admin}: {err}"
            );
        }
        // The default is refused too, with a CSI socket beside it.
        let err = with(Mode::All, "unix:///run/stickyvol-admin/csi.sock", None).unwrap_err();
        assert!(err.to_string().contains("CSI socket's directory"), "{err}");
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

    #[test]
    fn node_loss_runs_only_in_controller_mode_with_a_lease_name() {
        let with = |mode, node_loss, namespace: Option<&str>, identity: Option<&str>| {
            let mut a = args("n");
            a.mode = mode;
            a.node_loss = node_loss;
            a.namespace = namespace.map(Into::into);
            a.identity = identity.map(Into::into);
            Config::from_args(a)
        };
        let ns = Some("stickyvol");
        let pod = Some("stickyvol-controller-0");
        assert_eq!(
            with(Mode::All, NodeLossMode::Off, None, None)
                .unwrap()
                .node_loss,
            None
        );
        let on = with(Mode::Controller, NodeLossMode::On, ns, pod).unwrap();
        assert_eq!(
            on.node_loss,
            Some(NodeLossConfig {
                dry_run: false,
                interval: Duration::from_secs(5),
                lease_namespace: "stickyvol".into(),
                identity: "stickyvol-controller-0".into(),
            })
        );
        let dry = with(Mode::Controller, NodeLossMode::DryRun, ns, pod).unwrap();
        assert!(dry.node_loss.unwrap().dry_run);
        for (mode, namespace, identity) in [
            (Mode::All, ns, pod),
            (Mode::Node, ns, pod),
            (Mode::Controller, None, pod),
            (Mode::Controller, ns, None),
            (Mode::Controller, Some("Bad_NS"), pod),
            (Mode::Controller, ns, Some("")),
        ] {
            let err = with(mode, NodeLossMode::On, namespace, identity).unwrap_err();
            assert!(matches!(err, ConfigError::NodeLoss(_)), "{err}");
        }
    }

    #[test]
    fn the_overflow_check_runs_only_where_the_volumes_are() {
        let with = |mode, seconds| {
            let mut a = args("n");
            a.mode = mode;
            a.overflow_check_interval = seconds;
            Config::from_args(a)
        };
        assert_eq!(with(Mode::All, 0).unwrap().overflow_check, None);
        assert_eq!(with(Mode::Controller, 0).unwrap().overflow_check, None);
        assert_eq!(
            with(Mode::Node, 60).unwrap().overflow_check,
            Some(Duration::from_secs(60))
        );
        let err = with(Mode::Controller, 60).unwrap_err();
        assert!(
            err.to_string().contains("--overflow-check-interval"),
            "{err}"
        );
    }

    #[test]
    fn transfers_listen_where_others_reach_a_node_plugin_and_advertise_in_its_namespace() {
        let with = |mode, address: &str, namespace: Option<&str>| {
            let mut a = args("n");
            a.mode = mode;
            a.transfer_address = Some(address.parse().unwrap());
            a.namespace = namespace.map(Into::into);
            Config::from_args(a)
        };
        let on = with(Mode::Node, "10.1.2.3:9820", Some("stickyvol")).unwrap();
        assert_eq!(
            on.transfer,
            Some(TransferConfig {
                address: "10.1.2.3:9820".parse().unwrap(),
                token_file: PathBuf::from("/var/run/secrets/stickyvol/transfer/token"),
                namespace: "stickyvol".into(),
            })
        );
        assert_eq!(
            Config::from_args(args("n")).unwrap().transfer,
            None,
            "off unless asked"
        );
        for (mode, address, namespace, why) in [
            (
                Mode::Controller,
                "10.1.2.3:9820",
                Some("stickyvol"),
                "where the volumes are",
            ),
            (Mode::Node, "0.0.0.0:9820", Some("stickyvol"), "not 0.0.0.0"),
            (Mode::Node, "[::]:9820", Some("stickyvol"), "not 0.0.0.0"),
            (Mode::Node, "10.1.2.3:9820", None, "needs --namespace"),
            (
                Mode::Node,
                "10.1.2.3:9820",
                Some("Bad_NS"),
                "needs --namespace",
            ),
        ] {
            let err = with(mode, address, namespace).unwrap_err().to_string();
            assert!(
                err.contains("--transfer-address") && err.contains(why),
                "{err}"
            );
        }
    }

    #[test]
    fn the_orphan_check_reports_in_the_pods_namespace_when_it_has_one() {
        let with = |mode, seconds, namespace: Option<&str>| {
            let mut a = args("n");
            a.mode = mode;
            a.orphan_check_interval = seconds;
            a.namespace = namespace.map(Into::into);
            Config::from_args(a)
        };
        assert_eq!(
            with(Mode::All, 0, Some("stickyvol")).unwrap().orphan_check,
            None
        );
        assert_eq!(
            with(Mode::Node, 60, Some("stickyvol"))
                .unwrap()
                .orphan_check,
            Some(OrphanCheckConfig {
                interval: Duration::from_secs(60),
                report_namespace: Some("stickyvol".into()),
            })
        );
        let unreported = with(Mode::All, 60, None).unwrap().orphan_check.unwrap();
        assert_eq!(unreported.report_namespace, None);
        for (mode, namespace) in [
            (Mode::Controller, Some("stickyvol")),
            (Mode::All, Some("Bad_NS")),
        ] {
            let err = with(mode, 60, namespace).unwrap_err();
            assert!(matches!(err, ConfigError::NodeLoss(_)), "{err}");
        }
    }

    #[test]
    fn the_project_audit_runs_where_the_volumes_are_unless_turned_off() {
        let with = |mode, seconds| {
            let mut a = args("n");
            a.mode = mode;
            a.project_audit_interval = seconds;
            Config::from_args(a).unwrap().project_audit_interval
        };
        assert_eq!(with(Mode::All, 600), Some(Duration::from_secs(600)));
        assert_eq!(with(Mode::Node, 5), Some(Duration::from_secs(5)));
        assert_eq!(with(Mode::All, 0), None);
        assert_eq!(with(Mode::Controller, 600), None);
        use clap::Parser;
        let parsed = crate::cli::Cli::try_parse_from(["stickyvol", "serve", "--node-id", "n"]);
        let Ok(crate::cli::Cli {
            command: crate::cli::Command::Serve(serve),
            ..
        }) = parsed
        else {
            panic!("serve does not parse: {parsed:?}");
        };
        assert_eq!(serve.project_audit_interval, 600, "the default");
    }
}
