package pgcluster

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
)

// MinMajorVersion is the oldest PostgreSQL major version stepready supports.
const MinMajorVersion = 15

// binDir is a directory holding initdb, pg_ctl and postgres of one PostgreSQL major version.
type binDir struct {
	dir   string
	major int
}

func (b binDir) path(program string) string { return filepath.Join(b.dir, program) }

// installedBinDirs returns every directory among PATH (where initdb is found) and /usr/lib/postgresql/*/bin that
// holds initdb, pg_ctl and postgres, newest major version first; on a tie, the one in PATH first.
func installedBinDirs() []binDir {
	var candidates []string
	if initdb, err := exec.LookPath("initdb"); err == nil {
		if resolved, err := filepath.EvalSymlinks(initdb); err == nil {
			initdb = resolved
		}
		candidates = append(candidates, filepath.Dir(initdb))
	}
	installed, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	candidates = append(candidates, installed...)

	var dirs []binDir
	for _, dir := range candidates {
		if slices.ContainsFunc(dirs, func(b binDir) bool { return b.dir == dir }) {
			continue
		}
		if !isExecutable(filepath.Join(dir, "initdb")) || !isExecutable(filepath.Join(dir, "pg_ctl")) ||
			!isExecutable(filepath.Join(dir, "postgres")) {
			continue
		}
		major, err := postgresMajorVersion(filepath.Join(dir, "postgres"))
		if err != nil {
			continue
		}
		dirs = append(dirs, binDir{dir: dir, major: major})
	}
	slices.SortStableFunc(dirs, func(a, b binDir) int { return b.major - a.major })
	return dirs
}

// errNoPostgres explains what to install when no usable binaries were found.
var errNoPostgres = errors.New("no initdb, pg_ctl and postgres in PATH or /usr/lib/postgresql/*/bin " +
	"(install PostgreSQL 15 or newer, e.g. apt-get install postgresql)")

// newestBinDir returns the binaries of the newest installed major version, which must be MinMajorVersion or newer.
func newestBinDir() (binDir, error) {
	dirs := installedBinDirs()
	if len(dirs) == 0 {
		return binDir{}, errNoPostgres
	}
	if dirs[0].major < MinMajorVersion {
		return binDir{}, fmt.Errorf("the newest local PostgreSQL is %d (in %s); stepready needs %d or newer",
			dirs[0].major, dirs[0].dir, MinMajorVersion)
	}
	return dirs[0], nil
}

// binDirForMajor returns the binaries of exactly major (a data directory only runs under the major version that
// made it).
func binDirForMajor(major int) (binDir, error) {
	dirs := installedBinDirs()
	for _, b := range dirs {
		if b.major == major {
			return b, nil
		}
	}
	if len(dirs) == 0 {
		return binDir{}, errNoPostgres
	}
	return binDir{}, fmt.Errorf("PostgreSQL %d is not installed (found %d in %s)", major, dirs[0].major, dirs[0].dir)
}

// versionPattern finds the major version in "postgres (PostgreSQL) 15.14 (Debian 15.14-0+deb12u1)".
var versionPattern = regexp.MustCompile(`\(PostgreSQL\) (\d+)`)

// postgresMajorVersion runs `postgres --version` and returns the major version.
func postgresMajorVersion(postgres string) (int, error) {
	out, err := exec.Command(postgres, "--version").Output()
	if err != nil {
		return 0, err
	}
	match := versionPattern.FindSubmatch(out)
	if match == nil {
		return 0, fmt.Errorf("unrecognised version %q", bytes.TrimSpace(out))
	}
	return strconv.Atoi(string(match[1]))
}

// isExecutable reports whether path is a regular file with an execute bit.
func isExecutable(path string) bool {
	info, err := os.Stat(path)
	return err == nil && info.Mode().IsRegular() && info.Mode().Perm()&0o111 != 0
}
