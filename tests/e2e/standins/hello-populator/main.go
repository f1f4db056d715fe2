// Command hello-populator stands in for kubernetes-csi's example volume populator in the cluster
// suite. Kubernetes' storage test "should provision storage with any volume data source" deploys
// registry.k8s.io/sig-storage/hello-populator with its own manifests, and the Go module proxy
// serves no version of github.com/kubernetes-csi/lib-volume-populator, so this program, built
// under that image name, does what the test relies on. It has two modes, as the real one:
//
//	--mode=controller   watches claims whose dataSourceRef names a Hello (hello.example.com) and
//	                    fills each through a claim and a pod of its own (see populate below)
//	--mode=populate     the pod the controller starts: writes --file-contents to --file-name
//
// The protocol (Kubernetes' AnyVolumeDataSource: volume populators) is only a convention between
// the populator and the PV controller; nothing in the cluster knows this program:
//  1. The user's claim stays Pending: the CSI provisioner leaves claims with a dataSourceRef
//     of a kind it does not know to the populator. With WaitForFirstConsumer the scheduler
//     still picks a node for the claim's first pod and writes volume.kubernetes.io/selected-node.
//  2. We make a "prime" claim in our namespace, a copy of the user's without the data source
//     (and with the selected node), which the driver provisions as usual, and a pod that
//     mounts it on that node and writes the file.
//  3. When the pod has succeeded we point the prime claim's PV at the user's claim
//     (spec.claimRef with the claim's UID); the PV controller then binds the user's claim to
//     it, as to any pre-bound PV, and marks the prime claim Lost.
//  4. We delete the pod and the prime claim; the PV, now the user's, stays.
//
// A finalizer on the user's claim keeps it until we have cleaned up, also when it is deleted
// half way. The controller polls (every --resync) instead of using informers: a test makes a
// handful of claims, and a loop that reads everything again each time is easy to follow.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"stickyvol-e2e/standins/internal/cli"
)

var version = "unknown"

const (
	helloGroup = "hello.example.com"
	helloKind  = "Hello"
	// Where the populate pod sees the prime claim: a directory for a filesystem claim, a device
	// for a block one.
	mountPath  = "/mnt"
	devicePath = "/dev/block"

	annSelectedNode = "volume.kubernetes.io/selected-node"
	// Ours: the populator's finalizer on the user's claim and, on the PV, where its data came from.
	finalizer     = helloGroup + "/populate-target-protection"
	annPopulated  = helloGroup + "/populated-from"
	primePrefix   = "prime-"
	podPrefix     = "populate-"
	containerName = "populate"
)

var helloGVR = schema.GroupVersionResource{Group: helloGroup, Version: "v1alpha1", Resource: "hellos"}

func main() {
	mode := flag.String("mode", "", "controller or populate")
	namespace := flag.String("namespace", "hello", "controller: namespace of the prime claims and populate pods")
	imageName := flag.String("image-name", "", "controller: image of the populate pods (this one)")
	httpEndpoint := flag.String("http-endpoint", "", "controller: address for /healthz; empty: none")
	flag.String("metrics-path", "/metrics", "accepted; this stand-in serves no metrics")
	kubeconfig := flag.String("kubeconfig", "", "controller: kubeconfig; empty: in-cluster")
	master := flag.String("master", "", "controller: API server address, overrides the kubeconfig's")
	resync := flag.Duration("resync", 2*time.Second, "controller: how often every claim is looked at")
	fileName := flag.String("file-name", "", "populate: the file (or device) to write")
	fileContents := flag.String("file-contents", "", "populate: what to write")
	cli.Parse(version)
	switch *mode {
	case "populate":
		if err := populate(*fileName, *fileContents); err != nil {
			log.Fatal(err)
		}
	case "controller":
		if *imageName == "" {
			log.Fatal("--image-name is required in controller mode")
		}
		cfg, err := clientcmd.BuildConfigFromFlags(*master, *kubeconfig)
		if err != nil {
			log.Fatalf("client config: %v", err)
		}
		c := &controller{
			kube:      kubernetes.NewForConfigOrDie(cfg),
			dyn:       dynamic.NewForConfigOrDie(cfg),
			namespace: *namespace,
			image:     *imageName,
		}
		if *httpEndpoint != "" {
			go serveHealth(*httpEndpoint)
		}
		log.Printf("hello-populator stand-in %s: controller, prime claims and pods in %s", version, c.namespace)
		for {
			c.syncAll(context.Background())
			time.Sleep(*resync)
		}
	default:
		log.Fatalf("--mode must be controller or populate, not %q", *mode)
	}
}

