//! Every stickyvol container in deploy/ can start: its command line, built as kubelet builds it,
//! is accepted by the binary's own parser and by the validation `serve` and `doctor` run before
//! they start. No cluster needed.
//!
//! For every container and init container of every manifest under deploy/kubernetes/ and
//! deploy/examples/ (of any kind: whatever holds `containers` is a pod spec) whose image is ours:
//! - the command line is `command` (or the Dockerfile's ENTRYPOINT), then `args` (or, without
//!   `command`, the Dockerfile's CMD), with `$(VAR)` expanded from the container's env as kubelet
//!   expands it; downward-API (fieldRef) values get plausible stand-ins, e.g. a node name;
//! - while clap parses it, the process environment holds the container's values of the
//!   variables the binary reads (flag fallbacks such as CSI_ENDPOINT), and RUST_LOG must be a
//!   valid filter;
//! - every path the command will use lies under one of the container's volumeMounts, or it
//!   would land in the container's own (here read-only) layer;
//! - metrics are served on one address (the pod's IP), not on every interface;
//! - the admin socket's directory is mounted into no other container of the pod (the sidecars
//!   share the CSI socket's directory, as root): not its volume, nor any volume of an
//!   overlapping host path;
//! - a `doctor` init container checks the paths the `serve` container of its pod will use.
//!
//! And the admission policy that holds each node to its own orphan report admits exactly the
//! report the driver writes (`nodeloss::report`): its name, label and owner.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use clap::{CommandFactory, Parser};
use serde::Deserialize;
use serde_yaml::Value;
use stickyvol::cli::{Cli, Command};
use stickyvol::config::{Config, DoctorConfig, PoolConfig};
use tracing_subscriber::EnvFilter;

/// Our image; a container whose image starts with this runs the stickyvol binary.
const IMAGE: &str = "ghcr.io/stickyvol/stickyvol";
const MANIFEST_DIRS: [&str; 2] = ["deploy/kubernetes", "deploy/examples"];
/// What kubelet gives `valueFrom.fieldRef.fieldPath: spec.nodeName`, in a form real node names
/// take (dots included); it must pass for a label value like any node name.
const NODE_NAME: &str = "worker-1.example.internal";

#[test]
fn every_stickyvol_container_in_deploy_parses_and_validates() {
    let image = Image::from_dockerfile();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in MANIFEST_DIRS {
        yaml_files(&root.join(dir), &mut files);
    }
    assert!(!files.is_empty(), "no manifests under {MANIFEST_DIRS:?}");
    let mut outcome = Outcome::default();
    for file in &files {
        let label = file.strip_prefix(root).unwrap().display().to_string();
        let text = fs::read_to_string(file).unwrap();
        outcome.extend(check_manifest(&label, &text, &image));
    }
    assert!(
        !outcome.checked.is_empty(),
        "no container in {MANIFEST_DIRS:?} runs {IMAGE}: nothing was checked"
    );
    assert!(
        outcome.failures.is_empty(),
        "stickyvol containers in deploy/ that would not start as intended:\n{}",
        outcome.failures.join("\n")
    );
    eprintln!("checked:\n  {}", outcome.checked.join("\n  "));
}

