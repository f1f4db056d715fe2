//! Node-to-node transfers: two real drivers (nodes `node-a` and `node-b`) with
//! `--transfer-address` on loopback, against one stub API server that reviews their tokens,
//! holds their adverts and the source's PV. `PullVolume` on node-b copies node-a's volume over
//! TLS when the PV says `stickyvol.csi.io/move-to: node-b`, and only then; a third node's plugin,
//! a token of another ServiceAccount, and a source whose certificate is not the advertised one
//! are refused.

mod common;

use std::collections::HashMap;
use std::fs;
use std::path::Path;
use std::sync::{Arc, Mutex};

use common::apistub::{self, status};
use common::*;
use serde_json::{Value, json};
use stickyvol::admin_api::{PullVolumeRequest, admin_client::AdminClient};

const NAMESPACE: &str = "stickyvol";
const NODE_USER: &str = "system:serviceaccount:stickyvol:stickyvol-node";

/// What the stub API server holds.
#[derive(Default)]
struct Api {
    /// ConfigMaps of the driver's namespace, by name.
    config_maps: HashMap<String, Value>,
    /// PVs by name.
    pvs: HashMap<String, Value>,
    /// Token → (username, node of its pod).
    tokens: HashMap<String, (String, String)>,
}

type Shared = Arc<Mutex<Api>>;

fn handle(api: &Shared, method: &str, path: &str, body: &[u8]) -> (u16, Value) {
    let path = path.split('?').next().unwrap_or_default();
    let mut api = api.lock().unwrap();
    let config_maps = format!("/api/v1/namespaces/{NAMESPACE}/configmaps/");
    if let Some(name) = path.strip_prefix(&config_maps) {
        return match method {
            "PATCH" => {
                let applied: Value = serde_json::from_slice(body).unwrap();
                api.config_maps.insert(name.to_string(), applied.clone());
                (200, applied)
            }
            "GET" => match api.config_maps.get(name) {
                Some(found) => (200, found.clone()),
                None => (404, status(404, "NotFound")),
            },
            _ => (405, status(405, "MethodNotAllowed")),
        };
    }
    if let (Some(name), "GET") = (path.strip_prefix("/api/v1/persistentvolumes/"), method) {
        return match api.pvs.get(name) {
            Some(found) => (200, found.clone()),
            None => (404, status(404, "NotFound")),
        };
    }
    if (method, path) == ("POST", "/apis/authentication.k8s.io/v1/tokenreviews") {
        let review: Value = serde_json::from_slice(body).unwrap();
        let token = review["spec"]["token"].as_str().unwrap_or_default();
        assert_eq!(
            review["spec"]["audiences"],
            json!(["stickyvol.csi.io/transfer"])
        );
        let status = match api.tokens.get(token) {
            Some((user, node)) => {
                json!({"authenticated": true, "audiences": ["stickyvol.csi.io/transfer"],
                "user": {"username": user, "extra": {"authentication.kubernetes.io/node-name": [node]}}})
            }
            None => json!({"authenticated": false, "error": "invalid bearer token"}),
        };
        let reply = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                           "spec": review["spec"], "status": status});
        return (201, reply);
    }
    (404, status(404, "NotFound"))
}

/// A node plugin of `node` serving transfers, talking to the stub, presenting `token`.
async fn start_node(node: &'static str, token: &str, kubeconfig: &Path, dir: &Path) -> TestDriver {
    let token_file = dir.join(format!("{node}.token"));
    fs::write(&token_file, token).unwrap();
    let options = Options {
        node_id: Some(node),
        kubeconfig: Some(kubeconfig.to_path_buf()),
        extra_args: vec![
            "--transfer-address".into(),
            "127.0.0.1:0".into(),
            "--namespace".into(),
            NAMESPACE.into(),
            "--transfer-token-file".into(),
            token_file.display().to_string(),
        ],
        ..Options::default()
    };
    TestDriver::start_with(options).await
}

