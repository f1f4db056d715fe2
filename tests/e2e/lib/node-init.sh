# node-init.sh NODE ROOT: PID 1 of a node. Makes the node's filesystem view (its own
# /var/lib/kubelet, /var/lib/containerd, /etc/cni/net.d, /var/log and /mnt/disks, a fresh /run), then
# supervises containerd and kubelet. Runs in the node's new mount, PID and UTS namespaces.
set -euo pipefail
node=$1 root=$2

hostname "$node"
# kubelet and containerd need shared propagation for Bidirectional mounts (the CSI driver's).
mount --make-rshared /

# A bind mount of its own peer group: mounts made under it must not show up a second time at the
# source's path.
bind() {
    # Directories the host lacked for a mount point: `cluster down` removes them again.
    local dir=$2
    while [[ ! -d $dir ]]; do echo "$dir" >>"$root/../../created-mountpoints"; dir=$(dirname "$dir"); done
    mkdir -p "$2"
    mount --bind "$1" "$2" && mount --make-private "$2" && mount --make-shared "$2"
}
# kubelet's directory: on a disk of its own, which holds the pool too (ext4 in versions.sh's
# E2E_POOL_FS), or a directory of the host's with the pool on a disk of its own (xfs).
if [[ -f $root/kubelet.img ]]; then
    mkdir -p /var/lib/kubelet
    mount -o loop "$root/kubelet.img" /var/lib/kubelet
    mount --make-private /var/lib/kubelet && mount --make-shared /var/lib/kubelet
    mkdir -p /var/lib/kubelet/volumes/stickyvol.csi.io
else
    bind "$root/var-lib-kubelet" /var/lib/kubelet
    mkdir -p /var/lib/kubelet/volumes/stickyvol.csi.io
    mount -o loop "$root/pool.img" /var/lib/kubelet/volumes/stickyvol.csi.io
fi
bind "$root/var-lib-containerd" /var/lib/containerd
bind "$root/etc-cni" /etc/cni/net.d
bind "$root/var-log" /var/log
bind "$root/mnt-disks" /mnt/disks
# The optional pool "nvme", on the nodes with that disk (versions.sh, E2E_NVME_SIZES), made the
# way deploy/examples/pool-on-some-nodes tells an operator to.
if [[ -f $root/nvme.img ]]; then
    mkdir -p /mnt/disks/nvme
    mount -o loop "$root/nvme.img" /mnt/disks/nvme
    mkdir -p /mnt/disks/nvme/stickyvol
fi
# A reboot empties /run (publication records, sockets, CNI leases): a new tmpfs per boot.
mount -t tmpfs -o mode=755 tmpfs /run
mkdir -p /run/containerd

exec bash "$(dirname "$0")/supervise.sh" "$root/commands" "$root/logs"
