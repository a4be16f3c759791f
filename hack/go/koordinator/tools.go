//go:build tools

// Package tools pins the koord-scheduler command the box builds, so `go mod tidy` keeps it.
package tools

import _ "github.com/koordinator-sh/koordinator/cmd/koord-scheduler"
