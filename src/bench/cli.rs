//! Command-line flags of `stickyvol-bench`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Benchmarks a CSI driver over its unix socket, calling it the way external-provisioner and
/// kubelet do. Works with any CSI driver: it follows the capabilities the driver advertises.
///
/// Exit status: 0 when every call succeeded, 1 when any call failed (the report says which),
/// 2 when the benchmark could not run at all.
#[derive(Debug, Parser)]
#[command(version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub workload: Workload,
}

#[derive(Debug, Subcommand)]
pub enum Workload {
    /// Per volume: CreateVolume → (ControllerPublish) → (NodeStage) → NodePublish →
    /// NodeUnpublish → (NodeUnstage) → (ControllerUnpublish) → DeleteVolume.
    Lifecycle(LifecycleArgs),
    /// Time from starting --driver-cmd to its first successful Probe, with --preload volumes on disk.
    Startup(StartupArgs),
    /// Direct I/O through one published block volume (4 KiB random and 1 MiB sequential reads
    /// and writes at queue depth 1 and 32), side by side with a plain file of the same size on
    /// the filesystem of the volume's data.
    BlockIo(BlockIoArgs),
    /// NodeGetVolumeStats from many callers on one published volume holding many files, while
    /// Probe is timed and a second volume is published and unpublished every second.
    StatsFlood(StatsFloodArgs),
    /// Direct I/O in a file on a volume with a filesystem of its own (--fs-type; stickyvol's
    /// image volumes), side by side with a file on a directory volume of the same pool.
    FsIo(FsIoArgs),
    /// What a node's driver is asked while no volume changes, sped up: csi-provisioner's
    /// capacity polls (GetCapacity for filesystem and block volumes of the node's topology),
    /// livenessprobe's Probe, kubelet's NodeGetCapabilities and NodeGetInfo, and Prometheus's
    /// scrapes of --metrics-address; each call's latencies and the driver's memory before and
    /// after.
    Housekeeping(HousekeepingArgs),
    /// Not a CSI benchmark: a big cluster on one machine. A simulated API server holds --nodes
    /// Nodes shaped like real ones and --pvs PVs of stickyvol; `stickyvol serve` runs against
    /// it as the controller (node loss on) and as one node plugin (orphan check on). Prints
    /// their peak RSS, their steady-state requests and bytes received, and the time from a
    /// Node's deletion and from an out-of-service taint to the reconciler's release.
    Cluster(ClusterArgs),
    /// The speed guard CI runs: rounds of `lifecycle` against the reference build
    /// (--reference-cmd) and the candidate (--driver-cmd), in turns; each call's p50, a whole
    /// cycle's time and the peak RSS of the candidate over the reference's of the same round,
    /// the median over rounds. Exit status 1 when a figure is more than --tolerance behind.
    Guard(GuardArgs),
    /// IO limits from a VolumeAttributesClass (`writeIOPS`), for a block and an image volume:
    /// 4 KiB random direct writes in a pod's cgroup (made as kubelet makes it) on a limited
    /// volume, beside an unlimited neighbour of the same pool in a pod of its own, before and
    /// after ControllerModifyVolume changes the class on the running pod. Exit status 1 when the
    /// limited volume exceeds its limit × (1 + --limit-slack) or the neighbour keeps less than
    /// --neighbour-share of its rate alone.
    IoLimits(IoLimitsArgs),
    /// How long a group snapshot holds its members' writers: --members volumes staged and
    /// published, a writer timing each 4 KiB write on every one, and --cuts
    /// CreateVolumeGroupSnapshot calls of them all (each deleted again): the longest write of
    /// any member during each cut, against the longest over a quiet spell as long.
    GroupSnapshot(GroupSnapshotArgs),
    /// Internal: one writer of `io-limits`, run in a pod's cgroup.
    #[command(hide = true)]
    IoWriter(IoWriterArgs),
}

#[derive(Debug, Args)]
pub struct ClusterArgs {
    /// The stickyvol binary to run.
    #[arg(long, default_value = "stickyvol")]
    pub stickyvol: PathBuf,

    /// Where the run's directory is made (removed at the end unless --keep).
    #[arg(long, default_value = "/var/tmp")]
    pub work_dir: PathBuf,

