//! Whether a source gives a volume to the node plugin that asks: the asker's token must be one
//! the API server vouches for, of this driver's node plugins (the same ServiceAccount as the
//! source's own token), bound to a pod on a node (`authentication.kubernetes.io/node-name`), and
//! the volume's PV must be one of ours, pinned to this node, for that volume, whose
//! `stickyvol.csi.io/move-to` names the asker's node. Only the cluster's admin or the controller
//! set that annotation on a PV of this node (the asker's node may not write this node's PVs).

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::Client;
use kube::api::{Api, PostParams};

use super::wire::AUDIENCE;
use crate::cluster::kit::names::MOVE_TO;

const NODE_NAME: &str = "authentication.kubernetes.io/node-name";

/// Who a token belongs to, as the API server says: (username, node of its pod).
pub async fn review(client: &Client, token: &str) -> Result<(String, Option<String>), String> {
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: token.to_string(),
            audiences: Some(vec![AUDIENCE.to_string()]),
        },
        ..TokenReview::default()
    };
    let api = Api::<TokenReview>::all(client.clone());
    let reviewed = api
        .create(&PostParams::default(), &review)
        .await
        .map_err(|err| format!("the API server could not review a token: {err}"))?;
    let status = reviewed.status.unwrap_or_default();
    let for_us = (status.audiences.as_deref()).is_none_or(|a| a.iter().any(|a| a == AUDIENCE));
    if status.authenticated != Some(true) || !for_us {
        return Err(format!(
            "the token is not valid for {AUDIENCE}{}",
            status.error.map(|e| format!(": {e}")).unwrap_or_default()
        ));
    }
    let user = status.user.unwrap_or_default();
    let node = (user.extra.unwrap_or_default().remove(NODE_NAME)).and_then(|nodes| {
        match nodes.as_slice() {
            [node] => Some(node.clone()),
            _ => None,
        }
    });
    Ok((user.username.unwrap_or_default(), node))
}

/// What the source checks of the PV: ours, pinned to `this_node`, for `volume`, to move to `peer`.
pub fn check_pv(
    pv: &PersistentVolume,
    (driver, topology_key): (&str, &str),
    this_node: &str,
    volume: &str,
    peer: &str,
) -> Result<(), String> {
    let name = pv.metadata.name.as_deref().unwrap_or_default();
    let spec = pv.spec.as_ref();
    let csi = spec
        .and_then(|s| s.csi.as_ref())
        .filter(|c| c.driver == driver);
    let Some(csi) = csi else {
        return Err(format!("PV {name} is not a volume of {driver}"));
    };
    if csi.volume_handle != volume {
        return Err(format!("PV {name} is not volume {volume}'s"));
    }
    let affinity = spec.and_then(|s| s.node_affinity.as_ref());
    let pinned = crate::cluster::kit::affinity::pinned_by(affinity, topology_key);
    if pinned.as_deref() != Some(this_node) {
        return Err(format!("PV {name} is not pinned to this node, {this_node}"));
    }
    let move_to = (pv.metadata.annotations.as_ref()).and_then(|a| a.get(MOVE_TO));
    match move_to {
        Some(to) if to == peer => Ok(()),
        Some(to) => Err(format!("PV {name} is to move to {to}, not to {peer}")),
        None => Err(format!(
            "PV {name} is not to move (no {MOVE_TO} annotation naming {peer})"
        )),
    }
}

/// The asking node, if the source may give it `pv`'s volume; else why not, in a sentence.
pub async fn grant(
    client: &Client,
    own_token: &str,
    (driver, topology_key, this_node): (&str, &str, &str),
    (pv_name, volume, token): (&str, &str, &str),
) -> Result<String, String> {
    let (own_user, _) = review(client, own_token).await?;
    let (user, node) = review(client, token).await?;
    if user != own_user {
        return Err(format!("{user} is not this driver's node plugin"));
    }
    let Some(peer) = node else {
        return Err("the token is not bound to a pod on a node".into());
    };
    if peer == this_node {
        return Err("a volume is not copied to its own node".into());
    }
    let pvs = Api::<PersistentVolume>::all(client.clone());
    let pv = pvs
        .get_opt(pv_name)
        .await
        .map_err(|err| format!("reading PV {pv_name}: {err}"))?
        .ok_or_else(|| format!("there is no PV {pv_name}"))?;
    check_pv(&pv, (driver, topology_key), this_node, volume, &peer)?;
    Ok(peer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    const KEY: &str = "topology.stickyvol.csi.io/node";

    fn pv(driver: &str, node: &str, move_to: Value) -> PersistentVolume {
        let annotations = match move_to {
            Value::Null => json!({}),
            to => json!({MOVE_TO: to}),
        };
        serde_json::from_value(json!({
            "metadata": {"name": "pvc-1", "annotations": annotations},
            "spec": {"csi": {"driver": driver, "volumeHandle": "sv-1"},
                     "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                         {"key": KEY, "operator": "In", "values": [node]}]}]}}}
        }))
        .unwrap()
    }

    #[test]
    fn only_a_pv_of_this_node_marked_for_the_asker_is_given() {
        let ours = ("stickyvol.csi.io", KEY);
        let check = |pv: &PersistentVolume, volume: &str| check_pv(pv, ours, "a", volume, "b");
        assert_eq!(
            check(&pv("stickyvol.csi.io", "a", json!("b")), "sv-1"),
            Ok(())
        );
        let to_c = check(&pv("stickyvol.csi.io", "a", json!("c")), "sv-1").unwrap_err();
        assert!(to_c.contains("to move to c, not to b"), "{to_c}");
        let unmarked = check(&pv("stickyvol.csi.io", "a", Value::Null), "sv-1").unwrap_err();
        assert!(unmarked.contains("is not to move"), "{unmarked}");
        let elsewhere = check(&pv("stickyvol.csi.io", "c", json!("b")), "sv-1").unwrap_err();
        assert!(elsewhere.contains("not pinned to this node"), "{elsewhere}");
        let theirs = check(&pv("other.csi.io", "a", json!("b")), "sv-1").unwrap_err();
        assert!(theirs.contains("not a volume of"), "{theirs}");
        let other_volume = check(&pv("stickyvol.csi.io", "a", json!("b")), "sv-2").unwrap_err();
        assert!(other_volume.contains("not volume sv-2's"), "{other_volume}");
    }
}
