//! ControllerModifyVolume in the controller StatefulSet: csi-resizer asks it when a claim's
//! VolumeAttributesClass changes. The volume and the pods using it are on one node, so the
//! limits are handed to that node's plugin through the volume's PV (`kit::modify_request`), and
//! its answer is waited for: csi-resizer records the claim's new class only once the limits are
//! set, and asks again after an error.

use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolume;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;
use tracing::info;

use crate::class::Mutable;
use crate::cluster::kit::affinity::pinned_by;
use crate::cluster::kit::modify_request::{IO_LIMITS_DONE, IO_LIMITS_WANTED, MODIFY_ON, Modified};
use crate::error::Error;

/// How long the controller waits for the node's answer before telling csi-resizer to ask again.
pub const PATIENCE: Duration = Duration::from_secs(30);
/// How often it looks for the answer meanwhile.
const LOOK_EVERY: Duration = Duration::from_millis(250);

/// Hands changes of IO limits to the volumes' nodes.
pub struct Relay {
    pub client: Client,
    pub driver: String,
    pub topology_key: String,
    pub patience: Duration,
}

impl Relay {
    /// Gives volume `volume_id` what its class now says, through its node, and waits for the
    /// node's answer.
    pub async fn modify(&self, volume_id: &str, wanted: &Mutable) -> Result<(), Error> {
        let pv = self.pv_of(volume_id).await?;
        let name = pv.metadata.name.clone().unwrap_or_default();
        let affinity = pv.spec.as_ref().and_then(|s| s.node_affinity.as_ref());
        let node = pinned_by(affinity, &self.topology_key).ok_or_else(|| {
            Error::FailedPrecondition(format!(
                "PV {name} of volume {volume_id} is pinned to no one node"
            ))
        })?;
        let limits = wanted;
        let wanted = serde_json::to_string(wanted).expect("parameters serialize");
        let asked_before = (pv.metadata.labels.as_ref()).is_some_and(|l| l.contains_key(MODIFY_ON));
        let answered = Modified::on(pv.metadata.annotations.as_ref())
            .filter(|done| done.wanted == wanted && done.error.is_none());
        if answered.is_some() && !asked_before {
            return Ok(());
        }
        let ask = json!({"metadata": {
            "labels": {MODIFY_ON: node},
            "annotations": {IO_LIMITS_WANTED: wanted, IO_LIMITS_DONE: null},
        }});
        let pvs = Api::<PersistentVolume>::all(self.client.clone());
        (pvs.patch(&name, &PatchParams::default(), &Patch::Merge(&ask))
            .await)
            .map_err(|err| {
                unavailable(format!(
                    "asking node {node} for the IO limits on PV {name}: {err}"
                ))
            })?;
        info!(volume = volume_id, pv = %name, node, limits = %limits.describe(), "IO limits asked of the volume's node");
        self.answer(&pvs, (&name, &node), &wanted).await
    }

    /// The node's answer to `wanted` on PV `name`, waited for at most `patience`.
    async fn answer(
        &self,
        pvs: &Api<PersistentVolume>,
        (name, node): (&str, &str),
        wanted: &str,
    ) -> Result<(), Error> {
        let deadline = tokio::time::Instant::now() + self.patience;
        loop {
            let pv = (pvs.get_opt(name).await)
                .map_err(|err| unavailable(format!("reading PV {name}: {err}")))?
                .ok_or_else(|| Error::NotFound(format!("PV {name} is gone")))?;
            let done =
                Modified::on(pv.metadata.annotations.as_ref()).filter(|d| d.wanted == wanted);
            match done {
                Some(Modified { error: None, .. }) => return Ok(()),
                Some(Modified {
                    error: Some(why),
                    refused: true,
                    ..
                }) => {
                    return Err(Error::InvalidArgument(format!("node {node}: {why}")));
                }
                Some(Modified {
                    error: Some(why), ..
                }) => {
                    return Err(unavailable(format!(
                        "node {node} could not set the IO limits: {why}"
                    )));
                }
                None if tokio::time::Instant::now() >= deadline => {
                    return Err(unavailable(format!(
                        "node {node} has not set the IO limits on PV {name} within {} s (its stickyvol node plugin is not running?); they are set when it runs",
                        self.patience.as_secs()
                    )));
                }
                None => tokio::time::sleep(LOOK_EVERY).await,
            }
        }
    }

    /// The PV of this driver whose volume handle is `volume_id` (NOT_FOUND if none).
    async fn pv_of(&self, volume_id: &str) -> Result<PersistentVolume, Error> {
        let pvs = Api::<PersistentVolume>::all(self.client.clone());
        // From the API server's cache: a change of class is rare, and exactness is not needed to
        // find a PV that exists since the volume was made.
        let listed = (pvs.list(&ListParams::default().match_any()).await)
            .map_err(|err| unavailable(format!("listing PVs: {err}")))?;
        listed
            .items
            .into_iter()
            .find(|pv| {
                let csi = pv.spec.as_ref().and_then(|s| s.csi.as_ref());
                csi.is_some_and(|c| c.driver == self.driver && c.volume_handle == volume_id)
            })
            .ok_or_else(|| {
                Error::NotFound(format!("no PV of {} holds volume {volume_id}", self.driver))
            })
    }
}

