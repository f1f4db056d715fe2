//! How the admin commands show volumes: an aligned table (`stickyvol volumes`), a `key: value`
//! block (`stickyvol volume show`), and JSON whose keys are the proto's field names (`--json`).
//! Everything here is pure: the same volumes always give the same text.

use serde::Serialize;

use crate::admin_api as api;

/// A byte count with binary units: `0`, `512`, `1.0Ki`, `9.5Gi`, `512Mi`, `100Gi`. Below 10 of
/// a unit one decimal is shown, from 10 on none, so a size is never wider than 6 characters
/// (`1023Mi`); a figure that would round to 1024 moves to the next unit.
pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    if bytes < 1024 {
        return bytes.to_string();
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    // One decimal below 10 (9.95 and up would print as "10.0": show "10" instead).
    if value < 9.95 {
        return format!("{value:.1}{}", UNITS[unit]);
    }
    let rounded = value.round();
    if rounded >= 1024.0 && unit + 1 < UNITS.len() {
        return format!("{:.1}{}", rounded / 1024.0, UNITS[unit + 1]);
    }
    format!("{rounded:.0}{}", UNITS[unit])
}

/// [`human_size`] of a proto `int64` size; a negative one (never sent) shows as 0.
fn human_size_signed(bytes: i64) -> String {
    human_size(u64::try_from(bytes).unwrap_or(0))
}

/// Milliseconds since the Unix epoch as RFC 3339 in UTC with milliseconds,
/// e.g. `2023-11-14T22:13:20.123Z`.
pub fn rfc3339_utc(unix_ms: u64) -> String {
    const MS_PER_DAY: u64 = 86_400_000;
    // Any 400 consecutive Gregorian years hold exactly 146 097 days.
    const DAYS_PER_400_YEARS: u64 = 146_097;
    let ms_of_day = unix_ms % MS_PER_DAY;
    let mut days = unix_ms / MS_PER_DAY;
    let mut year = 1970 + 400 * (days / DAYS_PER_400_YEARS);
    days %= DAYS_PER_400_YEARS;
    loop {
        let length = if is_leap_year(year) { 366 } else { 365 };
        if days < length {
            break;
        }
        days -= length;
        year += 1;
    }
    let february = if is_leap_year(year) { 29 } else { 28 };
    let month_lengths = [31, february, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    let mut month = 1;
    for length in month_lengths {
        if days < length {
            break;
        }
        days -= length;
        month += 1;
    }
    let day = days + 1;
    let (hour, minute, second, millis) = (
        ms_of_day / 3_600_000,
        ms_of_day / 60_000 % 60,
        ms_of_day / 1000 % 60,
        ms_of_day % 1000,
    );
    format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}.{millis:03}Z")
}

fn is_leap_year(year: u64) -> bool {
    year.is_multiple_of(4) && (!year.is_multiple_of(100) || year.is_multiple_of(400))
}

/// A creation time for people: RFC 3339, or `-` when the driver did not know it (0).
fn created(unix_ms: u64) -> String {
    if unix_ms == 0 {
        "-".into()
    } else {
        rfc3339_utc(unix_ms)
    }
}

/// `namespace/name`, the name alone without a namespace, `-` when the claim is not known.
pub fn pvc(volume: &api::Volume) -> String {
    match (volume.pvc_namespace.as_str(), volume.pvc_name.as_str()) {
        (_, "") => "-".into(),
        ("", name) => name.into(),
        (namespace, name) => format!("{namespace}/{name}"),
    }
}

fn short_access_type(access_type: &str) -> &str {
    match access_type {
        "filesystem" => "fs",
        "" => "-",
        other => other,
    }
}

fn status(volume: &api::Volume) -> &'static str {
    if volume.orphaned {
        "orphaned"
    } else if volume.abnormal {
        "abnormal"
    } else {
        "ok"
    }
}

fn or_dash(text: &str) -> &str {
    if text.is_empty() { "-" } else { text }
}

/// Volumes sorted by id: ids start with their creation time, so this is creation order, and
/// the output does not depend on the order the driver happened to answer in.
pub fn sorted(mut volumes: Vec<api::Volume>) -> Vec<api::Volume> {
    volumes.sort_by(|a, b| a.volume_id.cmp(&b.volume_id));
    volumes
}

