//! `stickyvol cluster move NAMESPACE/CLAIM --to NODE`: from anywhere with a kubeconfig, asks the
//! controller to move a claim to another node with its data, after the same checks the
//! controller makes (`controller::moves::accept`, so a refusal is said at once), then follows
//! the move, a line per change, until the claim is bound on the new node. The request is two
//! words on the claim (a label and an annotation): the move goes on if this command is stopped,
//! and running it again follows the move under way.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;
use tokio::time::Instant;

use super::controller::moves::MOVE_REFUSED;
use super::controller::moves::accept::{self, Checked, Settings};
use super::controller::moves::state::{MOVE_REQUESTED, MOVING, MoveState};
use super::kit::affinity::pinned_by;
use super::kit::client::{self, Retries};
use super::kit::names::{MOVE_FROM_DISK, MOVE_TO};
use super::kit::pull_request::PullResult;

#[derive(Debug, Args)]
pub struct MoveArgs {
    /// The claim, as NAMESPACE/NAME.
    pub claim: String,
    /// The node to move it to.
    #[arg(long)]
    pub to: String,
    /// The claim's node is dead and its disk is attached to the target node, its pool mounted
    /// at <data-dir>/adopt/DISK there: the data is read from that disk.
    #[arg(long, value_name = "DISK")]
    pub from_disk: Option<String>,
    /// CSI driver name.
    #[arg(long, env = "DRIVER_NAME", default_value = "stickyvol.csi.io")]
    pub driver_name: String,
    /// The driver's namespace, where the nodes' transfer adverts are.
    #[arg(long, env = "POD_NAMESPACE", default_value = "stickyvol")]
    pub namespace: String,
    /// Ask, and return without following the move.
    #[arg(long)]
    pub no_wait: bool,
    /// Stop following after this many seconds (the move goes on); 0: follow to the end.
    #[arg(long, value_name = "SECONDS", default_value_t = 0)]
    pub timeout: u64,
}

/// How long the follower keeps reading again when the API server does not answer.
const READ_PATIENCE: Duration = Duration::from_secs(60);

/// How the follow ended.
enum Ended {
    Moved(String),
    Refused(String),
}

pub fn run(args: MoveArgs) -> ExitCode {
    match client::block_on(move_claim(&args)) {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(why) => {
            eprintln!("stickyvol cluster move: {why}");
            ExitCode::FAILURE
        }
    }
}

async fn move_claim(args: &MoveArgs) -> Result<String, String> {
    let (namespace, name) = (args.claim.split_once('/'))
        .filter(|(ns, n)| crate::config::is_object_name(ns) && crate::config::is_object_name(n))
        .ok_or_else(|| format!("{:?} is not NAMESPACE/NAME", args.claim))?;
    let client = client::make(Retries::On).await.map_err(|e| e.to_string())?;
    let settings = Settings {
        topology_key: format!("topology.{}/node", args.driver_name),
        driver: args.driver_name.clone(),
        namespace: args.namespace.clone(),
    };
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace);
    let claim = claims.get_opt(name).await.map_err(|e| e.to_string())?;
    // Between its deletion and its making again, a claim being moved is only in the move's state.
    let under_way = match claim {
        Some(_) => None,
        None => state_of(&client, (namespace, name)).await?,
    };
    let checked = match (claim, under_way) {
        (_, Some(state)) => Ok(Checked::Started(Box::new(state))),
        (Some(claim), None) => {
            let asked = (args.to.as_str(), args.from_disk.as_deref());
            accept::check(&client, &settings, &claim, asked).await
        }
        (None, None) => return Err(format!("there is no claim {namespace}/{name}")),
    };
    match checked {
        Err(why) => return Err(format!("not moved: {why}")),
        Ok(Checked::Started(state)) if state.to != args.to => {
            return Err(format!(
                "claim {namespace}/{name} is being moved to node {} already",
                state.to
            ));
        }
        Ok(Checked::Started(_)) => {
            println!("a move of {namespace}/{name} is under way; following it")
        }
        Ok(Checked::May { .. }) => {
            ask(
                &client,
                (namespace, name),
                (&args.to, args.from_disk.as_deref()),
            )
            .await?;
            println!("asked: {namespace}/{name} to node {}", args.to);
        }
    }
    if args.no_wait {
        return Ok(
            "the controller moves it; `stickyvol cluster move` again follows the move".into(),
        );
    }
    let limit = (args.timeout > 0).then(|| Duration::from_secs(args.timeout));
    match follow(&client, &settings, (namespace, name), &args.to, limit).await? {
        Ended::Moved(line) => Ok(line),
        Ended::Refused(why) => Err(format!("not moved: {why}")),
    }
}

