// A minimal containerd-stargz-grpc (the lazy-pulling snapshotter) from Debian's library package, which ships
// no command: plain HTTP to every registry (the test relay), no auth.
package main

import (
	"context"
	"flag"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/contrib/snapshotservice"
	"github.com/containerd/containerd/log"
	"github.com/containerd/containerd/reference"
	"github.com/containerd/containerd/remotes/docker"
	stargzfs "github.com/containerd/stargz-snapshotter/fs"
	fsconfig "github.com/containerd/stargz-snapshotter/fs/config"
	"github.com/containerd/stargz-snapshotter/fs/source"
	snbase "github.com/containerd/stargz-snapshotter/snapshot"
	"google.golang.org/grpc"
)

func main() {
	address := flag.String("address", "/run/containerd-stargz-grpc/containerd-stargz-grpc.sock", "socket")
	root := flag.String("root", "/var/lib/containerd-stargz-grpc", "root")
	flag.Parse()
	ctx := context.Background()
	hosts := func(spec reference.Spec) ([]docker.RegistryHost, error) {
		return docker.ConfigureDefaultRegistries(docker.WithPlainHTTP(func(string) (bool, error) { return true, nil }),
			docker.WithClient(&http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}))(spec.Hostname())
	}
	fs, err := stargzfs.NewFilesystem(filepath.Join(*root, "stargz"), fsconfig.Config{},
		stargzfs.WithGetSources(source.FromDefaultLabels(hosts)))
	if err != nil {
		log.G(ctx).WithError(err).Fatal("filesystem")
	}
	rs, err := snbase.NewSnapshotter(ctx, filepath.Join(*root, "snapshotter"), fs, snbase.AsynchronousRemove)
	if err != nil {
		log.G(ctx).WithError(err).Fatal("snapshotter")
	}
	defer rs.Close()
	rpc := grpc.NewServer()
	snapshotsapi.RegisterSnapshotsServer(rpc, snapshotservice.FromSnapshotter(rs))
	os.MkdirAll(filepath.Dir(*address), 0o700)
	os.RemoveAll(*address)
	l, err := net.Listen("unix", *address)
	if err != nil {
		log.G(ctx).WithError(err).Fatal("listen")
	}
	go rpc.Serve(l)
	c := make(chan os.Signal, 1)
	signal.Notify(c, os.Interrupt)
	<-c
}
