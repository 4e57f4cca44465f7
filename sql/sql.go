// Package sql embeds stepready's behaviour: every SQL function and trigger, one concern per file
// (NNN_concern.sql).
//
// Unlike the versioned schema in package migrations, these files are not versioned: each one is written with
// CREATE OR REPLACE so that it can be applied again over any earlier copy of itself. migrations.Up applies all of
// them, in file-name order and in a single transaction, after the versioned migrations on every run, so a
// changed function ships without a new schema version. A file whose function changes its parameters or result
// columns starts with a DROP FUNCTION IF EXISTS of the old signature.
package sql

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"slices"
	"strings"
)

// FS holds every *.sql file of this directory, embedded at build time. Files lists them in the order in which
// they must be applied.
//
//go:embed *.sql
var FS embed.FS

// File is one embedded SQL file.
type File struct {
	// Name is the file name without directory, for example "050_readiness.sql". It orders the files and names
	// the file in errors.
	Name string

	// Contents is the complete text of the file. It may hold several statements; run it with the simple query
	// protocol (pgx Exec without arguments).
	Contents string
}

// Files returns every embedded SQL file in lexical order of its name, which is the order in which they are
// applied: a file may use what an earlier file created.
func Files() ([]File, error) {
	entries, err := fs.ReadDir(FS, ".")
	if err != nil {
		return nil, fmt.Errorf("sql: list embedded files: %w", err)
	}

	files := make([]File, 0, len(entries))
	for _, entry := range entries {
		if entry.IsDir() || !strings.HasSuffix(entry.Name(), ".sql") {
			continue
		}
		contents, err := fs.ReadFile(FS, entry.Name())
		if err != nil {
			return nil, fmt.Errorf("sql: read embedded file %s: %w", entry.Name(), err)
		}
		files = append(files, File{Name: entry.Name(), Contents: string(contents)})
	}

	slices.SortFunc(files, func(a, b File) int { return strings.Compare(a.Name, b.Name) })
	return files, nil
}

// Digest identifies this build's functions and triggers: a hash of every file's name and contents, in order.
// migrations.Up records it on the stepready schema, so a binary can tell whether the database's functions are its
// own (migrations.Check).
func Digest() (string, error) {
	files, err := Files()
	if err != nil {
		return "", err
	}
	h := sha256.New()
	for _, f := range files {
		fmt.Fprintf(h, "%s\x00%d\x00%s", f.Name, len(f.Contents), f.Contents)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}