/// Asks the controller to move claim `namespace/name` to `to`, from the source node's disk
/// mounted there if given (the label and annotations it acts on; a refusal written earlier is
/// taken off).
pub async fn ask(
    client: &Client,
    (namespace, name): (&str, &str),
    (to, from_disk): (&str, Option<&str>),
) -> Result<(), String> {
    let ask = json!({"metadata": {
        "labels": {MOVE_REQUESTED: "true"},
        "annotations": {MOVE_TO: to, MOVE_FROM_DISK: from_disk, MOVE_REFUSED: null},
    }});
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace);
    (claims
        .patch(name, &PatchParams::default(), &Patch::Merge(&ask))
        .await)
        .map_err(|e| format!("asking for the move on claim {namespace}/{name}: {e}"))?;
    Ok(())
}

/// Prints each new sentence of the move's state until the claim is bound on `to`.
async fn follow(
    client: &Client,
    settings: &Settings,
    (namespace, name): (&str, &str),
    to: &str,
    limit: Option<Duration>,
) -> Result<Ended, String> {
    let started = Instant::now();
    let mut said = String::new();
    let mut unread_since = None;
    loop {
        let now = match progress(client, settings, (namespace, name), to).await {
            Ok(Progress::Done(line)) => return Ok(Ended::Moved(line)),
            Ok(Progress::Refused(why)) => return Ok(Ended::Refused(why)),
            Ok(Progress::Waiting(line)) => {
                unread_since = None;
                line
            }
            // The move goes on in the controller whatever this follower reads; an API server
            // that stops answering for a while (a restart, a busy moment) is waited out.
            Err(why) => {
                let since = *unread_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= READ_PATIENCE {
                    return Err(format!(
                        "{why} (the move goes on; run this again to follow it)"
                    ));
                }
                format!("cannot read the move now ({why}); reading again")
            }
        };
        if now != said {
            println!("[{:>4} s] {now}", started.elapsed().as_secs());
            said = now;
        }
        if limit.is_some_and(|limit| started.elapsed() >= limit) {
            return Err("stopped following (--timeout); the move goes on".into());
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// The state of the move of `namespace/name`, from the PV it is kept on.
async fn state_of(
    client: &Client,
    (namespace, name): (&str, &str),
) -> Result<Option<MoveState>, String> {
    let moving = Api::<PersistentVolume>::all(client.clone())
        .list(&ListParams::default().labels(MOVING))
        .await
        .map_err(|e| format!("listing the moves: {e}"))?;
    Ok(moving
        .items
        .iter()
        .filter_map(|pv| MoveState::on(pv.metadata.annotations.as_ref())?.ok())
        .find(|state| state.claim.namespace == namespace && state.claim.name == name))
}

/// Where a move asked for stands.
pub enum Progress {
    /// The claim is bound on the target: the last line.
    Done(String),
    /// Refused, or nothing asked and nothing under way: why.
    Refused(String),
    /// Under way (or not taken yet): what it does now.
    Waiting(String),
}

/// Where the move of `namespace/name` to `to` stands.
pub async fn progress(
    client: &Client,
    settings: &Settings,
    claim: (&str, &str),
    to: &str,
) -> Result<Progress, String> {
    match state_of(client, claim).await? {
        Some(state) => Ok(Progress::Waiting(state.status)),
        None => finished(client, settings, claim, to).await,
    }
}

/// With no move kept on a PV: done (the claim bound on `to`), refused, or not taken yet.
async fn finished(
    client: &Client,
    settings: &Settings,
    (namespace, name): (&str, &str),
    to: &str,
) -> Result<Progress, String> {
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace);
    let claim = claims.get_opt(name).await.map_err(|e| e.to_string())?;
    let Some(claim) = claim else {
        return Ok(Progress::Refused(format!(
            "claim {namespace}/{name} does not exist, and no move of it is under way"
        )));
    };
    let annotations = claim.metadata.annotations.clone().unwrap_or_default();
    if let Some(why) = annotations.get(MOVE_REFUSED) {
        return Ok(Progress::Refused(why.clone()));
    }
    let volume = (claim.spec.as_ref()).and_then(|s| s.volume_name.clone());
    let bound = (claim.status.as_ref()).and_then(|s| s.phase.as_deref()) == Some("Bound");
    let pv = match (volume, bound) {
        (Some(volume), true) => Api::<PersistentVolume>::all(client.clone())
            .get_opt(&volume)
            .await
            .map_err(|e| e.to_string())?,
        _ => None,
    };
    let affinity = pv
        .as_ref()
        .and_then(|pv| pv.spec.as_ref()?.node_affinity.as_ref());
    if let Some(pv) = pv
        .as_ref()
        .filter(|_| pinned_by(affinity, &settings.topology_key).as_deref() == Some(to))
    {
        let pv_name = pv.metadata.name.as_deref().unwrap_or_default();
        let copied = match PullResult::on(pv.metadata.annotations.as_ref()) {
            Some(PullResult {
                sha256: Some(sha256),
                bytes,
                from,
                ..
            }) => {
                format!(
                    ", copied from PV {from}: {} bytes, sha256 {sha256}",
                    bytes.unwrap_or_default()
                )
            }
            _ => String::new(),
        };
        return Ok(Progress::Done(format!(
            "moved: claim {namespace}/{name} is bound to PV {pv_name} on node {to}{copied}"
        )));
    }
    let asked = (claim.metadata.labels.as_ref()).is_some_and(|l| l.contains_key(MOVE_REQUESTED));
    Ok(match asked {
        true => Progress::Waiting(
            "waiting for the controller to take the request (it runs with --moves=on)".into(),
        ),
        false => Progress::Refused(format!(
            "claim {namespace}/{name} is not bound on node {to}, and no move of it is asked for or under way"
        )),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::cluster::kit::fake_api::{self, respond, status};

    const KEY: &str = "topology.stickyvol.csi.io/node";

    fn settings() -> Settings {
        Settings {
            topology_key: KEY.into(),
            driver: "stickyvol.csi.io".into(),
            namespace: "stickyvol".into(),
        }
    }

    /// A move that has ended (claim shop/data bound to a PV on node b), behind an API server
    /// whose first `unanswered` lists of the moves fail.
    fn client(unanswered: usize) -> (Client, Arc<AtomicUsize>) {
        let lists = Arc::new(AtomicUsize::new(0));
        let seen = lists.clone();
        let client = fake_api::client(move |_, path, _| match path {
            "/api/v1/persistentvolumes" if seen.fetch_add(1, Ordering::SeqCst) < unanswered => {
                respond(500, &status(500, "InternalError"))
            }
            "/api/v1/persistentvolumes" => respond(200, &json!({"items": []})),
            "/api/v1/namespaces/shop/persistentvolumeclaims/data" => respond(
                200,
                &json!({"metadata": {"name": "data", "namespace": "shop"},
                        "spec": {"volumeName": "pv-new"}, "status": {"phase": "Bound"}}),
            ),
            "/api/v1/persistentvolumes/pv-new" => respond(
                200,
                &json!({"metadata": {"name": "pv-new"}, "spec": {"nodeAffinity": {"required":
                    {"nodeSelectorTerms": [{"matchExpressions":
                        [{"key": KEY, "operator": "In", "values": ["b"]}]}]}}}}),
            ),
            _ => respond(404, &status(404, "NotFound")),
        });
        (client, lists)
    }

    #[tokio::test(start_paused = true)]
    async fn a_follower_reads_again_while_the_api_server_does_not_answer() {
        let (client, lists) = client(3);
        let ended = follow(&client, &settings(), ("shop", "data"), "b", None).await;
        let Ok(Ended::Moved(line)) = ended else {
            panic!("the follow did not end with the move")
        };
        assert!(line.starts_with("moved: claim shop/data is bound to PV pv-new on node b"));
        assert_eq!(
            lists.load(Ordering::SeqCst),
            4,
            "three failed reads, then one that answered"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_follower_gives_up_after_a_minute_without_answers_and_says_the_move_goes_on() {
        let (client, _) = client(usize::MAX);
        let started = Instant::now();
        let ended = follow(&client, &settings(), ("shop", "data"), "b", None).await;
        let Err(why) = ended else {
            panic!("the follow ended without an answer")
        };
        assert!(why.contains("the move goes on"), "{why}");
        assert!(
            started.elapsed() >= READ_PATIENCE,
            "gave up after {:?}",
            started.elapsed()
        );
    }
}