/// The image's OCI labels: version defaults to Cargo.toml's (the release `stickyvol --version`
/// names), and revision and source are set from build arguments; the build stage hands REVISION
/// to build.rs, so the binary names the same commit as the label.
#[test]
fn the_dockerfile_labels_the_image_with_its_version_revision_and_source() {
    let dockerfile =
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Dockerfile")).unwrap();
    let version = format!("ARG VERSION={}", env!("CARGO_PKG_VERSION"));
    assert!(
        dockerfile.lines().any(|line| line == version),
        "the Dockerfile has no `{version}`"
    );
    for label in [
        r#"org.opencontainers.image.version="$VERSION""#,
        r#"org.opencontainers.image.revision="$REVISION""#,
        r#"org.opencontainers.image.source="$SOURCE""#,
    ] {
        assert!(
            dockerfile.contains(label),
            "the Dockerfile has no label {label}"
        );
    }
    assert!(
        dockerfile.contains(r#"STICKYVOL_REVISION="$REVISION" cargo build"#),
        "the build stage does not pass REVISION to build.rs"
    );
}

/// deploy/kubernetes/rbac-node.yaml's ValidatingAdmissionPolicy and `report::config_map` must
/// agree, or every node's report is refused (or, worse, a wider name is let through).
#[test]
fn the_report_policy_expects_the_report_the_driver_writes() {
    use stickyvol::cluster::node::nodeloss::report;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = fs::read_to_string(root.join("deploy/kubernetes/rbac-node.yaml")).unwrap();
    let policy = serde_yaml::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap())
        .find(|doc| {
            doc["kind"].as_str() == Some("ValidatingAdmissionPolicy")
                && doc["metadata"]["name"].as_str() == Some("stickyvol-orphan-report")
        })
        .expect("the report policy is in deploy/kubernetes/rbac-node.yaml");
    let spec = &policy["spec"];
    let variable = |name: &str| {
        spec["variables"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|v| v["name"].as_str() == Some(name))
            .and_then(|v| v["expression"].as_str())
            .unwrap_or_else(|| panic!("no variable {name}"))
            .to_string()
    };
    let driver = "stickyvol.csi.io";
    let name = report::name(driver, NODE_NAME).unwrap();
    let prefix = name.strip_suffix(NODE_NAME).unwrap();
    assert_eq!(
        variable("report"),
        format!("'{prefix}' + variables.node"),
        "the policy's report name is report::name's"
    );
    assert!(variable("node").contains("'authentication.kubernetes.io/node-name'"));
    let checks: String = spec["validations"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(|v| v["expression"].as_str())
        .collect();
    let written = report::config_map(driver, NODE_NAME, Some("uid-1"), &[]).unwrap();
    let labels = written.metadata.labels.unwrap();
    assert_eq!(labels.len(), 1);
    for (key, value) in labels {
        assert_eq!(key, report::LABEL);
        assert!(
            checks.contains(&format!("labels['{key}'] == '{value}'")),
            "the policy expects the label {key}={value}: {checks}"
        );
    }
    assert!(written.data.unwrap().contains_key("node"));
    assert!(checks.contains("object.data['node'] == variables.node"));
    let owner = &written.metadata.owner_references.unwrap()[0];
    assert_eq!(
        (owner.api_version.as_str(), owner.kind.as_str()),
        ("v1", "Node")
    );
    assert!(
        checks.contains("r.apiVersion == 'v1' && r.kind == 'Node' && r.name == variables.node")
    );
}

/// The checker itself: a good pod passes, and each kind of mistake it exists to catch fails,
/// naming the file and the container.
#[test]
fn the_checker_catches_what_would_keep_a_container_from_starting() {
    let image = Image::from_dockerfile();
    let good = pod(
        "- --run-dir=/run/stickyvol",
        "- --run-dir=/run/stickyvol",
        "",
    );
    let outcome = check_manifest("good.yaml", &good, &image);
    assert_eq!(outcome.failures, Vec::<String>::new());
    assert_eq!(
        outcome.checked,
        [
            "good.yaml: DaemonSet node, init container doctor",
            "good.yaml: DaemonSet node, container stickyvol"
        ]
    );

    let cases = [
        (
            "a flag the subcommand does not take",
            pod("- --run-dir=/run/stickyvol", "- --no-such-flag", ""),
            "container stickyvol",
            "unexpected argument '--no-such-flag'",
        ),
        (
            "a reference to an env var the container lacks, kept as written",
            pod("", "", "").replace("$(NODE_NAME)", "$(NODE)"),
            "container stickyvol",
            "--node-id \"$(NODE)\" is not a valid label value",
        ),
        (
            "a bad value in an env var the binary reads",
            pod("", "", "- {name: CSI_ENDPOINT, value: /csi/csi.sock}"),
            "container stickyvol",
            "--endpoint must be a unix socket URL",
        ),
        (
            "a path no volume is mounted at",
            pod("- --run-dir=/var/run/x", "- --run-dir=/var/run/x", ""),
            "init container doctor",
            "uses /var/run/x, which no volumeMount holds",
        ),
        (
            "doctor checking other paths than serve uses",
            pod("", "- --run-dir=/run/stickyvol", ""),
            "init container doctor",
            "doctor checks run dir None; serve uses Some(\"/run/stickyvol\")",
        ),
        (
            "metrics on every interface",
            pod("", "- --metrics-address=0.0.0.0:8080", ""),
            "container stickyvol",
            "serves metrics on every interface (0.0.0.0:8080)",
        ),
        (
            "a sidecar mounting the admin socket's directory",
            pod("", "", "").replace(
                "- {name: socket-dir, mountPath: /csi}\n      volumes:",
                "- {name: socket-dir, mountPath: /csi}\n            \
                 - {name: admin-dir, mountPath: /admin}\n      volumes:",
            ),
            "container stickyvol",
            "in volume admin-dir, and container sidecar mounts admin-dir",
        ),
        (
            "a sidecar mounting a host directory that holds the admin socket's",
            pod("", "", "").replace(
                "- {name: socket-dir, mountPath: /csi}\n      volumes:",
                "- {name: socket-dir, mountPath: /csi}\n            \
                 - {name: host-run, mountPath: /host-run}\n      volumes:",
            ),
            "container stickyvol",
            "container sidecar mounts host-run",
        ),
        (
            "the admin socket where the sidecars share the CSI socket",
            pod(
                "",
                "",
                "- {name: ADMIN_SOCKET, value: /csi/admin/admin.sock}",
            ),
            "container stickyvol",
            "/csi/admin/admin.sock is in volume socket-dir, and container",
        ),
        (
            "an admin socket no volume holds",
            pod("", "", "- {name: ADMIN_SOCKET, value: /var/run/admin.sock}"),
            "container stickyvol",
            "uses /var/run, which no volumeMount holds",
        ),
        (
            "an invalid RUST_LOG",
            pod("", "", "- {name: RUST_LOG, value: \"info,[\"}"),
            "container stickyvol",
            "RUST_LOG \"info,[\" is not a valid filter",
        ),
    ];
    for (what, manifest, container, expected) in cases {
        let outcome = check_manifest("bad.yaml", &manifest, &image);
        let label = format!("bad.yaml: DaemonSet node, {container}: ");
        assert!(
            outcome
                .failures
                .iter()
                .any(|f| f.starts_with(&label) && f.contains(expected)),
            "{what}: no failure of {label:?} mentions {expected:?}; failures: {:#?}",
            outcome.failures
        );
    }
}

/// Cases from kubelet's own tests of its expansion (third_party/forked/golang/expansion).
#[test]
fn expansion_follows_kubelet() {
    let env: BTreeMap<String, String> = [("VAR_A", "A"), ("VAR_B", "B"), ("EMPTY", "")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    for (input, expected) in [
        ("$(VAR_A)", "A"),
        ("___$(VAR_B)___", "___B___"),
        ("$(VAR_A)-$(VAR_B)", "A-B"),
        ("$(EMPTY)x", "x"),
        ("$(UNDEFINED)", "$(UNDEFINED)"),
        ("$$(VAR_A)", "$(VAR_A)"),
        ("$$$(VAR_A)", "$A"),
        ("$(VAR_A", "$(VAR_A"),
        ("$VAR_A", "$VAR_A"),
        ("$", "$"),
        ("a$", "a$"),
        ("$()", "$()"),
    ] {
        assert_eq!(expand(input, &env), expected, "{input:?}");
    }
}

/// A DaemonSet with a doctor init container and a serve container, their extra args and the
/// serve container's extra env entries given as YAML list items.
fn pod(doctor_args: &str, serve_args: &str, serve_env: &str) -> String {
    let indent = |items: &str, by: usize| items.replace('\n', &format!("\n{}", " ".repeat(by)));
    format!(
        r#"
apiVersion: apps/v1
kind: DaemonSet
metadata: {{name: node, namespace: stickyvol}}
spec:
  template:
    spec:
      initContainers:
        - name: doctor
          image: ghcr.io/stickyvol/stickyvol:0.1.0
          args:
            - doctor
            - --kubelet-dir=/var/lib/kubelet
            {doctor_args}
          volumeMounts:
            - {{name: kubelet-dir, mountPath: /var/lib/kubelet}}
            - {{name: run-dir, mountPath: /run/stickyvol}}
      containers:
        - name: stickyvol
          image: ghcr.io/stickyvol/stickyvol:0.1.0
          args:
            - serve
            - --node-id=$(NODE_NAME)
            {serve_args}
          env:
            - name: CSI_ENDPOINT
              value: unix:///csi/csi.sock
            - name: NODE_NAME
              valueFrom: {{fieldRef: {{fieldPath: spec.nodeName}}}}
            {serve_env}
          volumeMounts:
            - {{name: socket-dir, mountPath: /csi}}
            - {{name: kubelet-dir, mountPath: /var/lib/kubelet}}
            - {{name: run-dir, mountPath: /run/stickyvol}}
            - {{name: admin-dir, mountPath: /run/stickyvol-admin}}
        - name: sidecar
          image: registry.k8s.io/sig-storage/livenessprobe:v2.19.0
          args: [--not-ours]
          volumeMounts:
            - {{name: socket-dir, mountPath: /csi}}
      volumes:
        - {{name: socket-dir, hostPath: {{path: /var/lib/kubelet/plugins/x}}}}
        - {{name: kubelet-dir, hostPath: {{path: /var/lib/kubelet}}}}
        - {{name: run-dir, hostPath: {{path: /run/stickyvol}}}}
        - {{name: admin-dir, hostPath: {{path: /run/stickyvol-admin}}}}
        - {{name: host-run, hostPath: {{path: /run}}}}
"#,
        doctor_args = indent(doctor_args, 12),
        serve_args = indent(serve_args, 12),
        serve_env = indent(serve_env, 12),
    )
}

/// What checking found: the containers checked (file, object, container) and every failure.
#[derive(Debug, Default)]
struct Outcome {
    checked: Vec<String>,
    failures: Vec<String>,
}

impl Outcome {
    fn extend(&mut self, other: Outcome) {
        self.checked.extend(other.checked);
        self.failures.extend(other.failures);
    }
}

/// Checks every stickyvol container of every pod spec in one file (all its YAML documents).
fn check_manifest(file: &str, text: &str, image: &Image) -> Outcome {
    let mut outcome = Outcome::default();
    for document in serde_yaml::Deserializer::from_str(text) {
        let document = Value::deserialize(document)
            .unwrap_or_else(|err| panic!("{file}: not valid YAML: {err}"));
        let object = Object::of(&document);
        let mut specs = Vec::new();
        pod_specs(&document, &mut specs);
        for spec in specs {
            check_pod(
                &format!("{file}: {} {}", object.kind, object.name),
                spec,
                &object,
                image,
                &mut outcome,
            );
        }
    }
    outcome
}

/// What a started container would run, after validation.
enum Started {
    Serve(Box<Config>),
    Doctor(DoctorConfig),
    Admin,
}

fn check_pod(label: &str, spec: &Value, object: &Object, image: &Image, outcome: &mut Outcome) {
    let mut doctors = Vec::new();
    let mut serves = Vec::new();
    for (key, role) in [
        ("initContainers", "init container"),
        ("containers", "container"),
    ] {
        for container in spec
            .get(key)
            .and_then(Value::as_sequence)
            .into_iter()
            .flatten()
        {
            let image_name = container.get("image").and_then(Value::as_str).unwrap_or("");
            if !image_name.starts_with(IMAGE) {
                continue;
            }
            let name = container.get("name").and_then(Value::as_str).unwrap_or("?");
            let label = format!("{label}, {role} {name}");
            outcome.checked.push(label.clone());
            let (started, paths) = match start(container, object, image) {
                Ok(started) => started,
                Err(why) => {
                    outcome.failures.push(format!("{label}: {why}"));
                    continue;
                }
            };
            if let Some(why) = unmounted(container, &paths) {
                outcome.failures.push(format!("{label}: {why}"));
            }
            if let Started::Serve(config) = &started
                && let Some(admin_socket) = &config.admin_socket
                && let Some(why) = admin_socket_shared(spec, container, admin_socket)
            {
                outcome.failures.push(format!("{label}: {why}"));
            }
            match started {
                Started::Serve(config) => serves.push((label, *config)),
                Started::Doctor(config) => doctors.push((label, config)),
                Started::Admin => {}
            }
        }
    }
    // The controller runs the node-loss reconciler, named in its Lease by its pod (the
    // downward API's stand-ins above), and nothing else does.
    for (serve_label, serve) in &serves {
        let runs = serve.node_loss.is_some();
        if runs != (serve.mode == stickyvol::config::Mode::Controller) {
            outcome.failures.push(format!(
                "{serve_label}: node-loss reconciler {} in mode {:?}",
                if runs { "on" } else { "off" },
                serve.mode
            ));
        }
    }
    // Doctor exists to check what serve will use: the same kubelet dir, pools and run dir.
    for (doctor_label, doctor) in &doctors {
        for (serve_label, serve) in serves.iter().filter(|(_, s)| s.mode.works_on_host()) {
            let serve_pools = pool_paths(&serve.pools);
            let doctor_pools = pool_paths(&doctor.pools);
            let differences = [
                (
                    "kubelet dir",
                    format!("{:?}", doctor.kubelet_dir),
                    format!("{:?}", serve.kubelet_dir),
                ),
                ("pools", doctor_pools, serve_pools),
                (
                    "run dir",
                    format!("{:?}", doctor.run_dir),
                    format!("{:?}", serve.run_dir),
                ),
            ];
            for (what, checked, used) in differences {
                if checked != used {
                    outcome.failures.push(format!(
                        "{doctor_label}: doctor checks {what} {checked}; serve uses {used} ({serve_label})"
                    ));
                }
            }
        }
    }
}

fn pool_paths(pools: &[PoolConfig]) -> String {
    let pairs: Vec<String> = pools
        .iter()
        .map(|p| {
            let optional = if p.optional { " (optional)" } else { "" };
            format!("{}={}{optional}", p.name, p.path.display())
        })
        .collect();
    pairs.join(",")
}

/// Parses and validates one container's command line as the binary would at its start; with
/// what it started, the paths it will use.
fn start(
    container: &Value,
    object: &Object,
    image: &Image,
) -> Result<(Started, Vec<PathBuf>), String> {
    let env = environment(container, object)?;
    let argv = command_line(container, image, &env)?;
    if let Some(filter) = env.get("RUST_LOG")
        && EnvFilter::try_new(filter).is_err()
    {
        return Err(format!("RUST_LOG {filter:?} is not a valid filter"));
    }
    let cli = parse(&argv, &env).map_err(|err| format!("{argv:?}: {err}"))?;
    Ok(match cli.command {
        Command::Serve(args) => {
            let config = Config::from_args(args).map_err(|err| format!("serve: {err}"))?;
            // Anyone who reaches the metrics port can connect: the pod's IP, not every interface.
            if let Some(address) = config.metrics_address
                && address.ip().is_unspecified()
            {
                return Err(format!(
                    "serves metrics on every interface ({address}); use $(POD_IP)"
                ));
            }
            let mut paths = vec![config.socket_path.parent().unwrap().to_path_buf()];
            paths.extend(
                config
                    .admin_socket
                    .iter()
                    .map(|p| p.parent().unwrap().to_path_buf()),
            );
            if config.mode.works_on_host() {
                paths.push(config.kubelet_dir.clone());
                paths.extend(config.pools.iter().map(|p| p.path.clone()));
                paths.extend(config.run_dir.clone());
            }
            (Started::Serve(Box::new(config)), paths)
        }
        Command::Doctor(args) => {
            let config = DoctorConfig::from_args(args).map_err(|err| format!("doctor: {err}"))?;
            let mut paths = vec![config.kubelet_dir.clone()];
            paths.extend(config.pools.iter().map(|p| p.path.clone()));
            paths.extend(config.run_dir.clone());
            (Started::Doctor(config), paths)
        }
        Command::Admin(_) | Command::Cluster(_) => (Started::Admin, Vec::new()),
    })
}

/// A container's volumeMounts: (volume name, mount path).
fn mounts(container: &Value) -> Vec<(&str, &Path)> {
    container
        .get("volumeMounts")
        .and_then(Value::as_sequence)
        .into_iter()
        .flatten()
        .filter_map(|m| {
            let name = m.get("name").and_then(Value::as_str)?;
            Some((name, Path::new(m.get("mountPath").and_then(Value::as_str)?)))
        })
        .collect()
}

/// Why one of `paths` would not reach the host: no volumeMount of the container holds it.
fn unmounted(container: &Value, paths: &[PathBuf]) -> Option<String> {
    let mounts = mounts(container);
    let path = paths
        .iter()
        .find(|path| !mounts.iter().any(|(_, mount)| path.starts_with(mount)))?;
    Some(format!(
        "uses {}, which no volumeMount holds (it would be the container's own layer)",
        path.display()
    ))
}

/// Why another container of the pod `spec` could reach the admin socket `path` of `container`:
/// it mounts the volume holding the socket, or a volume whose host path holds the socket's (or
/// lies in it). None too when no mount holds `path` (`unmounted` says so).
fn admin_socket_shared(spec: &Value, container: &Value, path: &Path) -> Option<String> {
    let (volume, _) = mounts(container)
        .into_iter()
        .filter(|(_, at)| path.starts_with(at))
        .max_by_key(|(_, at)| at.components().count())?;
    let host = host_path(spec, volume);
    let name = container.get("name");
    let others = ["initContainers", "containers"]
        .into_iter()
        .filter_map(|key| spec.get(key).and_then(Value::as_sequence))
        .flatten()
        .filter(|other| other.get("name") != name);
    for other in others {
        let other_name = other.get("name").and_then(Value::as_str).unwrap_or("?");
        for (other_volume, _) in mounts(other) {
            let overlapping = match (&host, host_path(spec, other_volume)) {
                (Some(ours), Some(theirs)) => ours.starts_with(&theirs) || theirs.starts_with(ours),
                _ => false,
            };
            if other_volume == volume || overlapping {
                return Some(format!(
                    "the admin socket {} is in volume {volume}, and container {other_name} \
                     mounts {other_volume}: it would reach the admin API",
                    path.display()
                ));
            }
        }
    }
    None
}

/// The host path of the pod's hostPath volume `name`.
fn host_path(spec: &Value, name: &str) -> Option<PathBuf> {
    spec.get("volumes")?
        .as_sequence()?
        .iter()
        .find(|v| v.get("name").and_then(Value::as_str) == Some(name))?
        .get("hostPath")?
        .get("path")?
        .as_str()
        .map(PathBuf::from)
}

/// The container's argv as kubelet builds it: `command` replaces the image's ENTRYPOINT and,
/// given alone, its CMD too; `args` replaces the CMD. Only `command` and `args` are expanded.
fn command_line(
    container: &Value,
    image: &Image,
    env: &BTreeMap<String, String>,
) -> Result<Vec<String>, String> {
    let strings = |key: &str| -> Result<Option<Vec<String>>, String> {
        let Some(list) = container.get(key) else {
            return Ok(None);
        };
        let list = list
            .as_sequence()
            .ok_or_else(|| format!("{key} is not a list"))?;
        list.iter()
            .map(|item| {
                item.as_str()
                    .map(|s| expand(s, env))
                    .ok_or_else(|| format!("{key} item {item:?} is not a string"))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    };
    let argv = match (strings("command")?, strings("args")?) {
        (Some(command), args) => [command, args.unwrap_or_default()].concat(),
        (None, Some(args)) => [image.entrypoint.clone(), args].concat(),
        (None, None) => [image.entrypoint.clone(), image.cmd.clone()].concat(),
    };
    // Only the binary's own flags can be checked here, not a shell wrapped around it.
    match argv.first().map(Path::new).and_then(Path::file_name) {
        Some(name) if name == "stickyvol" => Ok(argv),
        _ => Err(format!(
            "{argv:?} does not run the stickyvol binary: this test cannot check its flags"
        )),
    }
}

/// The container's environment as kubelet builds it: in order, each value expanded with the
/// variables defined before it, a later entry replacing an earlier one of the same name.
fn environment(container: &Value, object: &Object) -> Result<BTreeMap<String, String>, String> {
    if container.get("envFrom").is_some() {
        return Err("envFrom is not followed by this test: extend it first".into());
    }
    let mut env = BTreeMap::new();
    for entry in container
        .get("env")
        .and_then(Value::as_sequence)
        .into_iter()
        .flatten()
    {
        let name = entry
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("env entry without a name: {entry:?}"))?;
        let value = match (entry.get("value"), entry.get("valueFrom")) {
            (Some(value), None) => expand(
                value
                    .as_str()
                    .ok_or_else(|| format!("env {name}: the value must be a string"))?,
                &env,
            ),
            (None, Some(from)) => {
                let path = from
                    .get("fieldRef")
                    .and_then(|f| f.get("fieldPath"))
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        format!("env {name}: only fieldRef is followed by this test: {from:?}")
                    })?;
                object.field(path).ok_or_else(|| {
                    format!("env {name}: no stand-in for fieldRef {path}: extend this test")
                })?
            }
            (None, None) => String::new(),
            (Some(_), Some(_)) => return Err(format!("env {name}: both value and valueFrom")),
        };
        env.insert(name.to_string(), value);
    }
    Ok(env)
}

/// Kubelet's expansion of `$(VAR)` (k8s.io/kubernetes third_party/forked/golang/expansion):
/// a defined variable is replaced by its value, an undefined one is kept as written, `$$` is a
/// literal `$`, and any other `$` stays as it is.
fn expand(input: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = input;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(reference) = after.strip_prefix('(')
            && let Some(end) = reference.find(')')
        {
            let name = &reference[..end];
            match env.get(name) {
                Some(value) => out.push_str(value),
                None => out.push_str(&format!("$({name})")),
            }
            rest = &reference[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// Serialises the tests' use of the process environment, which clap reads flag fallbacks from.
static ENVIRONMENT: Mutex<()> = Mutex::new(());

/// `Cli::try_parse_from(argv)` with the process environment holding exactly the container's
/// values of the variables the parser reads (none of the test runner's own).
fn parse(argv: &[String], env: &BTreeMap<String, String>) -> Result<Cli, String> {
    let read = parser_env_vars();
    let _only_user = ENVIRONMENT
        .lock()
        .unwrap_or_else(|poison| poison.into_inner());
    let set = |values: &BTreeMap<String, String>| {
        for var in &read {
            // SAFETY: every access to the environment in this test binary goes through
            // ENVIRONMENT, and nothing else here reads it from another thread.
            unsafe {
                match values.get(var) {
                    Some(value) => std::env::set_var(var, value),
                    None => std::env::remove_var(var),
                }
            }
        }
    };
    set(env);
    let parsed = Cli::try_parse_from(argv);
    set(&BTreeMap::new());
    // clap's message, usage and hint on one line.
    parsed.map_err(|err| {
        let text = err.render().to_string();
        let lines: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        lines.join(" ")
    })
}

/// Every environment variable the parser reads a flag from, found by walking it.
fn parser_env_vars() -> BTreeSet<String> {
    fn walk(command: &clap::Command, vars: &mut BTreeSet<String>) {
        for arg in command.get_arguments() {
            vars.extend(arg.get_env().map(|v| v.to_string_lossy().into_owned()));
        }
        for sub in command.get_subcommands() {
            walk(sub, vars);
        }
    }
    let mut vars = BTreeSet::new();
    walk(&Cli::command(), &mut vars);
    assert!(
        vars.contains("CSI_ENDPOINT"),
        "walked no env vars: {vars:?}"
    );
    vars
}

/// The image's ENTRYPOINT and CMD, exec form, from the Dockerfile (the last of each: the final
/// stage's).
struct Image {
    entrypoint: Vec<String>,
    cmd: Vec<String>,
}

impl Image {
    fn from_dockerfile() -> Image {
        let dockerfile =
            fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Dockerfile")).unwrap();
        let last = |instruction: &str| -> Vec<String> {
            let json = dockerfile
                .lines()
                .filter_map(|line| line.strip_prefix(instruction))
                .next_back()
                .unwrap_or_else(|| panic!("the Dockerfile has no {instruction}"));
            serde_json::from_str(json.trim())
                .unwrap_or_else(|err| panic!("{instruction} is not in exec form: {err}"))
        };
        Image {
            entrypoint: last("ENTRYPOINT "),
            cmd: last("CMD "),
        }
    }
}

/// The Kubernetes object a document holds, for labels and downward-API stand-ins.
struct Object {
    kind: String,
    name: String,
    namespace: String,
}

impl Object {
    fn of(document: &Value) -> Object {
        let text = |value: Option<&Value>, default: &str| {
            value.and_then(Value::as_str).unwrap_or(default).to_string()
        };
        let metadata = document.get("metadata");
        Object {
            kind: text(document.get("kind"), "?"),
            name: text(metadata.and_then(|m| m.get("name")), "?"),
            // The kustomization puts everything in this namespace.
            namespace: text(metadata.and_then(|m| m.get("namespace")), "stickyvol"),
        }
    }

    /// A plausible value kubelet would give a fieldRef of this object's pods.
    fn field(&self, path: &str) -> Option<String> {
        Some(match path {
            "spec.nodeName" => NODE_NAME.to_string(),
            "metadata.name" => format!("{}-x7k2q", self.name),
            "metadata.namespace" => self.namespace.clone(),
            "status.podIP" | "status.hostIP" => "10.0.0.7".to_string(),
            _ => return None,
        })
    }
}

/// Every pod spec in a document: any mapping with a `containers` list.
fn pod_specs<'a>(value: &'a Value, specs: &mut Vec<&'a Value>) {
    match value {
        Value::Mapping(map) if map.get("containers").is_some_and(Value::is_sequence) => {
            specs.push(value)
        }
        Value::Mapping(map) => map.values().for_each(|v| pod_specs(v, specs)),
        Value::Sequence(items) => items.iter().for_each(|v| pod_specs(v, specs)),
        _ => {}
    }
}

/// Every .yaml and .yml file under `dir`, recursively, in a stable order.
fn yaml_files(dir: &Path, files: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|err| panic!("reading {}: {err}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            yaml_files(&path, files);
        } else if path
            .extension()
            .is_some_and(|ext| ext == "yaml" || ext == "yml")
        {
            files.push(path);
        }
    }
}
