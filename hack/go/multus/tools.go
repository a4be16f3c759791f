//go:build tools

// Package tools pins the Multus command the box builds, so `go mod tidy` keeps it.
package tools

import _ "gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus"