// populate writes the file the Hello asks for. For a block claim the name is the device; the
// contents then start at its first byte.
func populate(name, contents string) error {
	if name == "" {
		return fmt.Errorf("--file-name is required in populate mode")
	}
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(contents); err != nil {
		f.Close()
		return err
	}
	// The pod's success is what tells the controller the data is there: make it durable first.
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	log.Printf("wrote %d bytes to %s", len(contents), name)
	return nil
}

func serveHealth(addr string) {
	http.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })
	log.Fatal(http.ListenAndServe(addr, nil))
}

type controller struct {
	kube      kubernetes.Interface
	dyn       dynamic.Interface
	namespace string
	image     string
}

func (c *controller) syncAll(ctx context.Context) {
	pvcs, err := c.kube.CoreV1().PersistentVolumeClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		log.Printf("listing claims: %v", err)
		return
	}
	for i := range pvcs.Items {
		pvc := &pvcs.Items[i]
		ref := pvc.Spec.DataSourceRef
		if ref == nil || ref.APIGroup == nil || *ref.APIGroup != helloGroup || ref.Kind != helloKind || ref.Name == "" {
			continue
		}
		if err := c.sync(ctx, pvc); err != nil {
			log.Printf("claim %s/%s: %v", pvc.Namespace, pvc.Name, err)
		}
	}
}

// sync takes one user claim a step further; it is called again on the next pass.
func (c *controller) sync(ctx context.Context, pvc *corev1.PersistentVolumeClaim) error {
	primeName := primePrefix + string(pvc.UID)
	podName := podPrefix + string(pvc.UID)
	prime, err := c.kube.CoreV1().PersistentVolumeClaims(c.namespace).Get(ctx, primeName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		prime, err = nil, nil
	}
	if err != nil {
		return err
	}

	if pvc.DeletionTimestamp != nil {
		return c.cleanup(ctx, pvc, podName, prime)
	}
	if pvc.Spec.VolumeName != "" {
		// Bound (by us, or by someone else: then there is nothing to do but clean up). Wait
		// until the PV controller has seen the PV leave the prime claim (it marks that one
		// Lost): deleting the prime claim while the controller still thought the PV its own
		// would release the PV, and with reclaim policy Delete, delete the user's data.
		if prime != nil && prime.Status.Phase != corev1.ClaimLost && prime.Spec.VolumeName == pvc.Spec.VolumeName {
			return nil
		}
		return c.cleanup(ctx, pvc, podName, prime)
	}

	// Pending: populate.
	hello, err := c.dyn.Resource(helloGVR).Namespace(pvc.Namespace).Get(ctx, pvc.Spec.DataSourceRef.Name, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil // the user may create it later
		}
		return err
	}
	fileName, _, _ := unstructured.NestedString(hello.Object, "spec", "fileName")
	contents, _, _ := unstructured.NestedString(hello.Object, "spec", "fileContents")
	if fileName == "" {
		return fmt.Errorf("Hello %s has no spec.fileName", hello.GetName())
	}

	node := ""
	if pvc.Spec.StorageClassName != nil && *pvc.Spec.StorageClassName != "" {
		sc, err := c.kube.StorageV1().StorageClasses().Get(ctx, *pvc.Spec.StorageClassName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if sc.VolumeBindingMode != nil && *sc.VolumeBindingMode == storagev1.VolumeBindingWaitForFirstConsumer {
			// The scheduler chooses the node when the claim's first pod comes; the prime claim
			// and the populate pod must be there, or the PV would be somewhere the user's pod
			// cannot go.
			node = pvc.Annotations[annSelectedNode]
			if node == "" {
				return nil
			}
		}
	}

	if err := c.setFinalizer(ctx, pvc, true); err != nil {
		return err
	}

	if prime == nil {
		prime = &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: primeName, Namespace: c.namespace},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes:      pvc.Spec.AccessModes,
				Resources:        pvc.Spec.Resources,
				StorageClassName: pvc.Spec.StorageClassName,
				VolumeMode:       pvc.Spec.VolumeMode,
			},
		}
		if node != "" {
			// With it, the driver's provisioner on that node makes the volume without waiting
			// for a pod to be scheduled (ours names its node itself).
			prime.Annotations = map[string]string{annSelectedNode: node}
		}
		if prime, err = c.kube.CoreV1().PersistentVolumeClaims(c.namespace).Create(ctx, prime, metav1.CreateOptions{}); err != nil {
			return err
		}
		log.Printf("claim %s/%s: made %s/%s (node %q)", pvc.Namespace, pvc.Name, c.namespace, primeName, node)
	}

	pod, err := c.kube.CoreV1().Pods(c.namespace).Get(ctx, podName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		block := pvc.Spec.VolumeMode != nil && *pvc.Spec.VolumeMode == corev1.PersistentVolumeBlock
		pod = c.populatePod(podName, primeName, node, block, fileName, contents)
		if _, err := c.kube.CoreV1().Pods(c.namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			return err
		}
		log.Printf("claim %s/%s: started %s/%s", pvc.Namespace, pvc.Name, c.namespace, podName)
		return nil
	}
	if err != nil {
		return err
	}
	switch pod.Status.Phase {
	case corev1.PodSucceeded:
	case corev1.PodFailed:
		// Try again with a new pod on the next pass.
		log.Printf("claim %s/%s: %s failed (%s), deleting it", pvc.Namespace, pvc.Name, podName, pod.Status.Message)
		return c.deletePod(ctx, podName)
	default:
		return nil
	}

	if prime.Spec.VolumeName == "" {
		return nil // a pod ran on it, so it is bound; our copy of it is older
	}
	pv, err := c.kube.CoreV1().PersistentVolumes().Get(ctx, prime.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if ref := pv.Spec.ClaimRef; ref != nil && ref.UID == pvc.UID {
		return nil // done: the PV controller will bind the user's claim
	}
	// Hand the PV over: a claimRef with the user's claim and its UID. The PV controller binds a
	// Pending claim to a PV that names it, also under WaitForFirstConsumer.
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{
			"annotations": map[string]string{annPopulated: pvc.Namespace + "/" + hello.GetName()},
		},
		"spec": map[string]any{
			"claimRef": map[string]any{
				"apiVersion":      "v1",
				"kind":            "PersistentVolumeClaim",
				"namespace":       pvc.Namespace,
				"name":            pvc.Name,
				"uid":             pvc.UID,
				"resourceVersion": pvc.ResourceVersion,
			},
		},
	})
	if err != nil {
		return err
	}
	if _, err := c.kube.CoreV1().PersistentVolumes().Patch(ctx, pv.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return err
	}
	log.Printf("claim %s/%s: PV %s handed over from %s/%s", pvc.Namespace, pvc.Name, pv.Name, c.namespace, primeName)
	return nil
}