    /// Keep the run's directory (the drivers' logs, the node plugin's volumes).
    #[arg(long)]
    pub keep: bool,

    #[arg(long, default_value_t = 5000)]
    pub nodes: usize,

    #[arg(long, default_value_t = 50_000)]
    pub pvs: usize,

    /// Volumes of the node plugin, each with its PV.
    #[arg(long, default_value_t = 10)]
    pub node_volumes: usize,

    /// The node plugin's --orphan-check-interval, in seconds.
    #[arg(long, default_value_t = 60)]
    pub orphan_check_interval: u64,

    /// Every Node's status is written again once per this period (kubelet: 5 minutes).
    #[arg(long, default_value = "300s", value_parser = parse_duration)]
    pub node_update_period: Duration,

    /// Time given to both to start and read the cluster before measuring.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub settle: Duration,

    /// The steady state measured.
    #[arg(long, default_value = "180s", value_parser = parse_duration)]
    pub window: Duration,

    /// Print the report as JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Which driver, and where kubelet's directories are: every workload's first flags.
#[derive(Debug, Clone, Args)]
pub struct DriverArgs {
    /// The driver's CSI socket.
    #[arg(long, value_name = "unix:///PATH")]
    pub endpoint: String,

    /// Kubelet's root directory: target and staging paths follow kubelet's layout beneath it.
    #[arg(long, default_value = "/var/lib/kubelet")]
    pub kubelet_dir: PathBuf,

    /// Start the driver with this shell command (run by `sh -c`), wait until Probe says ready,
    /// and SIGTERM it at the end.
    #[arg(long, value_name = "COMMAND")]
    pub driver_cmd: Option<String>,

    /// Pid of an already running driver, to report its memory (VmRSS, VmHWM).
    #[arg(long, conflicts_with = "driver_cmd")]
    pub driver_pid: Option<u32>,
}

#[derive(Debug, Args)]
pub struct Common {
    #[command(flatten)]
    pub driver: DriverArgs,

    /// Access type of the volumes.
    #[arg(long, value_enum, default_value_t = AccessType::Mount)]
    pub access_type: AccessType,

    /// Requested capacity of each volume, in bytes.
    #[arg(long, default_value_t = 64 << 20)]
    pub size: i64,

    /// fsType of mount volumes (empty: the driver's default).
    #[arg(long, default_value = "")]
    pub fs_type: String,

    /// A CreateVolume parameter (StorageClass parameter), KEY=VALUE; repeatable.
    #[arg(long = "parameter", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub parameters: Vec<(String, String)>,

    /// Volumes created before the measurement and left in place during it (concurrently).
    #[arg(long, default_value_t = 0)]
    pub preload: usize,

    /// Leave the preloaded volumes in place at the end.
    #[arg(long)]
    pub keep_preload: bool,

    /// Deadline of every gRPC call.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub deadline: Duration,

    /// Print the report as JSON (stable field names) instead of a table.
    #[arg(long)]
    pub json: bool,
}

impl Common {
    /// The flags of a workload that works on volumes of its own, with no preload and the
    /// driver's default fsType.
    fn without_preload(
        driver: &DriverArgs,
        access_type: AccessType,
        size: i64,
        parameters: &[(String, String)],
        deadline: Duration,
        json: bool,
    ) -> Common {
        Common {
            driver: driver.clone(),
            access_type,
            size,
            fs_type: String::new(),
            parameters: parameters.to_vec(),
            preload: 0,
            keep_preload: false,
            deadline,
            json,
        }
    }
}

#[derive(Debug, Args)]
pub struct LifecycleArgs {
    #[command(flatten)]
    pub common: Common,

    /// Number of full lifecycle cycles (one fresh volume each).
    #[arg(long, default_value_t = 100)]
    pub volumes: usize,

    /// Concurrent clients, each running whole cycles over distinct volumes.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub concurrency: u32,
}

#[derive(Debug, Args)]
pub struct StartupArgs {
    #[command(flatten)]
    pub common: Common,

    /// Measured restarts.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub runs: u32,
}

#[derive(Debug, Args)]
pub struct BlockIoArgs {
    #[command(flatten)]
    pub driver: DriverArgs,

