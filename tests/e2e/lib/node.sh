# The nodes: each a host of its own on this machine, the way kind runs nodes as containers. A
# node is a network namespace (a veth on the host's bridge) in which a supervisor runs, as PID 1
# of its own PID, mount and UTS namespaces, containerd and kubelet; its /var/lib/kubelet,
# /var/lib/containerd and /etc/cni/net.d are directories under $E2E_STATE/nodes/NAME, its /run a
# fresh tmpfs at every boot.
# shellcheck shell=bash

node_root() { echo "$E2E_STATE/nodes/$1"; }
node_index() {
    local i
    for i in "${!E2E_NODES[@]}"; do
        [[ ${E2E_NODES[$i]} == "$1" ]] && { echo $((i + 1)); return; }
    done
    die "no node called $1"
}
node_ip() { echo "$E2E_NODE_IP_PREFIX.$(($(node_index "$1") + 1))"; }
node_netns() { echo "sve2e-$(node_index "$1")"; }
node_pid() { cat "$(node_root "$1")/supervisor.pid" 2>/dev/null; }
# The node's PID 1 (the child unshare forked into the new PID namespace), as the host sees it.
node_init_pid() {
    local pid
    pid=$(node_pid "$1") && pgrep -P "$pid" | head -1
}
# What the host reaches of a running node's mount namespace.
node_fs() { echo "/proc/$(node_init_pid "$1")/root"; }
# node_exec NODE CMD...: runs CMD inside the node (its mount, network, PID and UTS namespaces).
node_exec() {
    local pid
    pid=$(node_init_pid "$1") && [[ -n $pid ]] || die "node $1 is not running"
    shift
    nsenter -t "$pid" -m -n -p -u -- "$@"
}

start_network() {
    ip link show "$E2E_BRIDGE" >/dev/null 2>&1 || {
        ip link add "$E2E_BRIDGE" type bridge
        ip addr add "$E2E_BRIDGE_IP/24" dev "$E2E_BRIDGE"
    }
    ip link set "$E2E_BRIDGE" up
    local node other ns
    for node in "${E2E_NODES[@]}"; do
        ns=$(node_netns "$node")
        ip netns add "$ns" 2>/dev/null || true
        if ! ip netns exec "$ns" ip link show eth0 >/dev/null 2>&1; then
            ip link add "$ns" type veth peer name eth0 netns "$ns"
            ip link set "$ns" master "$E2E_BRIDGE" up
            ip netns exec "$ns" ip addr add "$(node_ip "$node")/24" dev eth0
        fi
        ip netns exec "$ns" ip link set lo up
        ip netns exec "$ns" ip link set eth0 up
        ip netns exec "$ns" ip route replace default via "$E2E_BRIDGE_IP"
        ip netns exec "$ns" sysctl -qw net.ipv4.ip_forward=1
        ip route replace "$(pod_subnet "$node")" via "$(node_ip "$node")"
        for other in "${E2E_NODES[@]}"; do
            [[ $other == "$node" ]] && continue
            ip netns exec "$ns" ip route replace \
                "$(pod_subnet "$other")" via "$(node_ip "$other")"
        done
    done
}

# pod_subnet NODE: the node's pod subnet, E2E_POD_SUBNET_BITS long (versions.sh).
pod_subnet() {
    local spacing=$((1 << (24 - E2E_POD_SUBNET_BITS)))
    echo "$E2E_POD_CIDR_PREFIX.$(($(node_index "$1") * spacing)).0/$E2E_POD_SUBNET_BITS"
}

stop_network() {
    local node
    for node in "${E2E_NODES[@]}"; do
        ip route del "$(pod_subnet "$node")" 2>/dev/null || true
        ip netns del "$(node_netns "$node")" 2>/dev/null || true
        ip link del "$(node_netns "$node")" 2>/dev/null || true
    done
    ip link del "$E2E_BRIDGE" 2>/dev/null || true
}

# write_node_config NODE: containerd's and kubelet's configuration and the CNI network.
write_node_config() {
    local node=$1 root
    root=$(node_root "$node")
    mkdir -p "$root"/{var-lib-kubelet,var-lib-containerd,etc-cni,var-log,mnt-disks,logs}
    cat >"$root/containerd.toml" <<TOML
version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # These machines withhold CAP_SYS_RESOURCE even from root, so a container's oom_score_adj
  # cannot go below containerd's own (kubelet asks -998 for sandboxes, runc then fails with
  # "failed to update /proc/self/oom_score_adj: Permission denied").
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "/etc/cni/net.d"
TOML
    # No iptables here: no masquerading; the host routes each node's pod subnet to it.
    cat >"$root/etc-cni/10-e2e.conflist" <<JSON
{
  "cniVersion": "0.4.0",
  "name": "e2e",
  "plugins": [{
    "type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false,
    "ipam": {"type": "host-local", "dataDir": "/run/cni-ipam",
             "ranges": [[{"subnet": "$(pod_subnet "$node")"}]],
             "routes": [{"dst": "0.0.0.0/0"}]}
  }]
}
JSON
    cat >"$root/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# These machines have cgroup v1 and no systemd.
failCgroupV1: false
cgroupDriver: cgroupfs
# Both nodes share the kernel's cgroup tree: each kubelet keeps to its own subtree.
cgroupRoot: /$node
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
address: $(node_ip "$node")
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: AlwaysAllow}
# The images were imported, not pulled: never collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
failSwapOn: false
maxPods: $E2E_MAX_PODS
serializeImagePulls: false
rotateCertificates: false
YAML
    cat >"$root/commands" <<CMDS
