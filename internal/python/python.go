// Package python finds the Python 3 interpreter that runs stepready's Python worker (workers/python) and its
// tests: one that imports psycopg 3 as Debian packages it (python3-psycopg), and pytest for the tests.
//
// The python3 first in PATH is not always that interpreter: a version manager's shim (pyenv, asdf) runs a Python
// of its own that does not see Debian's packages. So the candidates are tried in this order, and the first that
// imports every module asked for wins:
//
//  1. $STEPREADY_PYTHON, when set (and then only it: an explicit choice that does not work is an error, not a
//     reason to take another interpreter);
//  2. /usr/bin/python3, Debian's;
//  3. python3 in PATH.
package python

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"
)

// EnvVar names the interpreter to use, bypassing the search. The Makefile sets it to what it found.
const EnvVar = "STEPREADY_PYTHON"

// DebianPython is the interpreter Debian's python3-* packages install their modules for.
const DebianPython = "/usr/bin/python3"

// probeTimeout bounds one interpreter's import check.
const probeTimeout = 30 * time.Second

// Find returns the path of the first candidate interpreter (see the package documentation) that imports every
// module of modules. The error says what each candidate answered and how to install the modules.
func Find(modules ...string) (string, error) {
	candidates := []string{DebianPython, "python3"}
	if env := strings.TrimSpace(os.Getenv(EnvVar)); env != "" {
		candidates = []string{env}
	}
	var tried []string
	for _, c := range candidates {
		path, err := exec.LookPath(c)
		if err != nil {
			tried = append(tried, fmt.Sprintf("%s: not found", c))
			continue
		}
		if err := imports(path, modules); err != nil {
			tried = append(tried, fmt.Sprintf("%s: %v", path, err))
			continue
		}
		return path, nil
	}
	return "", fmt.Errorf("python: no Python 3 interpreter imports %s (tried %s); install Debian's packages "+
		"(apt-get install python3-psycopg python3-pytest) or set %s to an interpreter that imports them",
		strings.Join(modules, ", "), strings.Join(tried, "; "), EnvVar)
}

// imports checks that python imports every module, returning the last line of its error when it does not.
func imports(python string, modules []string) error {
	if len(modules) == 0 {
		modules = []string{"sys"}
	}
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, python, "-c", "import "+strings.Join(modules, ", ")).CombinedOutput()
	if err == nil {
		return nil
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if last := strings.TrimSpace(lines[len(lines)-1]); last != "" {
		return errors.New(last)
	}
	return err
}