    /// Requested capacity of the volume, in bytes; the plain file gets the same size.
    #[arg(long, default_value_t = 1 << 30)]
    pub size: i64,

    /// A CreateVolume parameter (StorageClass parameter), KEY=VALUE; repeatable.
    #[arg(long = "parameter", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub parameters: Vec<(String, String)>,

    /// How long each case runs, on the device and again on the plain file.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub runtime: Duration,

    /// Where the plain file is made (it must be on the same filesystem as the volume's data to
    /// compare like with like). Default: the parent of the pool directory that holds the loop
    /// device's backing file (`<data dir>/..` for stickyvol), refused if it is on another
    /// filesystem.
    #[arg(long, value_name = "DIR")]
    pub plain_file_dir: Option<PathBuf>,

    /// Deadline of every gRPC call.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub deadline: Duration,

    /// Print the report as JSON (stable field names) instead of a table.
    #[arg(long)]
    pub json: bool,
}

impl BlockIoArgs {
    /// The shared flags, for the session and volume code of the other workloads.
    pub fn common(&self) -> Common {
        Common::without_preload(
            &self.driver,
            AccessType::Block,
            self.size,
            &self.parameters,
            self.deadline,
            self.json,
        )
    }
}

#[derive(Debug, Args)]
pub struct FsIoArgs {
    #[command(flatten)]
    pub driver: DriverArgs,

    /// Size of the file in each volume, in bytes (the volumes get room for their metadata).
    #[arg(long, default_value_t = 256 << 20)]
    pub size: i64,

    /// fsType of the volume with a filesystem of its own.
    #[arg(long, default_value = "ext4")]
    pub fs_type: String,

    /// A CreateVolume parameter (StorageClass parameter), KEY=VALUE; repeatable.
    #[arg(long = "parameter", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub parameters: Vec<(String, String)>,

    /// How long each case runs, on each side.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub runtime: Duration,

    /// Deadline of every gRPC call.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub deadline: Duration,

    /// Print the report as JSON (stable field names) instead of a table.
    #[arg(long)]
    pub json: bool,
}

impl FsIoArgs {
    /// The shared flags, for volumes of `volume_bytes` (the fsType is set per volume).
    pub fn common(&self, volume_bytes: i64) -> Common {
        Common::without_preload(
            &self.driver,
            AccessType::Mount,
            volume_bytes,
            &self.parameters,
            self.deadline,
            self.json,
        )
    }
}

#[derive(Debug, Args)]
pub struct IoLimitsArgs {
    #[command(flatten)]
    pub driver: DriverArgs,

    /// Bytes each writer writes over: the first of its block volume, or a file of this size in
    /// its image volume (which gets room for its metadata).
    #[arg(long, default_value_t = 256 << 20)]
    pub size: u64,

    /// The kinds of volume measured, in order (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [LimitedKind::Block, LimitedKind::Image])]
    pub kinds: Vec<LimitedKind>,

    /// fsType of the image volumes.
    #[arg(long, default_value = "ext4")]
    pub fs_type: String,

    /// A CreateVolume parameter (StorageClass parameter) of every volume, KEY=VALUE; repeatable.
    #[arg(long = "parameter", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub parameters: Vec<(String, String)>,

    /// `writeIOPS` of the limited volume's class when it is created.
    #[arg(long, default_value_t = 200)]
    pub write_iops: u64,

    /// `writeIOPS` of the class it is changed to on the running pod.
    #[arg(long, default_value_t = 400)]
    pub changed_write_iops: u64,

    /// How far above its limit the limited volume may write (0.05: 210 for 200).
    #[arg(long, default_value_t = 0.05)]
    pub limit_slack: f64,

    /// The share of its rate alone the neighbour must keep beside the limited volume.
    #[arg(long, default_value_t = 0.9)]
    pub neighbour_share: f64,

    /// How long each run of writes lasts.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub runtime: Duration,

    /// Where the host's cgroup filesystem is (the driver's --cgroup-root): the pods' cgroups
    /// are made below it, in a directory of the run.
    #[arg(long, default_value = "/sys/fs/cgroup")]
    pub cgroup_root: PathBuf,

    /// Deadline of every gRPC call.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub deadline: Duration,

