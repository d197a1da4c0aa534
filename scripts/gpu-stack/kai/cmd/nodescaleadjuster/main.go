// kai-nodescaleadjuster: KAI-Scheduler v0.12.0's cmd/nodescaleadjuster/main.go with one flag more,
// --metrics-bind-address. Upstream's app.Run (cmd/nodescaleadjuster/app/app.go, ctrl.NewManager
// at lines 58-62) passes no Metrics options, so controller-runtime v0.21.0 binds its default
// metricsserver.DefaultBindAddress, ":8080" (pkg/metrics/server/server.go lines 45 and 164-166),
// as KAI's podgroupcontroller does: on one loopback they cannot both run. That default is an
// exported package variable, read when app.Run builds the manager (after its flag.Parse), so
// this flag sets it; the upstream code runs unchanged. Without the flag it stays ":8080".
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/NVIDIA/KAI-scheduler/cmd/nodescaleadjuster/app"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

func main() {
	flag.StringVar(&metricsserver.DefaultBindAddress, "metrics-bind-address",
		metricsserver.DefaultBindAddress,
		"The address the metric endpoint binds to (\"0\" disables it). Added by fracpilot's test wrapper.")
	if err := app.Run(); err != nil { // parses flag.CommandLine, this flag included
		fmt.Printf("Error while running the app: %v", err)
		os.Exit(1)
	}
}
