//go:build tools

// Package tools pins the helm command the box builds, so `go mod tidy` keeps it.
package tools

import _ "helm.sh/helm/v4/cmd/helm"