/// Waits for `node`'s advert in the stub.
async fn advertised(api: &Shared, node: &str) -> Value {
    let name = format!("{DRIVER_NAME}-transfer-{node}");
    for _ in 0..100 {
        if let Some(found) = api.lock().unwrap().config_maps.get(&name) {
            return found.clone();
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("no advert {name}");
}

/// The PV of `volume` on node-a, as csi-provisioner makes it, moving to `move_to` if any.
fn source_pv(api: &Shared, volume: &str, move_to: Option<&str>) {
    let mut annotations = json!({});
    if let Some(node) = move_to {
        annotations["stickyvol.csi.io/move-to"] = json!(node);
    }
    api.lock().unwrap().pvs.insert(
        "pvc-source".into(),
        json!({"apiVersion": "v1", "kind": "PersistentVolume",
               "metadata": {"name": "pvc-source", "annotations": annotations},
               "spec": {"csi": {"driver": DRIVER_NAME, "volumeHandle": volume},
                        "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                            {"key": "topology.stickyvol.csi.io/node", "operator": "In", "values": ["node-a"]}]}]}}}}),
    );
}

async fn pull(
    driver: &TestDriver,
    volume: &str,
) -> Result<stickyvol::admin_api::PullVolumeResponse, tonic::Status> {
    AdminClient::new(driver.admin_channel().await)
        .pull_volume(PullVolumeRequest {
            volume_id: volume.to_string(),
            source_pv: "pvc-source".into(),
            from_disk: String::new(),
        })
        .await
        .map(tonic::Response::into_inner)
}

struct Setup {
    api: Shared,
    source: TestDriver,
    target: TestDriver,
    source_volume: String,
    target_volume: String,
    _dir: tempfile::TempDir,
}

/// node-a holds a volume with a file and a tree; node-b an empty volume of the same size.
async fn setup() -> Setup {
    let api = Shared::default();
    api.lock().unwrap().tokens.extend([
        (
            "token-a".to_string(),
            (NODE_USER.to_string(), "node-a".to_string()),
        ),
        (
            "token-b".to_string(),
            (NODE_USER.to_string(), "node-b".to_string()),
        ),
        (
            "token-c".to_string(),
            (NODE_USER.to_string(), "node-c".to_string()),
        ),
        (
            "token-x".to_string(),
            (
                "system:serviceaccount:shop:default".to_string(),
                "node-b".to_string(),
            ),
        ),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let stub = api.clone();
    let kubeconfig = apistub::serve(
        Arc::new(move |method: &str, path: &str, body: &[u8]| handle(&stub, method, path, body)),
        dir.path(),
    )
    .await;
    let source = start_node("node-a", "token-a", &kubeconfig, dir.path()).await;
    let target = start_node("node-b", "token-b", &kubeconfig, dir.path()).await;
    let made = source
        .create(create_request(
            "source",
            mount_cap(Mode::SingleNodeWriter),
            64 << 20,
        ))
        .await;
    let mount = source.mount_target();
    source
        .publish_ok(&made, &mount, mount_cap(Mode::SingleNodeWriter))
        .await;
    fs::create_dir_all(mount.join("tree/deep")).unwrap();
    fs::write(mount.join("tree/deep/file"), vec![0x5a; 3 << 20]).unwrap();
    fs::write(mount.join("note"), "moved with its node").unwrap();
    source.unpublish_ok(&made, &mount).await;
    let empty = target
        .create(create_request(
            "target",
            mount_cap(Mode::SingleNodeWriter),
            64 << 20,
        ))
        .await;
    Setup {
        api,
        source,
        target,
        source_volume: made.volume_id,
        target_volume: empty.volume_id,
        _dir: dir,
    }
}

/// node-b's volume `setup` made (made again by name: the same one).
async fn the_target(target: &TestDriver) -> csi::Volume {
    target
        .create(create_request(
            "target",
            mount_cap(Mode::SingleNodeWriter),
            64 << 20,
        ))
        .await
}

/// The target volume holds the tree `setup` wrote.
async fn holds_the_source_tree(target: &TestDriver) {
    let volume = the_target(target).await;
    let mount = target.mount_target();
    target
        .publish_ok(&volume, &mount, mount_cap(Mode::SingleNodeWriter))
        .await;
    assert_eq!(
        fs::read(mount.join("tree/deep/file")).unwrap(),
        vec![0x5a; 3 << 20]
    );
    assert_eq!(
        fs::read_to_string(mount.join("note")).unwrap(),
        "moved with its node"
    );
    target.unpublish_ok(&volume, &mount).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_volume_marked_to_move_is_pulled_straight_from_its_node_over_tls() {
    let setup = setup().await;
    let advert = advertised(&setup.api, "node-a").await;
    assert_eq!(advert["data"]["node"], "node-a");
    assert!(
        advert["data"]["address"]
            .as_str()
            .unwrap()
            .starts_with("127.0.0.1:")
    );
    assert_eq!(advert["data"]["certSha256"].as_str().unwrap().len(), 64);
    source_pv(&setup.api, &setup.source_volume, Some("node-b"));

    let pulled = pull(&setup.target, &setup.target_volume)
        .await
        .expect("PullVolume");
    assert_eq!(pulled.source_node, "node-a");
    assert!(pulled.data_bytes >= 3 << 20, "{pulled:?}");
    assert_eq!(pulled.sha256.len(), 64);
    holds_the_source_tree(&setup.target).await;
    assert!(setup.source.log_text().contains("transfer: volume sent"));
}

/// The source sends its answer and the stream's start in one buffer, so the first bytes come in
/// the same read as the answer: the puller must read them from its buffer (an image volume's
/// move once failed with "not a stickyvol export stream" on a real cluster, where they came
/// together by chance). A block volume's bytes arrive whole.
#[tokio::test(flavor = "multi_thread")]
async fn a_block_volume_whose_stream_follows_the_answer_at_once_arrives_whole() {
    let setup = setup().await;
    let cap = block_cap(Mode::SingleNodeWriter);
    let size = 8 << 20;
    let data = pattern(size as usize, 7);
    let source = (setup.source)
        .create(thin(create_request("raw-source", cap.clone(), size)))
        .await;
    let staging = setup.source.staging_path();
    setup
        .source
        .stage(&source, &staging, cap.clone())
        .await
        .unwrap();
    let device = setup.source.mount_target();
    setup.source.publish_ok(&source, &device, cap.clone()).await;
    write_synced(&device, &data);
    setup.source.unpublish_ok(&source, &device).await;
    setup
        .source
        .unstage(&source.volume_id, &staging)
        .await
        .unwrap();
    let target = (setup.target)
        .create(thin(create_request("raw-target", cap.clone(), size)))
        .await;
    source_pv(&setup.api, &source.volume_id, Some("node-b"));

    let pulled = pull(&setup.target, &target.volume_id)
        .await
        .expect("PullVolume");
    assert_eq!(pulled.source_node, "node-a");
    let staging = setup.target.staging_path();
    setup
        .target
        .stage(&target, &staging, cap.clone())
        .await
        .unwrap();
    let device = setup.target.mount_target();
    setup.target.publish_ok(&target, &device, cap.clone()).await;
    let arrived = fs::read(&device).unwrap();
    setup.target.unpublish_ok(&target, &device).await;
    setup
        .target
        .unstage(&target.volume_id, &staging)
        .await
        .unwrap();
    assert!(
        arrived[..data.len()] == data[..],
        "the device holds the bytes written on node-a"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_source_gives_nothing_to_a_node_its_pv_does_not_name() {
    let setup = setup().await;
    advertised(&setup.api, "node-a").await;
    source_pv(&setup.api, &setup.source_volume, None);
    let unmarked = pull(&setup.target, &setup.target_volume).await.unwrap_err();
    assert_eq!(
        unmarked.code(),
        tonic::Code::PermissionDenied,
        "{unmarked:?}"
    );
    assert!(
        unmarked.message().contains("is not to move"),
        "{unmarked:?}"
    );

    // Marked for another node: node-b (which knows the id and the address) is refused.
    source_pv(&setup.api, &setup.source_volume, Some("node-c"));
    let elsewhere = pull(&setup.target, &setup.target_volume).await.unwrap_err();
    assert!(
        elsewhere
            .message()
            .contains("to move to node-c, not to node-b"),
        "{elsewhere:?}"
    );

    // Marked for node-b, but the asker's token is another ServiceAccount's, bound to node-b.
    source_pv(&setup.api, &setup.source_volume, Some("node-b"));
    fs::write(setup._dir.path().join("node-b.token"), "token-x").unwrap();
    let stranger = pull(&setup.target, &setup.target_volume).await.unwrap_err();
    assert!(
        stranger
            .message()
            .contains("is not this driver's node plugin"),
        "{stranger:?}"
    );
    // And a token the API server does not vouch for.
    fs::write(setup._dir.path().join("node-b.token"), "forged").unwrap();
    let forged = pull(&setup.target, &setup.target_volume).await.unwrap_err();
    assert!(
        forged
            .message()
            .contains("not valid for stickyvol.csi.io/transfer"),
        "{forged:?}"
    );
    assert!(
        !setup.source.log_text().contains("forged"),
        "tokens are never logged"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_puller_refuses_a_source_whose_certificate_is_not_the_advertised_one() {
    let setup = setup().await;
    advertised(&setup.api, "node-a").await;
    source_pv(&setup.api, &setup.source_volume, Some("node-b"));
    let name = format!("{DRIVER_NAME}-transfer-node-a");
    setup
        .api
        .lock()
        .unwrap()
        .config_maps
        .get_mut(&name)
        .unwrap()["data"]["certSha256"] = json!("00".repeat(32));
    let impostor = pull(&setup.target, &setup.target_volume).await.unwrap_err();
    assert_eq!(impostor.code(), tonic::Code::Unavailable, "{impostor:?}");
    assert!(
        impostor.message().contains("not the one its advert names"),
        "{impostor:?}"
    );
}

/// What a program that reaches the source's address hears: it pins the advertised certificate
/// and asks in the source's own words, with `token`.
async fn ask_directly(api: &Shared, pv: &str, volume: &str, token: &str) -> Option<String> {
    use stickyvol::cluster::node::transfer::{tls, wire};
    let advert = advertised(api, "node-a").await;
    let address: std::net::SocketAddr =
        advert["data"]["address"].as_str().unwrap().parse().unwrap();
    let pin = advert["data"]["certSha256"].as_str().unwrap();
    let tcp = tokio::net::TcpStream::connect(address).await.unwrap();
    let connector = tokio_rustls::TlsConnector::from(tls::client_config(pin).unwrap());
    let stream = connector.connect(tls::server_name(), tcp).await.unwrap();
    let mut stream = tokio::io::BufReader::new(stream);
    let ask = wire::Ask {
        pv: pv.into(),
        volume: volume.into(),
        token: token.into(),
    };
    wire::write_line(&mut stream, &ask).await.unwrap();
    let answer: wire::Answer = wire::read_line(&mut stream).await.unwrap();
    answer.refused
}

#[tokio::test(flavor = "multi_thread")]
async fn a_program_that_knows_the_address_and_the_volume_gets_nothing_without_the_nodes_token() {
    let setup = setup().await;
    source_pv(&setup.api, &setup.source_volume, Some("node-b"));
    let forged = ask_directly(
        &setup.api,
        "pvc-source",
        &setup.source_volume,
        "stolen-or-made-up",
    )
    .await;
    assert!(
        forged
            .unwrap()
            .contains("not valid for stickyvol.csi.io/transfer")
    );
    let of_another_node =
        ask_directly(&setup.api, "pvc-source", &setup.source_volume, "token-c").await;
    assert!(
        of_another_node
            .unwrap()
            .contains("to move to node-b, not to node-c")
    );
    let crafted = ask_directly(
        &setup.api,
        "../../namespaces/x",
        &setup.source_volume,
        "token-b",
    )
    .await;
    assert!(crafted.unwrap().contains("names no PV or volume"));
    // The right token in the right words is served (the stream follows).
    assert_eq!(
        ask_directly(&setup.api, "pvc-source", &setup.source_volume, "token-b").await,
        None
    );
}

/// Adopt a volume of a dead node from its disk, attached to the target node and mounted under
/// `<data-dir>/adopt/` (here: a symlink to node-a's data dir, node-a stopped): the tree arrives
/// whole, read from the disk, with node-a gone; a PV that does not name the target in move-to,
/// a disk name that is a path, and a pool whose `volumes` is a link are refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_volume_of_a_dead_node_is_adopted_from_its_disk() {
    let mut setup = setup().await;
    setup.source.stop().await;
    let adopt = setup.target.data.join("adopt");
    fs::create_dir_all(&adopt).unwrap();
    std::os::unix::fs::symlink(&setup.source.data, adopt.join("disk-a")).unwrap();
    let ask = |disk: &str| PullVolumeRequest {
        volume_id: setup.target_volume.clone(),
        source_pv: "pvc-source".into(),
        from_disk: disk.into(),
    };
    let mut admin = AdminClient::new(setup.target.admin_channel().await);

    source_pv(&setup.api, &setup.source_volume, None);
    let refused = admin.pull_volume(ask("disk-a")).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    source_pv(&setup.api, &setup.source_volume, Some("node-b"));
    let refused = admin.pull_volume(ask("../disk-a")).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    // A target in use: the import's refusal is the answer, not the pipe it left broken.
    let target = the_target(&setup.target).await;
    let mount = setup.target.mount_target();
    (setup.target)
        .publish_ok(&target, &mount, mount_cap(Mode::SingleNodeWriter))
        .await;
    let refused = admin.pull_volume(ask("disk-a")).await.unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    assert!(refused.message().contains("is published"), "{refused:?}");
    assert!(!refused.message().contains("reading volume"), "{refused:?}");
    setup.target.unpublish_ok(&target, &mount).await;

    let pulled = admin
        .pull_volume(ask("disk-a"))
        .await
        .expect("adopted")
        .into_inner();
    assert_eq!(pulled.source_node, "node-a");
    assert!(pulled.data_bytes >= 3 << 20, "{pulled:?}");
    holds_the_source_tree(&setup.target).await;

    // A pool whose volumes directory is a link (to anywhere on the host) is not read.
    let forged = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(
        setup.source.data.join("volumes"),
        forged.path().join("volumes"),
    )
    .unwrap();
    std::os::unix::fs::symlink(forged.path(), adopt.join("forged")).unwrap();
    let refused = admin.pull_volume(ask("forged")).await.unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    assert!(refused.message().contains("not what"), "{refused:?}");
}