    /// Print the report as JSON (stable field names) instead of a table.
    #[arg(long)]
    pub json: bool,
}

impl IoLimitsArgs {
    /// The shared flags: volumes with room for a `--size` file and an image's metadata.
    pub fn common(&self) -> Common {
        let size = self.size as i64;
        Common::without_preload(
            &self.driver,
            AccessType::Block,
            size + size / 4 + (64 << 20),
            &self.parameters,
            self.deadline,
            self.json,
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LimitedKind {
    /// A block volume (its loop device published).
    Block,
    /// An image volume (a filesystem of --fs-type on its loop device).
    Image,
}

impl LimitedKind {
    pub fn name(self) -> &'static str {
        match self {
            LimitedKind::Block => "block",
            LimitedKind::Image => "image",
        }
    }

    pub fn access(self) -> AccessType {
        match self {
            LimitedKind::Block => AccessType::Block,
            LimitedKind::Image => AccessType::Mount,
        }
    }
}

#[derive(Debug, Args)]
pub struct GroupSnapshotArgs {
    #[command(flatten)]
    pub driver: DriverArgs,

    /// Volumes in each group.
    #[arg(long, default_value_t = 4)]
    pub members: usize,

    /// Group snapshots cut.
    #[arg(long, default_value_t = 50)]
    pub cuts: usize,

    /// Requested capacity of each volume, in bytes (XFS's smallest by default).
    #[arg(long, default_value_t = 300 << 20)]
    pub size: i64,

    /// fsType of the volumes (stickyvol: image volumes; empty: the driver's default).
    #[arg(long, default_value = "xfs")]
    pub fs_type: String,

    /// A CreateVolume parameter (StorageClass parameter) of every volume, KEY=VALUE; repeatable.
    #[arg(long = "parameter", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub parameters: Vec<(String, String)>,

    /// Deadline of every gRPC call.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub deadline: Duration,

    /// Print the report as JSON (stable field names) instead of a table.
    #[arg(long)]
    pub json: bool,
}

impl GroupSnapshotArgs {
    pub fn common(&self) -> Common {
        let mut common = Common::without_preload(
            &self.driver,
            AccessType::Mount,
            self.size,
            &self.parameters,
            self.deadline,
            self.json,
        );
        common.fs_type = self.fs_type.clone();
        common
    }
}

#[derive(Debug, Args)]
pub struct IoWriterArgs {
    /// The `cgroup.procs` this process joins before anything else.
    #[arg(long)]
    pub cgroup_procs: PathBuf,

    /// The block device or file written.
    #[arg(long)]
    pub path: PathBuf,

    /// Bytes written over, from the start.
    #[arg(long)]
    pub size: u64,

    #[arg(long, value_parser = parse_duration)]
    pub runtime: Duration,
}

#[derive(Debug, Args)]
pub struct StatsFloodArgs {
    #[command(flatten)]
    pub driver: DriverArgs,

    /// Empty files made in the volume before the flood (in directories of 1,000).
    #[arg(long, default_value_t = 100_000)]
    pub files: usize,

    /// Clients calling NodeGetVolumeStats back to back.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub callers: u64,

    /// How long the flood lasts.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub runtime: Duration,

    /// Time between two Probe calls, before and during the flood.
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    pub probe_interval: Duration,

    /// Requested capacity of each of the two volumes, in bytes.
    #[arg(long, default_value_t = 1 << 30)]
    pub size: i64,

    /// A CreateVolume parameter (StorageClass parameter), KEY=VALUE; repeatable.
    #[arg(long = "parameter", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub parameters: Vec<(String, String)>,

    /// Deadline of every gRPC call.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub deadline: Duration,

    /// Print the report as JSON (stable field names) instead of a table.
    #[arg(long)]
    pub json: bool,
}

impl StatsFloodArgs {
    /// The shared flags, for the session and volume code of the other workloads.
    pub fn common(&self) -> Common {
        Common::without_preload(
            &self.driver,
            AccessType::Mount,
            self.size,
            &self.parameters,
            self.deadline,
            self.json,
        )
    }
}

#[derive(Debug, Args)]
pub struct HousekeepingArgs {
    #[command(flatten)]
    pub driver: DriverArgs,

    /// The driver's metrics endpoint, HOST:PORT (its --metrics-address): GET /metrics once a
    /// round. Not scraped when not given.
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_address: Option<String>,

    /// How long the rounds go on.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub runtime: Duration,

    /// Pause between two rounds (the sidecars' own periods are seconds to a minute).
    #[arg(long, default_value = "10ms", value_parser = parse_duration)]
    pub interval: Duration,

    /// A GetCapacity parameter (StorageClass parameter), KEY=VALUE; repeatable.
    #[arg(long = "parameter", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub parameters: Vec<(String, String)>,

    /// Deadline of every gRPC call and of every scrape.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub deadline: Duration,

    /// Print the report as JSON (stable field names) instead of a table.
    #[arg(long)]
    pub json: bool,
}

impl HousekeepingArgs {
    /// The shared flags (no volume is made: the size is not used).
    pub fn common(&self) -> Common {
        Common::without_preload(
            &self.driver,
            AccessType::Mount,
            0,
            &self.parameters,
            self.deadline,
            self.json,
        )
    }
}

#[derive(Debug, Args)]
pub struct GuardArgs {
    /// The candidate: --driver-cmd starts it (required), and --endpoint and --kubelet-dir are
    /// the reference's too.
    #[command(flatten)]
    pub driver: DriverArgs,

    /// Start the reference build with this shell command (run by `sh -c`): the same socket and
    /// kubelet directory as --driver-cmd, another binary (and its own data directory).
    #[arg(long, value_name = "COMMAND")]
    pub reference_cmd: String,

    /// A directory on the filesystem the driver keeps its data and state on: one fdatasync and
    /// one bind mount and unmount are timed there each round, for the reader (what this
    /// machine charges for what the calls cannot avoid).
    #[arg(long)]
    pub floor_dir: PathBuf,

    /// Rounds, each running both builds, each started afresh; a figure is the median over
    /// rounds.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=50))]
    pub rounds: u32,

    /// Volume cycles per build and round.
    #[arg(long, default_value_t = 300)]
    pub volumes: usize,

    /// Requested capacity of each volume, in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    pub size: i64,

    /// How far behind the reference a figure may fall (0.25: 25% slower) before the guard fails.
    #[arg(long, default_value_t = 0.25)]
    pub tolerance: f64,

    /// Deadline of every gRPC call.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub deadline: Duration,

    /// Print the report as JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

impl GuardArgs {
    /// One round's `lifecycle` flags for the build `command` starts: one client, no preload,
    /// mount volumes.
    pub fn lifecycle(&self, command: &str) -> LifecycleArgs {
        let driver = DriverArgs {
            driver_cmd: Some(command.to_string()),
            driver_pid: None,
            ..self.driver.clone()
        };
        LifecycleArgs {
            common: Common::without_preload(
                &driver,
                AccessType::Mount,
                self.size,
                &[],
                self.deadline,
                self.json,
            ),
            volumes: self.volumes,
            concurrency: 1,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AccessType {
    Mount,
    Block,
}

impl AccessType {
    pub fn as_str(self) -> &'static str {
        match self {
            AccessType::Mount => "mount",
            AccessType::Block => "block",
        }
    }
}

fn parse_key_value(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{s:?} is not KEY=VALUE"))
}

/// `250ms`, `30s`, `2m` or a plain number of seconds.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let (number, unit) = match s.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(at) => s.split_at(at),
        None => (s, "s"),
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 250ms, 30s or 2m"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        _ => return Err(format!("{s:?}: unit must be ms, s or m")),
    };
    if !(seconds > 0.0 && seconds.is_finite()) {
        return Err(format!("{s:?} must be positive"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("5h").is_err());
    }

    #[test]
    fn flags_parse() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from([
            "stickyvol-bench",
            "lifecycle",
            "--endpoint",
            "unix:///x.sock",
            "--parameter",
            "a=b=c",
            "--concurrency",
            "4",
        ])
        .unwrap();
        let Workload::Lifecycle(args) = cli.workload else {
            panic!("lifecycle expected")
        };
        assert_eq!(args.common.parameters, [("a".into(), "b=c".into())]);
        assert_eq!(args.concurrency, 4);
    }
}