/// Worth asking again (UNAVAILABLE): the API server or the node did not answer.
fn unavailable(why: String) -> Error {
    Error::host(why, std::io::Error::from_raw_os_error(libc::EAGAIN))
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use serde_json::Value;

    use super::*;
    use crate::class::IoLimits;
    use crate::cluster::kit::fake_api::{self, respond, status};

    const KEY: &str = "topology.stickyvol.csi.io/node";

    /// How the fake node answers a change asked on the PV.
    #[derive(Clone, Copy)]
    enum Node {
        Sets,
        Refuses,
        Silent,
    }

    fn pv() -> Value {
        json!({"metadata": {"name": "pv-1", "labels": {}, "annotations": {}},
               "spec": {"csi": {"driver": "stickyvol.csi.io", "volumeHandle": "vol-1"},
                        "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions":
                            [{"key": KEY, "operator": "In", "values": ["b"]}]}]}}}})
    }

    /// The one PV as it is now, and every patch written to it.
    type Cluster = Arc<Mutex<(Value, Vec<Value>)>>;

    /// A cluster of one PV; every write is kept, and the node answers a patch as `node` says.
    fn relay_to(node: Node) -> (Relay, Cluster) {
        let state = Arc::new(Mutex::new((pv(), Vec::new())));
        let shared = state.clone();
        let client = fake_api::client(move |method, path, body| {
            let mut state = shared.lock().unwrap();
            match (method, path) {
                ("GET", "/api/v1/persistentvolumes") => {
                    respond(200, &json!({"items": [state.0.clone()]}))
                }
                ("GET", "/api/v1/persistentvolumes/pv-1") => respond(200, &state.0),
                ("PATCH", "/api/v1/persistentvolumes/pv-1") => {
                    let patch: Value = serde_json::from_slice(body).unwrap();
                    state.1.push(patch.clone());
                    let wanted = patch["metadata"]["annotations"][IO_LIMITS_WANTED].clone();
                    let answer = match node {
                        Node::Sets => Some(json!({"wanted": wanted, "error": null})),
                        Node::Refuses => Some(
                            json!({"wanted": wanted, "error": "a directory volume", "refused": true}),
                        ),
                        Node::Silent => None,
                    };
                    state.0["metadata"]["labels"][MODIFY_ON] =
                        patch["metadata"]["labels"][MODIFY_ON].clone();
                    if let Some(answer) = answer {
                        state.0["metadata"]["annotations"][IO_LIMITS_DONE] =
                            json!(answer.to_string());
                        state.0["metadata"]["labels"] = json!({});
                    }
                    respond(200, &state.0)
                }
                _ => respond(404, &status(404, "NotFound")),
            }
        });
        let relay = Relay {
            client,
            driver: "stickyvol.csi.io".into(),
            topology_key: KEY.into(),
            patience: Duration::from_secs(2),
        };
        (relay, state)
    }

    fn limits() -> Mutable {
        Mutable {
            io: IoLimits {
                write_iops: Some(200),
                ..IoLimits::default()
            },
            on_overflow: None,
            on_node_loss: None,
        }
    }

    #[tokio::test]
    async fn the_limits_are_asked_of_the_volume_s_node_and_its_answer_is_the_call_s() {
        let (relay, state) = relay_to(Node::Sets);
        relay.modify("vol-1", &limits()).await.unwrap();
        let writes = state.lock().unwrap().1.clone();
        assert_eq!(writes.len(), 1);
        assert_eq!(writes[0]["metadata"]["labels"][MODIFY_ON], "b");
        assert_eq!(
            writes[0]["metadata"]["annotations"][IO_LIMITS_WANTED],
            r#"{"write_iops":200}"#
        );
        // Asked again once answered (csi-resizer's retry): nothing to write.
        relay.modify("vol-1", &limits()).await.unwrap();
        assert_eq!(state.lock().unwrap().1.len(), 1);
    }

    #[tokio::test]
    async fn a_refusal_is_invalid_argument_silence_is_unavailable_and_no_pv_not_found() {
        let (relay, _) = relay_to(Node::Refuses);
        let err = relay.modify("vol-1", &limits()).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
        assert!(
            err.to_string().contains("node b: a directory volume"),
            "{err}"
        );

        let (relay, _) = relay_to(Node::Silent);
        let err = relay.modify("vol-1", &limits()).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unavailable, "{err}");
        assert!(
            err.to_string().contains("has not set the IO limits"),
            "{err}"
        );

        let err = relay.modify("vol-2", &limits()).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::NotFound, "{err}");
    }
}
