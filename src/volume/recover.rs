//! Reconciling the host with the records at startup, so a kill -9 at any moment converges:
//! - data without a record (an interrupted create or delete) is removed;
//! - publications the host no longer shows (a reboot, an interrupted unpublish) are forgotten;
//! - loop devices over our files that no live publication uses are detached.
//!
//! Records that cannot be read are reported loudly and their data is left alone.

use std::collections::HashSet;
use std::fs;

use tracing::{error, info, warn};

use super::Volumes;
use super::store::LoadReport;
use crate::error::{IoContext, Result};
use crate::host::{loopdev, safe_delete};

impl Volumes {
    pub(super) fn recover(&self, report: LoadReport) -> Result<()> {
        for (id, why) in &report.unreadable {
            error!(volume = %id, reason = %why, "volume record is unreadable; the volume is left untouched until an admin repairs or removes the record");
        }
        self.remove_orphaned_data()?;
        let in_use = self.forget_stale_publications()?;
        self.detach_unused_devices(&in_use);
        info!(volumes = self.store.len(), data_dir = %self.layout.root.display(), "volume state loaded");
        Ok(())
    }

    fn remove_orphaned_data(&self) -> Result<()> {
        let dir = &self.layout.volumes;
        for entry in fs::read_dir(dir).context(|| format!("listing {}", dir.display()))? {
            let entry = entry.context(|| format!("listing {}", dir.display()))?;
            let name = entry.file_name();
            let Some(id) = name.to_str().and_then(super::Layout::id_of_data_entry) else {
                warn!(path = %entry.path().display(), "unknown entry in the volumes directory; leaving it alone");
                continue;
            };
            if self.store.has_record_file(&id) {
                continue;
            }
            match safe_delete::remove_all(&entry.path()) {
                Ok(()) => {
                    info!(volume = %id, path = %entry.path().display(), "removed data left by an interrupted create or delete")
                }
                Err(err) => {
                    warn!(volume = %id, error = %err, "could not remove orphaned volume data")
                }
            }
        }
        Ok(())
    }

    /// Drops publications the host no longer shows; returns the loop devices still in use.
    fn forget_stale_publications(&self) -> Result<HashSet<String>> {
        let mut in_use = HashSet::new();
        for record in self.store.all() {
            if record.publications.is_empty() {
                continue;
            }
            let mut live = Vec::new();
            for publication in &record.publications {
                if self.is_live(&record, publication)? {
                    in_use.extend(publication.loop_device.clone());
                    live.push(publication.clone());
                } else {
                    info!(volume = %record.id, target = %publication.target.display(), "publication no longer present on the host; forgetting it");
                }
            }
            if live.len() != record.publications.len() {
                let mut updated = (*record).clone();
                updated.publications = live;
                self.store
                    .put(updated)
                    .context(|| format!("updating the record of volume {}", record.id))?;
            }
        }
        Ok(in_use)
    }

    fn detach_unused_devices(&self, in_use: &HashSet<String>) {
        let attached = match loopdev::list_attached() {
            Ok(attached) => attached,
            Err(err) => {
                warn!(error = %err, "cannot list loop devices; skipping their cleanup");
                return;
            }
        };
        for (device, file) in attached {
            // A file deleted while attached is reported as "<path> (deleted)".
            let name = file
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            let name = name.strip_suffix(" (deleted)").unwrap_or(name);
            let ours = file.parent() == Some(self.layout.volumes.as_path())
                && super::Layout::id_of_data_entry(name).is_some();
            if !ours || in_use.contains(device.name()) {
                continue;
            }
            match loopdev::detach(&device) {
                Ok(()) => {
                    info!(device = %device.path().display(), file = %file.display(), "detached a loop device no publication uses")
                }
                Err(err) => {
                    warn!(device = %device.path().display(), error = %err, "could not detach an unused loop device")
                }
            }
        }
    }
}
