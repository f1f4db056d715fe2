//! The oldest kernel and Kubernetes this driver runs on, derived from what the code calls, and
//! the doctor's checks of both. Written here once: the chart's `kubeVersion` and the docs say
//! the same, and a test below holds them to it.

use super::{Check, Outcome, check};

/// Linux 5.12: `mount_setattr(2)` gives a bind mount its flags (read-only, nosuid, ...) while it
/// is still detached (host/mount.rs); `LOOP_CONFIGURE` (5.8) attaches a block volume in one call,
/// and `statx` reports mount roots (5.8). Project quotas need 5.14 (`quotactl_fd`), but only
/// where sizes are enforced by them.
pub const MIN_KERNEL: (u32, u32) = (5, 12);

/// Kubernetes 1.32: from it on, a ServiceAccount token bound to a pod names the pod's node
/// (`authentication.kubernetes.io/node-name` and `node-uid`, the ServiceAccountTokenPodNodeInfo
/// feature, GA and locked on); the admission policies that keep a node plugin to its own node,
/// and its orphan report's owner, read them. Everything else used is older and GA.
pub const MIN_KUBERNETES: (u32, u32) = (1, 32);

/// "6.18.0-12-amd64" → (6, 18); None where the release does not start with two numbers.
pub fn major_minor(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(['.', '-', '+']);
    let major = parts.next()?.parse().ok()?;
    let minor: String = (parts.next()?.chars())
        .take_while(char::is_ascii_digit)
        .collect();
    Some((major, minor.parse().ok()?))
}

/// This node's kernel against `MIN_KERNEL`.
pub fn kernel() -> Check {
    let release = nix::sys::utsname::uname()
        .map(|name| name.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    kernel_check(&release)
}

fn kernel_check(release: &str) -> Check {
    let (major, minor) = MIN_KERNEL;
    match major_minor(release) {
        Some(found) if found >= MIN_KERNEL => check(
            Outcome::Ok,
            format!("kernel {release} (Linux {major}.{minor} or newer is needed)"),
        ),
        Some(_) => check(
            Outcome::Fail,
            format!(
                "kernel {release} is older than Linux {major}.{minor}: bind mounts need mount_setattr(2)"
            ),
        ),
        None => check(
            Outcome::Warn,
            format!(
                "kernel release {release:?} could not be read; Linux {major}.{minor} or newer is needed"
            ),
        ),
    }
}

/// The API server's version against `MIN_KUBERNETES`, where the doctor runs in a pod (the
/// DaemonSet's init container); a version that cannot be read is a warning, not a failure: the
/// node's own checks matter more than one request.
pub fn kubernetes() -> Option<Check> {
    std::env::var_os("KUBERNETES_SERVICE_HOST")?;
    let asked = crate::cluster::kit::client::block_on(async {
        let client = crate::cluster::kit::client::make(crate::cluster::kit::client::Retries::Off)
            .await
            .map_err(|err| err.to_string())?;
        let version = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            client.apiserver_version(),
        )
        .await
        .map_err(|_| "no answer within 10 s".to_string())?
        .map_err(|err| err.to_string())?;
        Ok((version.git_version, version.major, version.minor))
    });
    Some(match asked {
        Ok((shown, major, minor)) => kubernetes_check(&shown, &major, &minor),
        Err(why) => check(
            Outcome::Warn,
            format!("the API server's version could not be read: {why}"),
        ),
    })
}

/// `major` and `minor` as /version gives them ("1", "35", or "35+" from some distributions).
fn kubernetes_check(shown: &str, major: &str, minor: &str) -> Check {
    let (need_major, need_minor) = MIN_KUBERNETES;
    let number = |text: &str| text.trim_end_matches('+').parse::<u32>().ok();
    match (number(major), number(minor)) {
        (Some(major), Some(minor)) if (major, minor) >= MIN_KUBERNETES => check(
            Outcome::Ok,
            format!("Kubernetes {shown} (1.{need_minor} or newer is needed)"),
        ),
        (Some(_), Some(_)) => check(
            Outcome::Fail,
            format!(
                "Kubernetes {shown} is older than {need_major}.{need_minor}: its ServiceAccount tokens do not name their node, which the node plugin's admission policies read"
            ),
        ),
        _ => check(
            Outcome::Warn,
            format!("Kubernetes {shown}: version {major}.{minor} could not be read"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_releases_are_read_as_distributions_write_them() {
        assert_eq!(major_minor("6.18.0-12-amd64"), Some((6, 18)));
        assert_eq!(major_minor("5.15.0-1051-azure"), Some((5, 15)));
        assert_eq!(major_minor("5.14.0-427.el9.x86_64"), Some((5, 14)));
        assert_eq!(major_minor("6.1.0+"), Some((6, 1)));
        assert_eq!(major_minor("6.12rc1"), Some((6, 12)));
        assert_eq!(major_minor("linux"), None);
        assert_eq!(major_minor(""), None);
    }

    #[test]
    fn a_kernel_older_than_the_minimum_fails_and_the_minimum_passes() {
        assert_eq!(kernel_check("5.11.22").outcome, Outcome::Fail);
        assert_eq!(kernel_check("5.12.0").outcome, Outcome::Ok);
        assert_eq!(kernel_check("6.1.0-40-amd64").outcome, Outcome::Ok);
        assert_eq!(kernel_check("4.19.0").outcome, Outcome::Fail);
        assert_eq!(kernel_check("?").outcome, Outcome::Warn);
        assert_eq!(kernel().outcome, Outcome::Ok, "{}", kernel().what);
    }

    #[test]
    fn a_kubernetes_older_than_the_minimum_fails() {
        assert_eq!(
            kubernetes_check("v1.31.9", "1", "31").outcome,
            Outcome::Fail
        );
        assert_eq!(kubernetes_check("v1.32.0", "1", "32").outcome, Outcome::Ok);
        assert_eq!(
            kubernetes_check("v1.35.4-eks", "1", "35+").outcome,
            Outcome::Ok
        );
        assert_eq!(kubernetes_check("v2.0.0", "2", "0").outcome, Outcome::Ok);
        assert_eq!(kubernetes_check("?", "", "").outcome, Outcome::Warn);
    }

    /// The chart refuses what the doctor refuses, and every doc that states a minimum states
    /// these.
    #[test]
    fn the_chart_and_the_docs_state_the_same_minimums() {
        let (kmaj, kmin) = MIN_KUBERNETES;
        let chart = include_str!("../../charts/stickyvol/Chart.yaml");
        assert!(
            chart.contains(&format!("kubeVersion: \">={kmaj}.{kmin}.0-0\"")),
            "Chart.yaml's kubeVersion"
        );
        let (lmaj, lmin) = MIN_KERNEL;
        for (name, text) in [
            (
                "docs/operations/install.md",
                include_str!("../../docs/operations/install.md"),
            ),
            (
                "docs/compatibility.md",
                include_str!("../../docs/compatibility.md"),
            ),
        ] {
            assert!(
                text.contains(&format!("Kubernetes {kmaj}.{kmin} or newer")),
                "{name} states another Kubernetes minimum"
            );
            assert!(
                text.contains(&format!("Linux {lmaj}.{lmin} or newer")),
                "{name} states another kernel minimum"
            );
        }
    }
}
