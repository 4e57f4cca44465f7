// Package examples holds the example task templates that `scheduler demo` (and so `make run`) loads: one YAML
// file per template, in the task definition format of docs/functions.md. They are embedded in the scheduler binary, so
// the demo works from any directory; `scheduler demo --examples DIR` loads another directory instead.
package examples

import "embed"

// FS holds every *.yaml file of this directory.
//
//go:embed *.yaml
var FS embed.FS
