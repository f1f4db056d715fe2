# Pinned versions of everything the cluster suite builds or installs. The sidecars' versions are
# read from deploy/ (the images the manifests name), so the suite runs what users install.
# shellcheck shell=bash

# The Kubernetes minor the cluster runs: E2E_KUBERNETES=1.35|1.36|1.37 (default the newest, which
# CI runs; tests/e2e/matrix runs the others). Each is built from the k8s.io/kubernetes module with
# the staging modules at its release: modules/kubernetes/go.mod for the newest, go-1.MINOR.mod
# (and .sum) beside it for the others, all written by modules/kubernetes/pin.
E2E_KUBERNETES_MINORS=(1.35 1.36 1.37)
E2E_KUBERNETES=${E2E_KUBERNETES:-1.37}
case $E2E_KUBERNETES in
    1.35) PAUSE_TAG=3.10.1 KUBE_VERSION=v1.35.4 KUBE_MODFILE=go-1.35.mod ;;
    1.36) PAUSE_TAG=3.10.2 KUBE_VERSION=v1.36.3 KUBE_MODFILE=go-1.36.mod ;;
    1.37) PAUSE_TAG=3.10.2 KUBE_VERSION=v1.37.2 KUBE_MODFILE=go.mod ;;
    *)
        echo "E2E_KUBERNETES=$E2E_KUBERNETES: the cluster suite runs ${E2E_KUBERNETES_MINORS[*]}" >&2
        exit 2
        ;;
esac
ETCD_VERSION=v3.6.16        # go.etcd.io/etcd/server/v3 (modules/etcd/go.mod)
SNAPSHOT_CLIENT_VERSION=v8.6.0   # github.com/kubernetes-csi/external-snapshotter/client/v8: the CRDs
# The backup scenarios (scenarios/velero_*.sh, lib/velero.sh): Velero, its AWS plugin, and the S3
# object store they write to; each also pinned in its modules/NAME/go.mod (the build checks).
VELERO_VERSION=v1.18.3           # github.com/vmware-tanzu/velero (modules/velero/go.mod)
VELERO_AWS_PLUGIN_VERSION=v1.14.3   # github.com/vmware-tanzu/velero-plugin-for-aws, for Velero 1.18
VERSITYGW_VERSION=v1.8.0         # github.com/versity/versitygw, an S3 gateway (Apache-2.0)
# The images' names: Velero's and the plugin's as `velero install` names them by default.
VELERO_IMAGE=velero/velero:$VELERO_VERSION
VELERO_AWS_PLUGIN_IMAGE=velero/velero-plugin-for-aws:$VELERO_AWS_PLUGIN_VERSION
VERSITYGW_IMAGE=stickyvol-e2e/versitygw:$VERSITYGW_VERSION

# The cluster's addresses: a host bridge with the control plane on it, one veth per node.
E2E_NODES=(stickyvol-e2e-1 stickyvol-e2e-2)
E2E_BRIDGE=sve2e0
E2E_BRIDGE_IP=10.200.0.1          # the host end; the apiserver listens on 443 (all addresses), etcd on loopback
E2E_NODE_IP_PREFIX=10.200.0       # node i (1-based) is .(i+1)
E2E_POD_CIDR_PREFIX=10.244        # node i's pods: 10.244.i.0/24
# Pods a node holds (kubelet's maxPods) and its pod subnet's prefix length, when the cluster is
# made. The pod-start benchmark's 500 pairs need more than the defaults (docs/e2e.md):
# E2E_MAX_PODS=300 E2E_POD_SUBNET_BITS=23 (node i's pods then in 10.244.2i.0/23).
E2E_MAX_PODS=${E2E_MAX_PODS:-110}
E2E_POD_SUBNET_BITS=${E2E_POD_SUBNET_BITS:-24}
E2E_SERVICE_CIDR=10.96.0.0/16
# Without kube-proxy (no iptables here) ClusterIPs do not route, but pods reach the API at the
# `kubernetes` Service address: it is put on the host's loopback and the apiserver listens on
# 443, the Service's port.
E2E_KUBERNETES_SERVICE_IP=10.96.0.1
# The nodes' disks differ as users' do, with sizes that differ too (so capacity-aware scheduling
# has something to choose); node i gets E2E_POOL_FS[i-1] and E2E_POOL_SIZES[i-1]:
#   xfs   the stickyvol data directory is an XFS filesystem of its own (reflinks);
#   ext4  the node's whole /var/lib/kubelet is one ext4 filesystem without the project feature
#         (mkfs.ext4's defaults), the data directory a directory in it: the default pool on
#         kubelet's filesystem, as most clusters have it (kubelet's share kept back, snapshots
#         and clones copied file by file, sizes measured rather than enforced).
E2E_POOL_FS=(xfs ext4)
E2E_POOL_SIZES=(8G 4G)
# A pool only node 1 has (deploy/examples/pool-on-some-nodes, the pool "nvme"): a disk of its
# own mounted at /mnt/disks/nvme on node 1 alone; "" means no such disk.
E2E_NVME_SIZES=(2G "")
# The sandbox image: containerd's sandbox_image must name it. Built from Kubernetes'
# build/pause/linux/pause.c; the tag is its build/pause/Makefile's (kubeadm's default too), which
# differs between minors (PAUSE_TAG above).
PAUSE_IMAGE=registry.k8s.io/pause:$PAUSE_TAG
# The test pods' image: Debian bookworm's busybox-static (sh, dd, stat, id, df, sync, ...). Not
# :latest, whose default imagePullPolicy is Always (no registry here).
TEST_IMAGE=stickyvol-e2e/busybox:bookworm
# Images of deploy/ that the cluster replaces (kustomize `images:`, OLD=NEW): our stand-ins for
# the sidecars whose modules the Go module proxy does not serve (lib/build-images.sh, STANDINS).
E2E_STANDIN_IMAGES=(
    registry.k8s.io/sig-storage/csi-node-driver-registrar=stickyvol-e2e/csi-node-driver-registrar:standin
    registry.k8s.io/sig-storage/livenessprobe=stickyvol-e2e/livenessprobe:standin
)
# The previous release the upgrade scenario installs first and rolls back to (lib/build-previous.sh):
# main as it landed before the image volumes, staging and restore placement (the merge of
# issue 31, 2026-11-27). Move it forward at each release.
PREVIOUS_RELEASE=756e1d12958aaaadce49cca6bd145987ea047457
