//! Kubelet's directory layout for CSI volumes, and the directories we make in it the way kubelet
//! does (and remove afterwards, never recursively: a leftover mount stays visible).

use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

const CSI_PLUGIN_DIR: &str = "plugins/kubernetes.io/csi";

/// Paths under kubelet's root directory for one driver.
#[derive(Debug, Clone)]
pub struct KubeletLayout {
    root: PathBuf,
    driver: String,
}

impl KubeletLayout {
    pub fn new(root: &Path, driver: &str) -> KubeletLayout {
        KubeletLayout {
            root: root.to_path_buf(),
            driver: driver.to_string(),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `<root>/pods`: the base of filesystem targets.
    pub fn pods(&self) -> PathBuf {
        self.root.join("pods")
    }

    /// `<root>/pods/<uid>/volumes/kubernetes.io~csi/<pv>/mount` (kubelet makes the parent).
    pub fn mount_target(&self, pod_uid: &str, pv: &str) -> PathBuf {
        self.pods()
            .join(pod_uid)
            .join("volumes/kubernetes.io~csi")
            .join(pv)
            .join("mount")
    }

    /// `<root>/plugins/kubernetes.io/csi/volumeDevices/publish`: the base of block targets.
    pub fn block_publish_base(&self) -> PathBuf {
        self.root.join(CSI_PLUGIN_DIR).join("volumeDevices/publish")
    }

    /// `…/volumeDevices/publish/<pv>/<pod uid>` (kubelet makes the parent).
    pub fn block_target(&self, pv: &str, pod_uid: &str) -> PathBuf {
        self.block_publish_base().join(pv).join(pod_uid)
    }

    /// `<root>/plugins/kubernetes.io/csi/<driver>`: the base of filesystem staging paths.
    pub fn mount_staging_base(&self) -> PathBuf {
        self.root.join(CSI_PLUGIN_DIR).join(&self.driver)
    }

    /// `…/csi/<driver>/<sha256 of the volume handle>/globalmount` (kubelet makes it).
    pub fn mount_staging(&self, volume_handle: &str) -> PathBuf {
        let digest = Sha256::digest(volume_handle.as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        self.mount_staging_base().join(hex).join("globalmount")
    }

    /// `<root>/plugins/kubernetes.io/csi/volumeDevices/staging`: the base of block staging paths.
    pub fn block_staging_base(&self) -> PathBuf {
        self.root.join(CSI_PLUGIN_DIR).join("volumeDevices/staging")
    }

    /// `…/volumeDevices/staging/<pv>` (kubelet makes it).
    pub fn block_staging(&self, pv: &str) -> PathBuf {
        self.block_staging_base().join(pv)
    }
}

/// Directories we created, removed in reverse order when empty.
#[derive(Debug, Default)]
pub struct MadeDirs {
    made: Vec<PathBuf>,
}

impl MadeDirs {
    /// Creates `path` and its missing ancestors (mode 0750, as kubelet does), remembering each.
    pub fn make_all(&mut self, path: &Path) -> io::Result<()> {
        let mut missing = Vec::new();
        let mut current = Some(path);
        while let Some(dir) = current {
            match fs::symlink_metadata(dir) {
                Ok(_) => break,
                Err(err) if err.kind() == io::ErrorKind::NotFound => {
                    missing.push(dir.to_path_buf());
                    current = dir.parent();
                }
                Err(err) => return Err(err),
            }
        }
        for dir in missing.into_iter().rev() {
            match fs::DirBuilder::new().mode(0o750).create(&dir) {
                Ok(()) => self.made.push(dir),
                Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {}
                Err(err) => {
                    return Err(io::Error::new(
                        err.kind(),
                        format!("creating {}: {err}", dir.display()),
                    ));
                }
            }
        }
        Ok(())
    }

    /// `make_all` on a blocking thread. Kubelet makes each pod's directories in that pod's own
    /// worker; on the bench's one client thread, a `mkdir` waiting for the disk would stall
    /// every other client, and `--concurrency` would measure the bench instead of the driver.
    pub async fn make_all_apart(&mut self, path: PathBuf) -> io::Result<()> {
        let mut dirs = std::mem::take(self);
        let (dirs, made) = tokio::task::spawn_blocking(move || {
            let made = dirs.make_all(&path);
            (dirs, made)
        })
        .await
        .expect("making kubelet directories panicked");
        *self = dirs;
        made
    }

    /// `remove` on a blocking thread, for the reason `make_all_apart` gives.
    pub async fn remove_apart(mut self) -> Vec<String> {
        tokio::task::spawn_blocking(move || self.remove())
            .await
            .expect("removing kubelet directories panicked")
    }

    /// Removes what we made, deepest first; what cannot be removed (not empty, still a mount
    /// point) is left in place and described.
    pub fn remove(&mut self) -> Vec<String> {
        let mut problems = Vec::new();
        while let Some(dir) = self.made.pop() {
            match fs::remove_dir(&dir) {
                Ok(()) => {}
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(err) => problems.push(format!("{} left in place: {err}", dir.display())),
            }
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_follows_kubelet() {
        let layout = KubeletLayout::new(Path::new("/k"), "d.example.com");
        assert_eq!(
            layout.mount_target("uid", "pv"),
            Path::new("/k/pods/uid/volumes/kubernetes.io~csi/pv/mount")
        );
        assert_eq!(
            layout.block_target("pv", "uid"),
            Path::new("/k/plugins/kubernetes.io/csi/volumeDevices/publish/pv/uid")
        );
        assert_eq!(
            layout.block_staging("pv"),
            Path::new("/k/plugins/kubernetes.io/csi/volumeDevices/staging/pv")
        );
        // sha256("abc")
        assert_eq!(
            layout.mount_staging("abc"),
            Path::new(
                "/k/plugins/kubernetes.io/csi/d.example.com/\
                 ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad/globalmount"
            )
        );
    }

    #[test]
    fn made_dirs_are_removed_but_existing_ones_stay() {
        let tmp = tempfile::tempdir().unwrap();
        let mut made = MadeDirs::default();
        made.make_all(&tmp.path().join("a/b/c")).unwrap();
        fs::write(tmp.path().join("keep"), b"").unwrap();
        assert!(made.remove().is_empty());
        assert!(!tmp.path().join("a").exists());
        assert!(tmp.path().join("keep").exists());

        made.make_all(&tmp.path().join("x/y")).unwrap();
        fs::write(tmp.path().join("x/y/file"), b"").unwrap();
        let problems = made.remove();
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(tmp.path().join("x/y/file").exists());
    }
}
