// Package docs runs the command blocks of README.md and docs/*.md against a fresh database with a scheduler built
// from the tree, and compares what they print with the output the pages show: docs and behaviour cannot drift
// apart without `make test` saying so. How a page marks its blocks: docs/README.md, "How the docs are tested".
package docs

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/tests/integration/pgtest"
)

func TestMain(m *testing.M) {
	code := pgtest.Main(m)
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// repoRoot is the module's root directory (two levels up from this package).
func repoRoot(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	require.True(t, ok)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// pageFiles are the pages the docs test reads: README.md and every docs/*.md, relative to the root.
func pageFiles(t testing.TB) []string {
	t.Helper()
	root := repoRoot(t)
	files := []string{"README.md"}
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	require.NoError(t, err)
	for _, f := range docs {
		rel, err := filepath.Rel(root, f)
		require.NoError(t, err)
		files = append(files, rel)
	}
	sort.Strings(files[1:])
	return files
}

// readPages parses every page.
func readPages(t testing.TB) []*page {
	t.Helper()
	var pages []*page
	for _, f := range pageFiles(t) {
		p, err := readPage(filepath.Join(repoRoot(t), f), f)
		require.NoError(t, err)
		pages = append(pages, p)
	}
	return pages
}

// TestDocsShellBlocksAreMarked holds every shell block of the pages to a decision: run by the docs test, or
// skipped with a reason.
func TestDocsShellBlocksAreMarked(t *testing.T) {
	t.Parallel()
	var problems []string
	tested := 0
	for _, p := range readPages(t) {
		problems = append(problems, checkMarks(p)...)
		for _, b := range p.blocks {
			if b.shell() && b.mark() == "test" {
				tested++
			}
		}
	}
	require.Empty(t, problems, "shell blocks the docs test cannot take as they are:\n%s", strings.Join(problems, "\n"))
	require.GreaterOrEqual(t, tested, 15, "fewer tested command blocks than the pages had when this test was written")
}

// specReference is a reference to a contract outside the repository.
var specReference = regexp.MustCompile(`SPEC(\.md)?\b|§\s*\d|RELIABILITY\b`)

// markdownFiles are every Markdown file of the repository (README.md, docs/, the READMEs of tests/ and
// workers/), relative to the root; directories whose name starts with a dot or is testdata are left out.
func markdownFiles(t testing.TB) []string {
	t.Helper()
	root := repoRoot(t)
	var files []string
	require.NoError(t, filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "bin") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			files = append(files, rel)
		}
		return nil
	}))
	sort.Strings(files)
	return files
}

// TestDocsStandAlone checks that no page sends its reader to a document outside the repository: every rule a
// page cites is written in docs/.
func TestDocsStandAlone(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	var found []string
	for _, f := range markdownFiles(t) {
		data, err := os.ReadFile(filepath.Join(root, f))
		require.NoError(t, err)
		for i, line := range strings.Split(string(data), "\n") {
			if specReference.MatchString(line) {
				found = append(found, fmt.Sprintf("%s:%d: %s", f, i+1, strings.TrimSpace(line)))
			}
		}
	}
	require.Empty(t, found, "references to a contract outside the repository (link the docs page that holds the rule):\n%s",
		strings.Join(found, "\n"))
}

// TestDocsLinks checks every relative link of every Markdown file: the file exists, and a #fragment names a
// heading of the page it points to (GitHub's anchors).
func TestDocsLinks(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	anchors := map[string]map[string]bool{}
	anchorsOf := func(rel string) map[string]bool {
		if a, ok := anchors[rel]; ok {
			return a
		}
		data, err := os.ReadFile(filepath.Join(root, rel))
		require.NoError(t, err)
		anchors[rel] = headingAnchors(string(data))
		return anchors[rel]
	}
	var broken []string
	for _, f := range markdownFiles(t) {
		p, err := readPage(filepath.Join(root, f), f)
		require.NoError(t, err)
		for _, l := range p.links {
			if strings.Contains(l.target, "://") || strings.HasPrefix(l.target, "mailto:") {
				continue
			}
			path, frag, _ := strings.Cut(l.target, "#")
			rel := f
			if path != "" {
				rel = filepath.Clean(filepath.Join(filepath.Dir(f), path))
				if _, err := os.Stat(filepath.Join(root, rel)); err != nil {
					broken = append(broken, fmt.Sprintf("%s:%d: %s: no such file", f, l.line, l.target))
					continue
				}
			}
			if frag != "" && strings.HasSuffix(rel, ".md") && !anchorsOf(rel)[frag] {
				broken = append(broken, fmt.Sprintf("%s:%d: %s: no heading with that anchor in %s", f, l.line, l.target, rel))
			}
		}
	}
	require.Empty(t, broken, "broken links:\n%s", strings.Join(broken, "\n"))
}

