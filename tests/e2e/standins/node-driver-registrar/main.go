// Command node-driver-registrar stands in for kubernetes-csi's node-driver-registrar in the
// cluster suite, whose machines cannot get that module. It does what kubelet needs of it: serve
// kubelet's plugin registration API on <driver>-reg.sock in the registration directory, telling
// kubelet the driver's name (from GetPluginInfo) and where kubelet reaches its CSI socket. It
// takes the flags deploy/kubernetes/daemonset.yaml gives the real one.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"stickyvol-e2e/standins/internal/cli"
	"stickyvol-e2e/standins/internal/csiconn"
)

var version = "unknown"

type registrar struct {
	registerapi.UnimplementedRegistrationServer
	name, endpoint, sock string
}

func (r *registrar) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	log.Printf("kubelet asked for the plugin's info")
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              r.name,
		Endpoint:          r.endpoint,
		SupportedVersions: []string{"1.0.0"},
	}, nil
}

// A refused registration ends the process, so the container restarts and registers again.
func (r *registrar) NotifyRegistrationStatus(_ context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if !s.PluginRegistered {
		os.Remove(r.sock)
		log.Fatalf("kubelet did not register %s: %s", r.name, s.Error)
	}
	log.Printf("kubelet registered %s", r.name)
	return &registerapi.RegistrationStatusResponse{}, nil
}

func main() {
	csiAddress := flag.String("csi-address", "/run/csi/socket", "the CSI driver's socket in this container")
	kubeletPath := flag.String("kubelet-registration-path", "", "the CSI driver's socket as kubelet sees it (required)")
	regDir := flag.String("plugin-registration-path", "/registration", "kubelet's plugin registration directory in this container")
	httpEndpoint := flag.String("http-endpoint", "", "address for /healthz; empty: none")
	timeout := flag.Duration("timeout", time.Second, "time limit of each call to the driver")
	cli.Parse(version)
	if *kubeletPath == "" {
		log.Fatal("--kubelet-registration-path is required")
	}
	log.Printf("node-driver-registrar stand-in %s", version)

	conn, err := csiconn.Dial(*csiAddress)
	if err != nil {
		log.Fatalf("CSI socket %s: %v", *csiAddress, err)
	}
	name := csiconn.DriverName(conn, *timeout)
	conn.Close()

	sock := filepath.Join(*regDir, name+"-reg.sock")
	if err := os.Remove(sock); err != nil && !os.IsNotExist(err) {
		log.Fatalf("removing stale %s: %v", sock, err)
	}
	lis, err := net.Listen("unix", sock)
	if err != nil {
		log.Fatalf("listening on %s: %v", sock, err)
	}
	srv := grpc.NewServer()
	registerapi.RegisterRegistrationServer(srv, &registrar{name: name, endpoint: *kubeletPath, sock: sock})

	// Healthy while the registration socket is there for kubelet to find.
	if *httpEndpoint != "" {
		mux := http.NewServeMux()
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
			if _, err := os.Stat(sock); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			fmt.Fprintln(w, "ok")
		})
		go func() { log.Fatal(http.ListenAndServe(*httpEndpoint, mux)) }()
	}

	// The socket goes with the process, so kubelet drops the plugin.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sig
		os.Remove(sock)
		os.Exit(0)
	}()
	log.Printf("serving kubelet's registration API for %s on %s (driver socket %s for kubelet)", name, sock, *kubeletPath)
	log.Fatal(srv.Serve(lis))
}
