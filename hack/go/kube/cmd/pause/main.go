// Command pause is the test box's pod sandbox process: it holds the pod's namespaces, reaps
// orphans (it is PID 1 there) and exits at once on SIGINT or SIGTERM. No registry is reachable
// from the box, so the sandbox image is built locally around this binary (docs/testing.md).
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
