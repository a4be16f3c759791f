// Command kube is the test box's one Kubernetes binary: each component the box runs (etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy, kubectl) is
// chosen by the name it is called by (a symlink) or by its first argument. Linking them once
// costs one link instead of seven; see docs/testing.md.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	_ "time/tzdata" // CronJob time zones, as the upstream mains do

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/server/v3/etcdmain"
	_ "k8s.io/client-go/plugin/pkg/client/auth"
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kubectl "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

var components = map[string]func() *cobra.Command{
	"kube-apiserver":          apiserver.NewAPIServerCommand,
	"kube-controller-manager": controllermanager.NewControllerManagerCommand,
	"kube-scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
	"kube-proxy":              proxy.NewProxyCommand,
	"kubelet":                 func() *cobra.Command { return kubelet.NewKubeletCommand(context.Background()) },
}

func main() {
	name := filepath.Base(os.Args[0])
	args := os.Args
	if name == "kube" {
		if len(args) < 2 {
			fmt.Fprintln(os.Stderr, "usage: kube COMPONENT [ARGS...]  (etcd, kubectl, kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy, kubelet)")
			os.Exit(2)
		}
		name, args = args[1], args[1:]
	}
	switch name {
	case "etcd":
		etcdmain.Main(args)
		return
	case "kubectl":
		os.Args = args
		logs.GlogSetter(kubectl.GetLogVerbosity(args)) // nolint:errcheck
		if err := cli.RunNoErrOutput(kubectl.NewDefaultKubectlCommand()); err != nil {
			kubectlutil.CheckErr(err)
		}
		return
	}
	build, ok := components[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "kube: unknown component %q\n", name)
		os.Exit(2)
	}
	os.Args = args
	os.Exit(cli.Run(build()))
}