// populatePod runs this image in populate mode on the prime claim, on the selected node if any.
func (c *controller) populatePod(name, claim, node string, block bool, fileName, contents string) *corev1.Pod {
	con := corev1.Container{
		Name:            containerName,
		Image:           c.image,
		ImagePullPolicy: corev1.PullIfNotPresent,
		Args:            []string{"--mode=populate", "--file-contents=" + contents},
	}
	if block {
		con.Args = append(con.Args, "--file-name="+devicePath)
		con.VolumeDevices = []corev1.VolumeDevice{{Name: "target", DevicePath: devicePath}}
	} else {
		con.Args = append(con.Args, "--file-name="+filepath.Join(mountPath, fileName))
		con.VolumeMounts = []corev1.VolumeMount{{Name: "target", MountPath: mountPath}}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.namespace},
		Spec: corev1.PodSpec{
			NodeName:      node,
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{con},
			Volumes: []corev1.Volume{{
				Name: "target",
				VolumeSource: corev1.VolumeSource{
					PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim},
				},
			}},
		},
	}
}

// cleanup removes what we made for the claim and then our finalizer.
func (c *controller) cleanup(ctx context.Context, pvc *corev1.PersistentVolumeClaim, podName string, prime *corev1.PersistentVolumeClaim) error {
	if err := c.deletePod(ctx, podName); err != nil {
		return err
	}
	if prime != nil {
		err := c.kube.CoreV1().PersistentVolumeClaims(c.namespace).Delete(ctx, prime.Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		log.Printf("claim %s/%s: deleted %s/%s", pvc.Namespace, pvc.Name, c.namespace, prime.Name)
	}
	return c.setFinalizer(ctx, pvc, false)
}

func (c *controller) deletePod(ctx context.Context, name string) error {
	err := c.kube.CoreV1().Pods(c.namespace).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return nil
}

// setFinalizer adds or removes our finalizer. The patch carries the resourceVersion we read, so
// it fails rather than drop a finalizer someone else added meanwhile; the next pass retries.
func (c *controller) setFinalizer(ctx context.Context, pvc *corev1.PersistentVolumeClaim, want bool) error {
	have := slices.Contains(pvc.Finalizers, finalizer)
	if have == want {
		return nil
	}
	fins := slices.DeleteFunc(slices.Clone(pvc.Finalizers), func(f string) bool { return f == finalizer })
	if want {
		fins = append(fins, finalizer)
	}
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"finalizers": fins, "resourceVersion": pvc.ResourceVersion},
	})
	if err != nil {
		return err
	}
	_, err = c.kube.CoreV1().PersistentVolumeClaims(pvc.Namespace).Patch(ctx, pvc.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
