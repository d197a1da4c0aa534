//go:build tools

// Package tools names the KAI-Scheduler commands the tests start, so that `go mod tidy` keeps the
// modules they need. Not built: the script builds each cmd/ package with `go build`.
// Left out: cmd/resourcereservation (cgo + NVML; kwok fakes its work), cmd/operator (deploys the
// others in a real cluster), cmd/scalingpod (the image nodescaleadjuster's scaling pods would run).
package tools

import (
	_ "github.com/NVIDIA/KAI-scheduler/cmd/admission"
	_ "github.com/NVIDIA/KAI-scheduler/cmd/binder"
	_ "github.com/NVIDIA/KAI-scheduler/cmd/nodescaleadjuster"
	_ "github.com/NVIDIA/KAI-scheduler/cmd/podgroupcontroller"
	_ "github.com/NVIDIA/KAI-scheduler/cmd/podgrouper"
	_ "github.com/NVIDIA/KAI-scheduler/cmd/queuecontroller"
	_ "github.com/NVIDIA/KAI-scheduler/cmd/scheduler"
)
