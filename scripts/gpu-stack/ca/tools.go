//go:build tools

// Package tools names cluster-autoscaler's main package (the module root) so that `go mod tidy`
// keeps the modules it needs.
package tools

import _ "k8s.io/autoscaler/cluster-autoscaler"
