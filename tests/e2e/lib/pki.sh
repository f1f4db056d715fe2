# Certificates and kubeconfigs of the test cluster, made with openssl into $E2E_STATE/pki.
# shellcheck shell=bash

PKI=$E2E_STATE/pki

# new_cert NAME CN O [SANs]: a key and a certificate signed by the cluster CA. SANs as openssl's
# subjectAltName syntax ("IP:1.2.3.4,DNS:x"); a cert with SANs serves, one without is a client.
new_cert() {
    local name=$1 cn=$2 o=$3 sans=${4:-} ext
    ext=$(mktemp)
    if [[ -n $sans ]]; then
        printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$sans" >"$ext"
    else
        printf 'extendedKeyUsage=clientAuth\n' >"$ext"
    fi
    local subj="/CN=$cn"
    [[ -n $o ]] && subj="/O=$o$subj"
    openssl req -new -newkey rsa:2048 -nodes -keyout "$PKI/$name.key" -subj "$subj" \
        -out "$PKI/$name.csr" 2>/dev/null
    openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" \
        -CAcreateserial -days 30 -extfile "$ext" -out "$PKI/$name.crt" 2>/dev/null
    rm -f "$ext" "$PKI/$name.csr"
}

# new_kubeconfig NAME SERVER: a kubeconfig using NAME's client certificate.
new_kubeconfig() {
    local name=$1 server=$2
    cat >"$PKI/$name.kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: stickyvol-e2e
  cluster:
    certificate-authority: $PKI/ca.crt
    server: $server
users:
- name: $name
  user:
    client-certificate: $PKI/$name.crt
    client-key: $PKI/$name.key
contexts:
- name: $name@stickyvol-e2e
  context: {cluster: stickyvol-e2e, user: $name}
current-context: $name@stickyvol-e2e
KC
}

make_pki() {
    [[ -f $PKI/done ]] && return 0
    rm -rf "$PKI" && mkdir -p "$PKI"
    openssl req -x509 -new -newkey rsa:2048 -nodes -days 30 -subj "/CN=stickyvol-e2e-ca" \
        -keyout "$PKI/ca.key" -out "$PKI/ca.crt" 2>/dev/null
    new_cert apiserver kube-apiserver "" \
        "IP:$E2E_KUBERNETES_SERVICE_IP,IP:$E2E_BRIDGE_IP,IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
    new_cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters
    new_cert admin admin system:masters
    new_cert controller-manager system:kube-controller-manager ""
    new_cert scheduler system:kube-scheduler ""
    local node
    for node in "${E2E_NODES[@]}"; do
        new_cert "kubelet-$node" "system:node:$node" system:nodes
        new_kubeconfig "kubelet-$node" "https://$E2E_BRIDGE_IP:443"
    done
    new_kubeconfig admin "https://$E2E_BRIDGE_IP:443"
    new_kubeconfig controller-manager https://127.0.0.1:443
    new_kubeconfig scheduler https://127.0.0.1:443
    openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
    openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
    touch "$PKI/done"
}
