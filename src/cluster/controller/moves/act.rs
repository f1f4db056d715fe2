//! Each step's write (`decide::Step`): one request, or two where the first makes the second
//! safe to repeat (the new PV set to Retain before the state records it; before its temporary
//! claim is deleted; the claim read before its finalizers are written). "Already exists" and "not found" count as done: a step cut by a crash is
//! taken again.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use serde_json::{Value, json};

use super::state::{MOVE_FINALIZER, MOVE_OF, MOVE_STATE, MOVING, MoveState};
use crate::cluster::kit::names::{MOVE_TO, SELECTED_NODE};
use crate::cluster::kit::pull_request::{
    PULL_CLAIM, PULL_FROM, PULL_FROM_DISK, PULL_RESULT, PULL_TO,
};
use crate::cluster::kit::slim::{Pod, StatefulSet};

/// Writes a move's objects.
pub struct Writer<'a> {
    pub client: &'a Client,
    pub old_pv: &'a str,
}

impl Writer<'_> {
    fn pvs(&self) -> Api<PersistentVolume> {
        Api::all(self.client.clone())
    }

    fn claims(&self, namespace: &str) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), namespace)
    }

    async fn patch_pv(&self, name: &str, patch: Value) -> Result<(), kube::Error> {
        let params = PatchParams::default();
        self.pvs()
            .patch(name, &params, &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    /// Saves `state` on the old PV.
    pub async fn save(&self, state: &MoveState) -> Result<(), kube::Error> {
        let patch = json!({"metadata": {"annotations": {MOVE_STATE: state.to_annotation()}}});
        self.patch_pv(self.old_pv, patch).await
    }

    /// The claim that has csi-provisioner on the target node make the new volume: the old
    /// PV's class, size, access modes and mode, with the scheduler's annotation naming the node.
    pub async fn create_temporary_claim(
        &self,
        state: &MoveState,
        old: &PersistentVolume,
    ) -> Result<(), kube::Error> {
        let spec = old.spec.clone().unwrap_or_default();
        let claim = PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some(MoveState::temporary_claim(self.old_pv)),
                namespace: Some(state.claim.namespace.clone()),
                annotations: Some(BTreeMap::from([
                    (SELECTED_NODE.to_string(), state.to.clone()),
                    (MOVE_OF.to_string(), self.old_pv.to_string()),
                ])),
                ..ObjectMeta::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: spec.access_modes,
                storage_class_name: spec.storage_class_name,
                volume_mode: spec.volume_mode,
                resources: Some(VolumeResourceRequirements {
                    requests: spec.capacity,
                    ..VolumeResourceRequirements::default()
                }),
                ..PersistentVolumeClaimSpec::default()
            }),
            status: None,
        };
        let created = (self.claims(&state.claim.namespace))
            .create(&PostParams::default(), &claim)
            .await;
        exists_is_done(created.map(drop))
    }

    /// The new PV kept (Retain) before anything records it or deletes its claim.
    pub async fn retain(&self, pv: &str) -> Result<(), kube::Error> {
        let patch = json!({"spec": {"persistentVolumeReclaimPolicy": "Retain"}});
        self.patch_pv(pv, patch).await
    }

    /// Deletes the claim `namespace/name` if it is still the one with `uid`.
    pub async fn delete_claim(
        &self,
        namespace: &str,
        name: &str,
        uid: Option<&str>,
    ) -> Result<(), kube::Error> {
        let params = DeleteParams {
            preconditions: uid.map(|uid| Preconditions {
                uid: Some(uid.to_string()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        let deleted = self.claims(namespace).delete(name, &params).await;
        gone_is_done(deleted.map(drop))
    }

    /// Has the target node pull the old volume into the new one: the old PV granted to the
    /// target (`move-to`), the new PV labelled for its node, naming the source and the claim.
    pub async fn ask_copy(&self, state: &MoveState, new_pv: &str) -> Result<(), kube::Error> {
        let grant = json!({"metadata": {"annotations": {MOVE_TO: state.to}}});
        self.patch_pv(self.old_pv, grant).await?;
        let ask = json!({"metadata": {
            "labels": {PULL_TO: state.to},
            "annotations": {
                PULL_FROM: self.old_pv,
                PULL_FROM_DISK: state.from_disk,
                PULL_CLAIM: state.claim_name(),
                PULL_RESULT: null,
            },
        }});
        self.patch_pv(new_pv, ask).await
    }

    /// Makes the claim again, bound to `new_pv`, with the owners that still exist (a pod
    /// owner of a `whenScaled: Delete` StatefulSet is gone by now: kept, it would have the
    /// garbage collector delete the claim at once).
    pub async fn create_claim(&self, state: &MoveState, new_pv: &str) -> Result<(), kube::Error> {
        let saved = &state.claim;
        let mut owners = vec![];
        for owner in &saved.owner_references {
            if self.owner_exists(&saved.namespace, owner).await? {
                owners.push(owner.clone());
            }
        }
        let claim = saved.again(new_pv, owners);
        let created = (self.claims(&saved.namespace))
            .create(&PostParams::default(), &claim)
            .await;
        exists_is_done(created.map(drop))
    }

    /// Whether `owner` exists with its uid; owners of other kinds are taken as existing.
    async fn owner_exists(
        &self,
        namespace: &str,
        owner: &OwnerReference,
    ) -> Result<bool, kube::Error> {
        let uid = match (owner.api_version.as_str(), owner.kind.as_str()) {
            ("v1", "Pod") => (Api::<Pod>::namespaced(self.client.clone(), namespace))
                .get_opt(&owner.name)
                .await?
                .and_then(|p| p.metadata.uid),
            ("apps/v1", "StatefulSet") => {
                (Api::<StatefulSet>::namespaced(self.client.clone(), namespace))
                    .get_opt(&owner.name)
                    .await?
                    .and_then(|s| s.metadata.uid)
            }
            _ => return Ok(true),
        };
        Ok(uid.as_deref() == Some(owner.uid.as_str()))
    }

    /// Pre-binds the new PV to the claim's name, without a uid: whichever claim of that name
    /// comes next (the one the move makes, or one a StatefulSet makes first) binds to it, and
    /// no other claim can.
    pub async fn pre_bind(&self, state: &MoveState, new_pv: &str) -> Result<(), kube::Error> {
        let patch = json!({"spec": {"claimRef": {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "namespace": state.claim.namespace,
            "name": state.claim.name,
            "uid": null,
            "resourceVersion": null,
        }}});
        self.patch_pv(new_pv, patch).await
    }

    /// Adds (or takes off) the move's finalizer on the claim `namespace/name` with `uid`: a
    /// whole new list, conditional on the claim read (its other finalizers kept).
    pub async fn hold_claim(
        &self,
        (namespace, name, uid): (&str, &str, &str),
        hold: bool,
    ) -> Result<(), kube::Error> {
        let claims = self.claims(namespace);
        let Some(claim) = claims.get_opt(name).await? else {
            return Ok(());
        };
        if claim.metadata.uid.as_deref() != Some(uid) {
            return Ok(());
        }
        let mut finalizers = claim.metadata.finalizers.clone().unwrap_or_default();
        finalizers.retain(|f| f != MOVE_FINALIZER);
        if hold {
            finalizers.push(MOVE_FINALIZER.to_string());
        }
        let patch = json!({"metadata": {
            "resourceVersion": claim.metadata.resource_version,
            "finalizers": finalizers,
        }});
        let patched = claims
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await;
        gone_is_done(patched.map(drop))
    }

    /// The end: the new PV gets the old one's reclaim policy (its copy's result stays on it, as
    /// the record of the move); the old PV, released, is deleted with its volume.
    pub async fn finish(&self, state: &MoveState, new_pv: &str) -> Result<(), kube::Error> {
        let new = json!({
            "metadata": {"labels": {PULL_TO: null}, "annotations": {PULL_FROM: null, PULL_FROM_DISK: null, PULL_CLAIM: null}},
            "spec": {"persistentVolumeReclaimPolicy": state.reclaim_policy},
        });
        self.patch_pv(new_pv, new).await?;
        let old = json!({
            "metadata": {"labels": {MOVING: null}, "annotations": {MOVE_TO: null, MOVE_STATE: null}},
            "spec": {"persistentVolumeReclaimPolicy": "Delete"},
        });
        self.patch_pv(self.old_pv, old).await
    }
}

fn exists_is_done(result: Result<(), kube::Error>) -> Result<(), kube::Error> {
    match result {
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        other => other,
    }
}

fn gone_is_done(result: Result<(), kube::Error>) -> Result<(), kube::Error> {
    match result {
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        other => other,
    }
}