/// The table of `stickyvol volumes`: a header and one row per volume, columns separated by at
/// least two spaces, numbers right-aligned, the host path last (it is the widest). The PV name
/// is left out (it is usually the volume's name; `volume show` and `--json` have it).
pub fn table(volumes: &[api::Volume]) -> String {
    const HEADER: [&str; 11] = [
        "VOLUME",
        "PVC",
        "POOL",
        "TYPE",
        "SIZE",
        "USED",
        "LIMIT",
        "STATUS",
        "PODS",
        "SNAPSHOTS",
        "PATH",
    ];
    // Which columns hold numbers (right-aligned).
    const RIGHT: [bool; 11] = [
        false, false, false, false, true, true, false, false, true, true, false,
    ];
    let rows: Vec<[String; 11]> = volumes
        .iter()
        .map(|v| {
            [
                v.volume_id.clone(),
                pvc(v),
                or_dash(&v.pool).to_string(),
                short_access_type(&v.access_type).to_string(),
                human_size_signed(v.capacity_bytes),
                v.used_bytes.map_or_else(|| "-".to_string(), human_size),
                or_dash(&v.enforcement).to_string(),
                status(v).to_string(),
                v.publications
                    .iter()
                    .filter(|p| !p.staging)
                    .count()
                    .to_string(),
                v.snapshots.len().to_string(),
                or_dash(&v.host_path).to_string(),
            ]
        })
        .collect();
    let mut widths = HEADER.map(|h| h.chars().count());
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header = HEADER.map(String::from);
    for row in std::iter::once(&header).chain(&rows) {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            let pad = widths[i] - cell.chars().count();
            if RIGHT[i] {
                line.extend(std::iter::repeat_n(' ', pad));
                line.push_str(cell);
            } else if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(cell);
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// What `stickyvol volume show` prints: every field, one per line, values aligned; the
/// publications and snapshots as indented lists.
pub fn details(v: &api::Volume) -> String {
    let top = volume_fields(v);
    // The snapshots' count comes after the publications' list but aligns with the fields above.
    let snapshots = ("snapshots", count_or_none(v.snapshots.len()));
    let width = key_width(top.iter().chain(std::iter::once(&snapshots)));
    let mut out = String::new();
    for (key, value) in &top {
        key_value_line(&mut out, "", key, value, width);
    }
    for p in &v.publications {
        list_item(&mut out, &publication_fields(p));
    }
    key_value_line(&mut out, "", snapshots.0, &snapshots.1, width);
    for s in &v.snapshots {
        list_item(&mut out, &snapshot_fields(s));
    }
    out
}

/// The volume's own fields in `details`, down to the publications' count.
fn volume_fields(v: &api::Volume) -> Vec<(&'static str, String)> {
    vec![
        ("volume", v.volume_id.clone()),
        ("name", or_dash(&v.name).into()),
        ("pv", or_dash(&v.pv_name).into()),
        ("pvc", pvc(v)),
        ("pool", or_dash(&v.pool).into()),
        ("type", or_dash(&v.access_type).into()),
        (
            "size",
            size_line(u64::try_from(v.capacity_bytes).unwrap_or(0)),
        ),
        (
            "used",
            v.used_bytes
                .map_or_else(|| "- (not known without a walk)".into(), size_line),
        ),
        ("limit", or_dash(&v.enforcement).into()),
        (
            "access modes",
            if v.access_modes.is_empty() {
                "-".into()
            } else {
                v.access_modes.join(", ")
            },
        ),
        ("created", created(v.created_unix_ms)),
        ("content source", or_dash(&v.content_source).into()),
        ("host path", or_dash(&v.host_path).into()),
        ("status", status(v).into()),
        ("condition", or_dash(&v.condition).into()),
        ("publications", count_or_none(v.publications.len())),
    ]
}

/// One publication's list item in `details`: the staging mount or the pod, its target, and
/// the device where it is a block volume.
fn publication_fields(p: &api::Publication) -> Vec<(&'static str, String)> {
    let mut fields = vec![
        match p.staging {
            true => (
                "staged",
                "the node's mount, which pods' targets bind".to_string(),
            ),
            false => ("pod", or_dash(&p.pod_uid).to_string()),
        },
        ("target", p.target_path.clone()),
        ("readonly", yes_no(p.readonly).into()),
    ];
    if !p.device.is_empty() {
        fields.push(("device", p.device.clone()));
    }
    fields
}

/// One snapshot's list item in `details`, its error only where it has one.
fn snapshot_fields(s: &api::Snapshot) -> Vec<(&'static str, String)> {
    let mut fields = vec![
        ("id", s.snapshot_id.clone()),
        ("name", or_dash(&s.name).into()),
        ("size", size_line(u64::try_from(s.size_bytes).unwrap_or(0))),
        ("ready", yes_no(s.ready).into()),
        ("created", created(s.created_unix_ms)),
    ];
    if !s.error.is_empty() {
        fields.push(("error", s.error.clone()));
    }
    fields
}

fn size_line(bytes: u64) -> String {
    format!("{} ({bytes} bytes)", human_size(bytes))
}

fn yes_no(flag: bool) -> &'static str {
    if flag { "yes" } else { "no" }
}

fn count_or_none(count: usize) -> String {
    if count == 0 {
        "none".into()
    } else {
        count.to_string()
    }
}

/// The width of the widest `key:`.
fn key_width<'a>(fields: impl Iterator<Item = &'a (&'a str, String)>) -> usize {
    fields
        .map(|(key, _)| key.chars().count() + 1)
        .max()
        .unwrap_or(0)
}

fn key_value_line(out: &mut String, indent: &str, key: &str, value: &str, width: usize) {
    let key = format!("{key}:");
    let line = format!("{indent}{key:<width$} {value}");
    out.push_str(line.trim_end());
    out.push('\n');
}

/// One element of a list in [`details`]: `  - key: value`, then `    key: value` lines.
fn list_item(out: &mut String, fields: &[(&str, String)]) {
    let width = key_width(fields.iter());
    for (i, (key, value)) in fields.iter().enumerate() {
        let indent = if i == 0 { "  - " } else { "    " };
        key_value_line(out, indent, key, value, width);
    }
}

/// A volume as `--json` shows it: the proto's field names and order, sizes as integers,
/// `used_bytes` null when unknown.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VolumeJson {
    pub volume_id: String,
    pub name: String,
    pub pv_name: String,
    pub pvc_namespace: String,
    pub pvc_name: String,
    pub pool: String,
    pub access_type: String,
    pub capacity_bytes: i64,
    pub used_bytes: Option<u64>,
    pub enforcement: String,
    pub abnormal: bool,
    pub condition: String,
    pub publications: Vec<PublicationJson>,
    pub snapshots: Vec<SnapshotJson>,
    pub host_path: String,
    pub access_modes: Vec<String>,
    pub created_unix_ms: u64,
    pub content_source: String,
    pub orphaned: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PublicationJson {
    pub target_path: String,
    pub pod_uid: String,
    pub readonly: bool,
    pub device: String,
    /// An image volume's staging mount rather than a pod's target.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub staging: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SnapshotJson {
    pub snapshot_id: String,
    pub name: String,
    pub size_bytes: i64,
    pub ready: bool,
    pub created_unix_ms: u64,
    /// Why its copy stopped (see `SnapshotRecord::copy_stopped`); absent otherwise.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub error: String,
}

impl From<&api::Volume> for VolumeJson {
    fn from(v: &api::Volume) -> Self {
        VolumeJson {
            volume_id: v.volume_id.clone(),
            name: v.name.clone(),
            pv_name: v.pv_name.clone(),
            pvc_namespace: v.pvc_namespace.clone(),
            pvc_name: v.pvc_name.clone(),
            pool: v.pool.clone(),
            access_type: v.access_type.clone(),
            capacity_bytes: v.capacity_bytes,
            used_bytes: v.used_bytes,
            enforcement: v.enforcement.clone(),
            abnormal: v.abnormal,
            condition: v.condition.clone(),
            publications: v
                .publications
                .iter()
                .map(|p| PublicationJson {
                    target_path: p.target_path.clone(),
                    pod_uid: p.pod_uid.clone(),
                    readonly: p.readonly,
                    device: p.device.clone(),
                    staging: p.staging,
                })
                .collect(),
            snapshots: v
                .snapshots
                .iter()
                .map(|s| SnapshotJson {
                    snapshot_id: s.snapshot_id.clone(),
                    name: s.name.clone(),
                    size_bytes: s.size_bytes,
                    ready: s.ready,
                    created_unix_ms: s.created_unix_ms,
                    error: s.error.clone(),
                })
                .collect(),
            host_path: v.host_path.clone(),
            access_modes: v.access_modes.clone(),
            created_unix_ms: v.created_unix_ms,
            content_source: v.content_source.clone(),
            orphaned: v.orphaned,
        }
    }
}

/// `stickyvol volumes --json`: a pretty-printed array, newline-terminated.
pub fn volumes_json(volumes: &[api::Volume]) -> String {
    let views: Vec<VolumeJson> = volumes.iter().map(VolumeJson::from).collect();
    to_json(&views)
}

/// `stickyvol volume show --json`: the object `volumes --json` has for this volume.
pub fn volume_json(volume: &api::Volume) -> String {
    to_json(&VolumeJson::from(volume))
}

fn to_json(value: &impl Serialize) -> String {
    let mut text =
        serde_json::to_string_pretty(value).expect("plain structs always serialize to JSON");
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;
    const GIB: u64 = 1024 * MIB;

    #[test]
    fn sizes_use_binary_units() {
        let cases = [
            (0, "0"),
            (1, "1"),
            (1023, "1023"),
            (1024, "1.0Ki"),
            (1536, "1.5Ki"),
            (10 * 1024, "10Ki"),
            (4096, "4.0Ki"),
            (512 * MIB, "512Mi"),
            (1023 * MIB, "1023Mi"),
            (GIB - 1, "1.0Gi"),
            (GIB, "1.0Gi"),
            (GIB + GIB / 2, "1.5Gi"),
            (10 * GIB - GIB / 100, "10Gi"),
            (100 * GIB, "100Gi"),
            (1024 * GIB, "1.0Ti"),
            (u64::MAX, "16Ei"),
        ];
        for (bytes, text) in cases {
            assert_eq!(human_size(bytes), text, "{bytes}");
            assert!(human_size(bytes).len() <= 6, "{bytes}");
        }
        assert_eq!(human_size_signed(-5), "0");
    }

    #[test]
    fn timestamps_are_rfc3339_utc() {
        let cases = [
            (0, "1970-01-01T00:00:00.000Z"),
            (951_782_400_000, "2000-02-29T00:00:00.000Z"),
            (1_700_000_000_123, "2023-11-14T22:13:20.123Z"),
            (1_709_251_199_999, "2024-02-29T23:59:59.999Z"),
            (1_709_251_200_000, "2024-03-01T00:00:00.000Z"),
            (4_102_444_799_000, "2099-12-31T23:59:59.000Z"),
            (253_402_300_799_000, "9999-12-31T23:59:59.000Z"),
        ];
        for (ms, text) in cases {
            assert_eq!(rfc3339_utc(ms), text, "{ms}");
        }
    }

    fn volume(id: &str) -> api::Volume {
        api::Volume {
            volume_id: id.into(),
            name: format!("pvc-{id}"),
            pv_name: format!("pvc-{id}"),
            pvc_namespace: "default".into(),
            pvc_name: "data-web-0".into(),
            pool: "default".into(),
            access_type: "filesystem".into(),
            capacity_bytes: GIB as i64,
            used_bytes: Some(12 * MIB),
            enforcement: "btrfs-qgroup".into(),
            abnormal: false,
            condition: "volume is healthy".into(),
            publications: vec![api::Publication {
                target_path: "/var/lib/kubelet/pods/1234/volumes/kubernetes.io~csi/pvc/mount"
                    .into(),
                pod_uid: "1234".into(),
                readonly: false,
                device: String::new(),
                staging: false,
            }],
            snapshots: Vec::new(),
            host_path: format!("/data/volumes/{id}"),
            access_modes: vec!["SINGLE_NODE_WRITER".into()],
            created_unix_ms: 1_700_000_000_123,
            content_source: String::new(),
            orphaned: false,
        }
    }

    /// A block volume with nothing known about its claim or usage, two snapshots, abnormal.
    fn bare_block_volume(id: &str) -> api::Volume {
        api::Volume {
            volume_id: id.into(),
            name: "scratch".into(),
            pool: "fast".into(),
            access_type: "block".into(),
            capacity_bytes: (512 * MIB) as i64,
            used_bytes: None,
            enforcement: "file".into(),
            abnormal: true,
            condition: "the volume's image is missing".into(),
            snapshots: vec![
                api::Snapshot {
                    snapshot_id: "ss-1".into(),
                    name: "snap-1".into(),
                    size_bytes: (512 * MIB) as i64,
                    ready: true,
                    created_unix_ms: 951_782_400_000,
                    error: String::new(),
                },
                api::Snapshot {
                    snapshot_id: "ss-2".into(),
                    name: String::new(),
                    size_bytes: (512 * MIB) as i64,
                    ready: false,
                    created_unix_ms: 0,
                    error: "the copy stopped".into(),
                },
            ],
            host_path: format!("/mnt/fast/volumes/{id}.img"),
            content_source: "snapshot ss-0".into(),
            ..api::Volume::default()
        }
    }

    #[test]
    fn the_table_aligns_its_columns() {
        let text = table(&[volume("sv-a"), bare_block_volume("sv-bb")]);
        let expected = "\
VOLUME  PVC                 POOL     TYPE    SIZE  USED  LIMIT         STATUS    PODS  SNAPSHOTS  PATH
sv-a    default/data-web-0  default  fs     1.0Gi  12Mi  btrfs-qgroup  ok           1          0  /data/volumes/sv-a
sv-bb   -                   fast     block  512Mi     -  file          abnormal     0          2  /mnt/fast/volumes/sv-bb.img
";
        assert_eq!(text, expected, "\n{text}");
    }

    #[test]
    fn an_orphaned_volume_says_so_and_where_its_data_went() {
        let mut v = volume("sv-a");
        v.orphaned = true;
        v.abnormal = true;
        v.host_path = "/data/lost+found/sv-a".into();
        let row = table(&[v]).lines().nth(1).unwrap().to_string();
        assert!(row.contains(" orphaned "), "{row}");
        assert!(row.ends_with("/data/lost+found/sv-a"), "{row}");
    }

    #[test]
    fn an_empty_table_is_its_header() {
        assert_eq!(
            table(&[]),
            "VOLUME  PVC  POOL  TYPE  SIZE  USED  LIMIT  STATUS  PODS  SNAPSHOTS  PATH\n"
        );
    }

    #[test]
    fn a_claim_without_a_namespace_shows_its_name() {
        let mut v = volume("sv-a");
        v.pvc_namespace.clear();
        assert_eq!(pvc(&v), "data-web-0");
        v.pvc_name.clear();
        assert_eq!(pvc(&v), "-");
    }

    #[test]
    fn volumes_sort_by_id() {
        let ids: Vec<_> = sorted(vec![volume("sv-b"), volume("sv-a"), volume("sv-c")])
            .into_iter()
            .map(|v| v.volume_id)
            .collect();
        assert_eq!(ids, ["sv-a", "sv-b", "sv-c"]);
    }

    #[test]
    fn json_keys_are_the_proto_fields() {
        let value: serde_json::Value =
            serde_json::from_str(&volumes_json(&[volume("sv-a"), bare_block_volume("sv-b")]))
                .unwrap();
        let volumes = value.as_array().unwrap();
        assert_eq!(volumes.len(), 2);
        let keys: Vec<&str> = volumes[0]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        let mut expected = vec![
            "volume_id",
            "name",
            "pv_name",
            "pvc_namespace",
            "pvc_name",
            "pool",
            "access_type",
            "capacity_bytes",
            "used_bytes",
            "enforcement",
            "abnormal",
            "condition",
            "publications",
            "snapshots",
            "host_path",
            "access_modes",
            "created_unix_ms",
            "content_source",
            "orphaned",
        ];
        let mut keys = keys;
        keys.sort_unstable();
        expected.sort_unstable();
        assert_eq!(keys, expected);
        assert_eq!(volumes[0]["capacity_bytes"], serde_json::json!(GIB));
        assert_eq!(volumes[0]["used_bytes"], serde_json::json!(12 * MIB));
        assert_eq!(
            volumes[0]["publications"],
            serde_json::json!([{
                "target_path": "/var/lib/kubelet/pods/1234/volumes/kubernetes.io~csi/pvc/mount",
                "pod_uid": "1234",
                "readonly": false,
                "device": "",
            }])
        );
        assert_eq!(
            volumes[0]["access_modes"],
            serde_json::json!(["SINGLE_NODE_WRITER"])
        );
        assert!(volumes[1]["used_bytes"].is_null());
        assert_eq!(volumes[1]["pvc_name"], "");
        assert_eq!(
            volumes[1]["snapshots"][0],
            serde_json::json!({
                "snapshot_id": "ss-1",
                "name": "snap-1",
                "size_bytes": 512 * MIB,
                "ready": true,
                "created_unix_ms": 951_782_400_000u64,
            })
        );
        assert_eq!(volumes[1]["snapshots"][1]["error"], "the copy stopped");
        // `volume show --json` is one element of `volumes --json`.
        let one: serde_json::Value =
            serde_json::from_str(&volume_json(&bare_block_volume("sv-b"))).unwrap();
        assert_eq!(one, volumes[1]);
        assert_eq!(volumes_json(&[]), "[]\n");
    }

    #[test]
    fn details_show_every_field() {
        let text = details(&volume("sv-a"));
        let expected = "\
volume:         sv-a
name:           pvc-sv-a
pv:             pvc-sv-a
pvc:            default/data-web-0
pool:           default
type:           filesystem
size:           1.0Gi (1073741824 bytes)
used:           12Mi (12582912 bytes)
limit:          btrfs-qgroup
access modes:   SINGLE_NODE_WRITER
created:        2023-11-14T22:13:20.123Z
content source: -
host path:      /data/volumes/sv-a
status:         ok
condition:      volume is healthy
publications:   1
  - pod:      1234
    target:   /var/lib/kubelet/pods/1234/volumes/kubernetes.io~csi/pvc/mount
    readonly: no
snapshots:      none
";
        assert_eq!(text, expected, "\n{text}");

        let text = details(&bare_block_volume("sv-b"));
        for line in [
            "pv:             -\n",
            "pvc:            -\n",
            "used:           - (not known without a walk)\n",
            "content source: snapshot ss-0\n",
            "status:         abnormal\n",
            "condition:      the volume's image is missing\n",
            "publications:   none\n",
            "snapshots:      2\n  - id:      ss-1\n    name:    snap-1\n    \
             size:    512Mi (536870912 bytes)\n    ready:   yes\n    \
             created: 2000-02-29T00:00:00.000Z\n  - id:      ss-2\n    name:    -\n",
            "    ready:   no\n    created: -\n    error:   the copy stopped\n",
        ] {
            assert!(text.contains(line), "{line:?} missing from\n{text}");
        }
    }

    #[test]
    fn block_publications_name_their_device() {
        let mut v = bare_block_volume("sv-b");
        v.publications.push(api::Publication {
            target_path: "/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/publish/pv/uid"
                .into(),
            pod_uid: String::new(),
            readonly: true,
            device: "/dev/loop7".into(),
            staging: false,
        });
        let text = details(&v);
        assert!(
            text.contains(
                "publications:   1\n  - pod:      -\n    target:   \
                 /var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/publish/pv/uid\n    \
                 readonly: yes\n    device:   /dev/loop7\n"
            ),
            "\n{text}"
        );
    }

    #[test]
    fn an_image_volume_shows_its_staging_mount_apart_from_its_pods() {
        let mut v = bare_block_volume("sv-i");
        v.access_type = "image-ext4".into();
        let staging = "/var/lib/kubelet/plugins/kubernetes.io/csi/stickyvol.csi.io/h/globalmount";
        v.publications.push(api::Publication {
            target_path: staging.into(),
            pod_uid: String::new(),
            readonly: false,
            device: "/dev/loop3".into(),
            staging: true,
        });
        let text = details(&v);
        assert!(
            text.contains(&format!(
                "  - staged:   the node's mount, which pods' targets bind\n    target:   {staging}\n"
            )),
            "\n{text}"
        );
        let table = table(std::slice::from_ref(&v));
        let row = table.lines().nth(1).unwrap();
        assert!(row.contains("image-ext4"), "{table}");
        let json = serde_json::to_value(VolumeJson::from(&v)).unwrap();
        assert_eq!(json["publications"][0]["staging"], true);
    }
}
