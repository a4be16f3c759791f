//go:build tools

// Package tools pins the kwok command the box builds, so `go mod tidy` keeps it.
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
