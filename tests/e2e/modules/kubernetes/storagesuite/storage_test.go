// Kubernetes' storage tests for an installed CSI driver, and nothing else of its e2e suite:
// `go test -c` makes a binary that takes e2e.test's flags (-kubeconfig, -storage.testdriver=FILE,
// -list-images, -ginkgo.focus/skip, ...). Linking only test/e2e/storage/external and the
// framework builds in a fraction of the time the whole e2e.test takes.
package storagesuite

import (
	"flag"
	"os"
	"testing"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	"k8s.io/component-base/logs"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/test/e2e/framework"
	"k8s.io/kubernetes/test/e2e/framework/config"
	"k8s.io/kubernetes/test/e2e/framework/testfiles"
	e2etestingmanifests "k8s.io/kubernetes/test/e2e/testing-manifests"

	// Registers -storage.testdriver: each file it names adds the storage tests for that driver.
	_ "k8s.io/kubernetes/test/e2e/storage/external"
	// On a failure, dump the namespace's events and pods, as e2e.test does.
	_ "k8s.io/kubernetes/test/e2e/framework/debug/init"
)

func TestMain(m *testing.M) {
	config.CopyFlags(config.Flags, flag.CommandLine)
	framework.RegisterCommonFlags(flag.CommandLine)
	framework.RegisterClusterFlags(flag.CommandLine)
	flag.Parse()
	testfiles.AddFileSource(e2etestingmanifests.GetE2ETestingManifestsFS())
	framework.AfterReadingAllFlags(&framework.TestContext)
	// Files a -storage.testdriver file names (a StorageClass) are read relative to -repo-root.
	if framework.TestContext.RepoRoot != "" {
		testfiles.AddFileSource(testfiles.RootFileSource{Root: framework.TestContext.RepoRoot})
	}
	os.Exit(m.Run())
}

func TestStorage(t *testing.T) {
	logs.InitLogs()
	defer logs.FlushLogs()
	klog.EnableContextualLogging(true)
	gomega.RegisterFailHandler(framework.Fail)
	suiteConfig, reporterConfig := framework.CreateGinkgoConfig()
	ginkgo.RunSpecs(t, "Kubernetes storage tests", suiteConfig, reporterConfig)
}
