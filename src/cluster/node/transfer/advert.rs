//! Where a node plugin's transfer endpoint is found: the ConfigMap `<driver>-transfer-<node>` in
//! the driver's namespace, which that node's plugin writes at start (server-side apply) with its
//! address and its certificate's SHA-256. The admission policy `stickyvol-orphan-report` (it holds
//! every ConfigMap a node plugin writes) lets each node write only its own, so a puller that
//! reads the source node's advert and pins its certificate talks to that node's plugin.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};

/// On every advert, valued with the driver's name.
pub const LABEL: &str = "stickyvol.csi.io/transfer-endpoint";
const FIELD_MANAGER: &str = "stickyvol-transfer";

/// A node plugin's endpoint, as its advert says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advert {
    pub node: String,
    pub address: SocketAddr,
    /// SHA-256 of its certificate, hex.
    pub fingerprint: String,
}

pub use crate::cluster::kit::names::transfer_advert as name;

/// Writes this node's advert (replacing the one of an earlier start).
pub async fn publish(
    client: &Client,
    namespace: &str,
    driver: &str,
    advert: &Advert,
) -> Result<(), kube::Error> {
    let name = name(driver, &advert.node);
    let config_map = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([(LABEL.to_string(), driver.to_string())])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([
            ("node".to_string(), advert.node.clone()),
            ("address".to_string(), advert.address.to_string()),
            ("certSha256".to_string(), advert.fingerprint.clone()),
        ])),
        ..ConfigMap::default()
    };
    let mut body = serde_json::to_value(&config_map).unwrap_or_default();
    body["apiVersion"] = "v1".into();
    body["kind"] = "ConfigMap".into();
    let api = Api::<ConfigMap>::namespaced(client.clone(), namespace);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch(&name, &params, &Patch::Apply(&body)).await?;
    Ok(())
}

/// The advert of `node`, checked: it names that node, a socket address and a SHA-256.
pub async fn read(
    client: &Client,
    namespace: &str,
    driver: &str,
    node: &str,
) -> Result<Advert, String> {
    let api = Api::<ConfigMap>::namespaced(client.clone(), namespace);
    let name = name(driver, node);
    let found = api
        .get_opt(&name)
        .await
        .map_err(|err| format!("reading the advert {name} of node {node}: {err}"))?
        .ok_or_else(|| format!("node {node} has no transfer endpoint (no ConfigMap {name}: is its plugin running with --transfer-address?)"))?;
    parse(&found.data.unwrap_or_default(), node)
        .map_err(|why| format!("the advert {name} of node {node} {why}"))
}

fn parse(data: &BTreeMap<String, String>, node: &str) -> Result<Advert, String> {
    let get = |key: &str| data.get(key).map(String::as_str).unwrap_or_default();
    if get("node") != node {
        return Err(format!("names node {:?}", get("node")));
    }
    let address = get("address")
        .parse()
        .map_err(|_| format!("has no socket address: {:?}", get("address")))?;
    let fingerprint = get("certSha256");
    if fingerprint.len() != 64 || !fingerprint.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err("has no certificate SHA-256".into());
    }
    Ok(Advert {
        node: node.to_string(),
        address,
        fingerprint: fingerprint.to_ascii_lowercase(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_advert_must_name_its_node_an_address_and_a_sha256() {
        let data = |node: &str, address: &str, sha: &str| {
            BTreeMap::from([
                ("node".to_string(), node.to_string()),
                ("address".to_string(), address.to_string()),
                ("certSha256".to_string(), sha.to_string()),
            ])
        };
        let sha = "ab".repeat(32);
        let good = parse(&data("n1", "10.0.0.7:9820", &sha), "n1").unwrap();
        assert_eq!(good.address.to_string(), "10.0.0.7:9820");
        assert!(
            parse(&data("n2", "10.0.0.7:9820", &sha), "n1")
                .unwrap_err()
                .contains("names node")
        );
        assert!(parse(&data("n1", "nowhere", &sha), "n1").is_err());
        assert!(parse(&data("n1", "10.0.0.7:9820", "abc"), "n1").is_err());
        assert_eq!(
            name("stickyvol.csi.io", "n1"),
            "stickyvol.csi.io-transfer-n1"
        );
    }
}