containerd /usr/bin/containerd --config $root/containerd.toml
kubelet $K8S_BIN/kubelet --config=$root/kubelet.yaml --kubeconfig=$PKI/kubelet-$node.kubeconfig --hostname-override=$node --node-ip=$(node_ip "$node") --v=1
CMDS
}

# make_disk FILE SIZE [FS]: a filesystem image (XFS unless FS says ext4), once.
make_disk() {
    [[ -f $1 ]] && return 0
    truncate -s "$2" "$1.new"
    case ${3:-xfs} in
        xfs) mkfs.xfs -q "$1.new" ;;
        ext4) mkfs.ext4 -q -F -E nodiscard,lazy_itable_init=1,lazy_journal_init=1 "$1.new" ;;
    esac
    mv "$1.new" "$1"
}

# start_node NODE: boots the node (its supervisor runs node-init.sh, see there).
start_node() {
    local node=$1 root
    root=$(node_root "$node")
    [[ -n $(node_pid "$node") ]] && kill -0 "$(node_pid "$node")" 2>/dev/null && return 0
    write_node_config "$node"
    local i=$(($(node_index "$node") - 1))
    if [[ ${E2E_POOL_FS[$i]} == ext4 ]]; then
        make_disk "$root/kubelet.img" "${E2E_POOL_SIZES[$i]}" ext4
    else
        make_disk "$root/pool.img" "${E2E_POOL_SIZES[$i]}"
    fi
    [[ -z ${E2E_NVME_SIZES[$i]} ]] || make_disk "$root/nvme.img" "${E2E_NVME_SIZES[$i]}"
    local cg
    for cg in /sys/fs/cgroup/*/; do
        [[ $cg == */unified/ ]] || mkdir -p "$cg$node"
    done
    setsid nsenter --net="/run/netns/$(node_netns "$node")" \
        unshare --pid --fork --kill-child --mount --uts --mount-proc \
        bash "$E2E_DIR/lib/node-init.sh" "$node" "$root" \
        </dev/null >"$root/logs/init.log" 2>&1 &
    echo $! >"$root/supervisor.pid"
}

# stop_node NODE: the node's power cord: every process of it dies at once, its /run and its
# mounts go with its namespaces; its loop devices are detached as a reboot would.
stop_node() {
    local node=$1
    detach_node_loop_devices "$node"
    kill_pidfile "$(node_root "$node")/supervisor.pid"
    detach_node_loop_devices "$node"
    remove_node_cgroups "$node"
}

# A power cycle leaves no cgroup behind, but cgroup v1 is one tree for the whole kernel: the
# cgroups of the node's dead containers would stay, and the next kubelet's cAdvisor spends
# seconds on each at its start (seen after two full runs on one cluster: exec through a
# restarted kubelet refused for over 60 s, "container runtime status check may not have
# completed yet"). Removed deepest first, once the node's processes are gone.
remove_node_cgroups() {
    local node=$1 left
    for _ in $(seq 50); do
        left=$(find /sys/fs/cgroup/*/"$node" -mindepth 1 -depth -type d 2>/dev/null |
            while read -r dir; do rmdir "$dir" 2>/dev/null || echo "$dir"; done)
        [[ -z $left ]] && return 0
        sleep 0.1
    done
    log "$(wc -l <<<"$left") cgroups of $node still in use after its stop"
}

# Loop devices whose backing file is one of the node's files, found by the file's identity
# (device and inode: a backing path means nothing across mount namespaces).
detach_node_loop_devices() {
    local node=$1 root dev ino
    root=$(node_root "$node")
    [[ -d $root ]] || return 0
    local -A ours=()
    local majmin
    while read -r dev ino; do ours["$dev:$ino"]=1; done < <(
        find "$root" -xdev -type f -printf '%D %i\n' 2>/dev/null)
    local pid
    pid=$(node_init_pid "$node") || true
    if [[ -n $pid && -d /proc/$pid/root/var/lib/kubelet ]]; then
        while read -r dev ino; do ours["$dev:$ino"]=1; done < <(
            find "/proc/$pid/root/var/lib/kubelet" -type f -printf '%D %i\n' 2>/dev/null)
    fi
    local loop
    for loop in /sys/block/loop*; do
        [[ -f $loop/loop/backing_file ]] || continue
        majmin=$(losetup -n -O BACK-MAJ:MIN,BACK-INO "/dev/${loop##*/}" 2>/dev/null) || continue
        read -r majmin ino <<<"$majmin"
        dev=$(( (${majmin%%:*} << 8) | ${majmin##*:} ))
        if [[ -n ${ours["$dev:$ino"]:-} ]]; then
            losetup -d "/dev/${loop##*/}" 2>/dev/null || true
        fi
    done
}
