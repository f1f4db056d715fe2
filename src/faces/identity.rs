//! CSI Identity: who we are, what we offer, whether we are ready.

use std::sync::Arc;

use tonic::{Request, Response, Status};
use tracing::warn;

use crate::csi::plugin_capability::{Service, VolumeExpansion, service, volume_expansion};
use crate::csi::{self, identity_server::Identity};
use crate::faces::driver::Driver;

pub struct IdentityService {
    driver: Arc<Driver>,
}

impl IdentityService {
    pub fn new(driver: Arc<Driver>) -> Self {
        IdentityService { driver }
    }
}

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _request: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: self.driver.config.driver_name.clone(),
            vendor_version: env!("CARGO_PKG_VERSION").to_string(),
            manifest: [(
                "mode".to_string(),
                format!("{:?}", self.driver.config.mode).to_lowercase(),
            )]
            .into(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _request: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        let mut types = vec![service::Type::VolumeAccessibilityConstraints];
        if self.driver.serves_controller() {
            types.insert(0, service::Type::ControllerService);
            // Group snapshots are cut where the volumes are, not beside csi-resizer.
            if self.driver.volumes().is_ok() {
                types.push(service::Type::GroupControllerService);
            }
        }
        let mut capabilities: Vec<_> = types
            .into_iter()
            .map(|t| csi::PluginCapability {
                r#type: Some(csi::plugin_capability::Type::Service(Service {
                    r#type: t as i32,
                })),
            })
            .collect();
        // NodeExpandVolume works while the volume is published.
        capabilities.push(csi::PluginCapability {
            r#type: Some(csi::plugin_capability::Type::VolumeExpansion(
                VolumeExpansion {
                    r#type: volume_expansion::Type::Online as i32,
                },
            )),
        });
        Ok(Response::new(csi::GetPluginCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn probe(
        &self,
        _request: Request<csi::ProbeRequest>,
    ) -> Result<Response<csi::ProbeResponse>, Status> {
        let ready = match self.driver.volumes() {
            // Controller mode has no data directory to check.
            Err(_) => true,
            Ok(volumes) => {
                match crate::faces::driver::blocking(move || volumes.check_ready()).await {
                    Ok(()) => true,
                    Err(status) => {
                        warn!(reason = status.message(), "not ready");
                        false
                    }
                }
            }
        };
        Ok(Response::new(csi::ProbeResponse { ready: Some(ready) }))
    }
}
