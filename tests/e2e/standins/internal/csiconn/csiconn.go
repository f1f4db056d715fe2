// Package csiconn opens the gRPC connection to a CSI driver's unix socket for the stand-ins.
package csiconn

import (
	"context"
	"fmt"
	"log"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Dial returns a client of the socket at path (the connection is made on first use).
func Dial(path string) (*grpc.ClientConn, error) {
	target := path
	if !strings.HasPrefix(target, "unix:") {
		target = "unix://" + path
	}
	return grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// DriverName asks the driver for its name until it answers, each call limited to timeout.
func DriverName(conn *grpc.ClientConn, timeout time.Duration) string {
	id := csi.NewIdentityClient(conn)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		info, err := id.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
		cancel()
		if err == nil && info.GetName() != "" {
			return info.GetName()
		}
		if err == nil {
			err = fmt.Errorf("empty name")
		}
		log.Printf("GetPluginInfo: %v; trying again", err)
		time.Sleep(time.Second)
	}
}
