// The pod sandbox's process (what registry.k8s.io/pause is elsewhere): it
// holds the pod's namespaces and waits until it is told to stop. No image
// can be pulled here, so the real node's containerd runs this one, built
// with the control plane and imported by the harness.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	<-stop
}