// TestDocsRun runs the command blocks of every page, each page in a subtest of its own with a database of its own
// (migrated, nothing else in it), a working directory of its own (holding a link to the repository's examples/,
// as the pages' commands run from the repository's root) and `scheduler` built from the tree first in PATH.
func TestDocsRun(t *testing.T) {
	t.Parallel()
	pages := readPages(t)
	for _, p := range pages {
		if problems := checkMarks(p); len(problems) > 0 {
			continue // TestDocsShellBlocksAreMarked reports them
		}
		runs := false
		for _, b := range p.blocks {
			runs = runs || (b.shell() && b.mark() == "test")
		}
		if !runs {
			continue
		}
		t.Run(strings.TrimSuffix(p.file, ".md"), func(t *testing.T) {
			t.Parallel()
			runPage(t, p)
		})
	}
}

// runPage runs p's blocks in order in one session.
func runPage(t *testing.T, p *page) {
	root := repoRoot(t)
	scheduler := buildScheduler(t, root)
	db := pgtest.New(t)
	dir := t.TempDir()
	require.NoError(t, os.Symlink(filepath.Join(root, "examples"), filepath.Join(dir, "examples")))

	env := []string{"PATH=" + filepath.Dir(scheduler) + string(os.PathListSeparator) + os.Getenv("PATH"),
		"DATABASE_URL=" + db.URL, "HOME=" + dir, "LC_ALL=C.UTF-8", "TZ=UTC"}
	s := newSession(t, dir, env)
	directives := func(ds []directive) {
		for _, d := range ds {
			s.startBackground(fmt.Sprintf("%s:%d", p.file, d.line), d.command, d.until)
		}
	}
	for _, b := range p.blocks {
		directives(b.directives)
		if name := b.fileName(); name != "" && !b.shell() {
			require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(b.text+"\n"), 0o600), b.where())
			continue
		}
		if !b.shell() || b.mark() != "test" {
			continue
		}
		if !b.has("poll") {
			got := s.run(b.where(), b.text)
			if b.output != nil {
				if ok, diff := matchOutput(b.output.text, got); !ok {
					t.Fatalf("%s: %s\ncommands:\n%s\nthey printed:\n%s", b.where(), diff, b.text, got)
				}
			}
			continue
		}
		// test poll: the commands once, then the last one until what it prints matches the page.
		prefix, last, err := splitLast(b.text)
		require.NoError(t, err, b.where())
		if strings.TrimSpace(prefix) != "" {
			s.run(b.where(), prefix)
		}
		deadline := time.Now().Add(pollFor)
		for {
			got := s.run(b.where(), last)
			ok, diff := matchOutput(b.output.text, got)
			if ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: after %s of trying: %s\ncommand:\n%s\nit printed:\n%s", b.where(), pollFor, diff, last, got)
			}
			<-time.After(pollEvery) // the next try of the poll; the deadline above bounds it
		}
	}
	directives(p.trailing)
}

var (
	buildOnce sync.Once
	buildPath string
	buildErr  error
	// buildDir holds the scheduler built for the pages; TestMain removes it.
	buildDir string
)

// buildScheduler builds cmd/scheduler once per test process.
func buildScheduler(t *testing.T, root string) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "stepready-docs-")
		if err != nil {
			buildErr = err
			return
		}
		buildDir = dir
		// go in PATH, else where the project's machines install it (the Makefile adds it to PATH the same way).
		goTool := "go"
		if _, err := exec.LookPath(goTool); err != nil {
			goTool = "/usr/local/go/bin/go"
		}
		buildPath = filepath.Join(dir, "scheduler")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, goTool, "build", "-o", buildPath, "./cmd/scheduler")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/scheduler: %w\n%s", err, out)
		}
	})
	require.NoError(t, buildErr)
	return buildPath
}

// makeTarget is a target of the Makefile that `make help` lists (a line `name: … ## what it does`).
var makeTarget = regexp.MustCompile(`(?m)^([a-zA-Z_-]+):[^\n]*## `)

// TestReadmeNamesEveryMakeTarget holds the README's list of make targets to the Makefile's: every target `make
// help` prints is named in the README, in backquotes.
func TestReadmeNamesEveryMakeTarget(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	makefile, err := os.ReadFile(filepath.Join(root, "Makefile"))
	require.NoError(t, err)
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	require.NoError(t, err)
	targets := makeTarget.FindAllStringSubmatch(string(makefile), -1)
	require.NotEmpty(t, targets)
	var missing []string
	for _, m := range targets {
		if m[1] != "help" && !strings.Contains(string(readme), "`"+m[1]+"`") {
			missing = append(missing, m[1])
		}
	}
	require.Empty(t, missing, "make targets the README does not name (README.md, \"On a fresh machine\")")
}
