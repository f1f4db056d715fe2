// Command livenessprobe stands in for kubernetes-csi's livenessprobe in the cluster suite, whose
// machines cannot get that module: GET /healthz calls the driver's Probe and answers 200 when
// the driver is ready, 500 otherwise. It takes the flags deploy/kubernetes gives the real one.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net/http"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"stickyvol-e2e/standins/internal/cli"
	"stickyvol-e2e/standins/internal/csiconn"
)

var version = "unknown"

func main() {
	csiAddress := flag.String("csi-address", "/run/csi/socket", "the CSI driver's socket in this container")
	httpEndpoint := flag.String("http-endpoint", "", "address for /healthz; empty: :<health-port>")
	healthPort := flag.Int("health-port", 9808, "port for /healthz when --http-endpoint is empty (deprecated)")
	probeTimeout := flag.Duration("probe-timeout", time.Second, "time limit of each Probe call")
	cli.Parse(version)
	addr := *httpEndpoint
	if addr == "" {
		addr = fmt.Sprintf(":%d", *healthPort)
	}
	conn, err := csiconn.Dial(*csiAddress)
	if err != nil {
		log.Fatalf("CSI socket %s: %v", *csiAddress, err)
	}
	id := csi.NewIdentityClient(conn)

	http.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), *probeTimeout)
		defer cancel()
		resp, err := id.Probe(ctx, &csi.ProbeRequest{})
		if err != nil {
			log.Printf("Probe: %v", err)
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		// An unset ready field means ready (CSI spec).
		if resp.GetReady() != nil && !resp.GetReady().GetValue() {
			log.Printf("Probe: driver not ready")
			http.Error(w, "driver not ready", http.StatusInternalServerError)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	log.Printf("livenessprobe stand-in %s: /healthz on %s probes %s", version, addr, *csiAddress)
	log.Fatal(http.ListenAndServe(addr, nil))
}
