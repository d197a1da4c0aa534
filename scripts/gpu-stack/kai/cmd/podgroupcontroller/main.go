// kai-podgroupcontroller: KAI-Scheduler v0.12.0's cmd/podgroupcontroller/main.go, line for line,
// plus one assignment that makes its --metrics-bind-address flag work. Upstream declares the flag
// (cmd/podgroupcontroller/app/options.go line 32: Options.MetricsAddr, default ":8080") but
// app.Run never passes it to ctrl.NewManager (app/app.go lines 66-83 set only the scheme, cache,
// health probe and leader election), so controller-runtime v0.21.0 binds its default
// metricsserver.DefaultBindAddress, ":8080" (pkg/metrics/server/server.go lines 45 and 164-166),
// whatever the flag says, as KAI's nodescaleadjuster does. That default is an exported package
// variable read when app.Run builds the manager: set it from the flag before calling app.Run.
package main

import (
	"flag"
	"fmt"
	"os"

	"go.uber.org/zap/zapcore"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/NVIDIA/KAI-scheduler/cmd/podgroupcontroller/app"
)

func main() {
	options := app.InitOptions(nil)
	config := ctrl.GetConfigOrDie()

	opts := zap.Options{
		Development: true,
		TimeEncoder: zapcore.ISO8601TimeEncoder,
		Level:       zapcore.Level(-1 * options.LogLevel),
	}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	metricsserver.DefaultBindAddress = options.MetricsAddr // the one line upstream lacks

	ctx := ctrl.SetupSignalHandler()
	if err := app.Run(options, config, ctx); err != nil {
		fmt.Printf("Error while running the app: %v", err)
		os.Exit(1)
	}
}
