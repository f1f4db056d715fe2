# The control plane: etcd, kube-apiserver, kube-controller-manager and kube-scheduler, run in the
# host's network namespace under one supervisor in a PID namespace of its own, so that killing
# the supervisor (also by `cluster down` after a killed run) ends every one of them.
# shellcheck shell=bash

K8S_BIN=$E2E_CACHE/kubernetes-$KUBE_VERSION
ETCD_BIN=$E2E_CACHE/etcd-$ETCD_VERSION

# The supervisor's command lines, one per line: "name command args...". kube-controller-manager
# keeps its defaults (a user's cluster), among them a client limit of 20 requests/s that its PV
# controller's claim bindings wait on; E2E_KCM_FLAGS adds flags when the cluster is made, e.g.
# "--kube-api-qps=200 --kube-api-burst=400" (docs/performance.md, "Pod start in a cluster").
controlplane_commands() {
    local cp=$E2E_STATE/controlplane
    cat <<CMDS
etcd $ETCD_BIN/etcd --name=e2e --data-dir=$cp/etcd --listen-client-urls=http://127.0.0.1:2379 --advertise-client-urls=http://127.0.0.1:2379 --listen-peer-urls=http://127.0.0.1:2380 --initial-advertise-peer-urls=http://127.0.0.1:2380 --initial-cluster=e2e=http://127.0.0.1:2380 --listen-metrics-urls=http://127.0.0.1:2381 --log-level=warn
kube-apiserver $K8S_BIN/kube-apiserver --etcd-servers=http://127.0.0.1:2379 --bind-address=0.0.0.0 --secure-port=443 --advertise-address=$E2E_BRIDGE_IP --service-cluster-ip-range=$E2E_SERVICE_CIDR --client-ca-file=$PKI/ca.crt --tls-cert-file=$PKI/apiserver.crt --tls-private-key-file=$PKI/apiserver.key --kubelet-client-certificate=$PKI/apiserver-kubelet-client.crt --kubelet-client-key=$PKI/apiserver-kubelet-client.key --kubelet-preferred-address-types=InternalIP --service-account-key-file=$PKI/sa.pub --service-account-signing-key-file=$PKI/sa.key --service-account-issuer=https://kubernetes.default.svc.cluster.local --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction --allow-privileged=true --endpoint-reconciler-type=none --profiling=false --v=1
kube-controller-manager $K8S_BIN/kube-controller-manager --kubeconfig=$PKI/controller-manager.kubeconfig --authentication-kubeconfig=$PKI/controller-manager.kubeconfig --authorization-kubeconfig=$PKI/controller-manager.kubeconfig --bind-address=127.0.0.1 --secure-port=10257 --service-account-private-key-file=$PKI/sa.key --root-ca-file=$PKI/ca.crt --cluster-signing-cert-file=$PKI/ca.crt --cluster-signing-key-file=$PKI/ca.key --use-service-account-credentials=true --leader-elect=false --controllers=*,-bootstrapsigner,-tokencleaner ${E2E_KCM_FLAGS:-} --v=1
kube-scheduler $K8S_BIN/kube-scheduler --kubeconfig=$PKI/scheduler.kubeconfig --authentication-kubeconfig=$PKI/scheduler.kubeconfig --authorization-kubeconfig=$PKI/scheduler.kubeconfig --bind-address=127.0.0.1 --secure-port=10259 --leader-elect=false --v=1
CMDS
}

start_controlplane() {
    local cp=$E2E_STATE/controlplane
    mkdir -p "$cp" "$E2E_STATE/logs"
    controlplane_commands >"$cp/commands"
    # The address pods use for the `kubernetes` Service (see versions.sh).
    ip addr replace "$E2E_KUBERNETES_SERVICE_IP/32" dev lo
    setsid unshare --pid --fork --kill-child --mount --mount-proc \
        bash "$E2E_DIR/lib/supervise.sh" "$cp/commands" "$E2E_STATE/logs" \
        </dev/null >"$E2E_STATE/logs/controlplane.log" 2>&1 &
    echo $! >"$E2E_STATE/controlplane.pid"
}

stop_controlplane() {
    kill_pidfile "$E2E_STATE/controlplane.pid"
    ip addr del "$E2E_KUBERNETES_SERVICE_IP/32" dev lo 2>/dev/null || true
}

# kill_pidfile FILE: SIGKILL the process FILE names (a supervisor whose PID namespace then ends
# with it) and wait until it is gone.
kill_pidfile() {
    local file=$1 pid
    [[ -f $file ]] || return 0
    pid=$(<"$file")
    if kill -0 "$pid" 2>/dev/null; then
        kill -KILL "$pid" 2>/dev/null || true
        local i
        for i in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    rm -f "$file"
}
