package stepready_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready"
)

// The public packages name only public types (issue 28, docs/design-core.md "Where things live"): no exported
// function, method, field, variable, constant or type of them mentions a type of an internal package, which a
// module outside this one could not name. The test reads the packages' source: every exported declaration's
// types are walked for a selector whose package is imported from a path with an internal element.
func TestPublicAPIShowsNoInternalTypes(t *testing.T) {
	t.Parallel()
	for _, dir := range []string{".", "steps", "schedules", "console", "readiness", "rules", "migrations"} {
		t.Run(dir, func(t *testing.T) {
			require.Empty(t, internalMentions(t, dir), "exported declarations of %s naming internal types", dir)
		})
	}
}

// internalMentions returns "file:line: name uses pkg.Type" for every exported declaration of the package in dir
// whose types mention an internal package.
func internalMentions(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	fset := token.NewFileSet()
	var found []string
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.SkipObjectResolution)
		require.NoError(t, err)
		internal := map[string]string{} // local import name → path
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if !strings.Contains("/"+path+"/", "/internal/") {
				continue
			}
			local := filepath.Base(path)
			if imp.Name != nil {
				local = imp.Name.Name
			}
			internal[local] = path
		}
		if len(internal) == 0 {
			continue
		}
		report := func(what string, n ast.Node) {
			if n == nil {
				return
			}
			ast.Inspect(n, func(n ast.Node) bool {
				// Function bodies and initial values are implementation, not API.
				switch n.(type) {
				case *ast.BlockStmt, *ast.CompositeLit, *ast.CallExpr:
					return false
				}
				if sel, ok := n.(*ast.SelectorExpr); ok {
					if id, ok := sel.X.(*ast.Ident); ok && internal[id.Name] != "" {
						found = append(found, fset.Position(sel.Pos()).String()+": "+what+" uses "+
							internal[id.Name]+"."+sel.Sel.Name)
					}
				}
				return true
			})
		}
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() || (d.Recv != nil && !exportedReceiver(d.Recv)) {
					continue
				}
				report(d.Name.Name, d.Type)
				if d.Recv != nil {
					report(d.Name.Name, d.Recv)
				}
			case *ast.GenDecl:
				for _, spec := range d.Specs {
					switch s := spec.(type) {
					case *ast.TypeSpec:
						if s.Name.IsExported() {
							report(s.Name.Name, exportedParts(s.Type))
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							if n.IsExported() {
								report(n.Name, s.Type)
								for _, v := range s.Values {
									report(n.Name, v)
								}
							}
						}
					}
				}
			}
		}
	}
	return found
}

// exportedReceiver reports whether a method's receiver type is exported.
func exportedReceiver(recv *ast.FieldList) bool {
	if recv == nil || len(recv.List) == 0 {
		return false
	}
	typ := recv.List[0].Type
	for {
		switch x := typ.(type) {
		case *ast.StarExpr:
			typ = x.X
		case *ast.IndexExpr:
			typ = x.X
		case *ast.IndexListExpr:
			typ = x.X
		case *ast.Ident:
			return x.IsExported()
		default:
			return false
		}
	}
}

// exportedParts returns the part of a type definition an outside package sees: a struct's exported fields (and
// embedded ones), an interface's methods, any other type whole.
func exportedParts(typ ast.Expr) ast.Node {
	st, ok := typ.(*ast.StructType)
	if !ok {
		return typ
	}
	fields := &ast.FieldList{}
	for _, f := range st.Fields.List {
		if len(f.Names) == 0 {
			fields.List = append(fields.List, f)
			continue
		}
		for _, n := range f.Names {
			if n.IsExported() {
				fields.List = append(fields.List, f)
				break
			}
		}
	}
	return fields
}

// The defaults the root documents are the ones the maintenance services apply.
func TestDefaultsAreTheMaintenanceServices(t *testing.T) {
	t.Parallel()
	for name, v := range stepready.MaintenanceDefaults() {
		require.Equal(t, v[1], v[0], name)
	}
}

// The faces hold no SQL of their own (issue 28): cmd/scheduler and console reach the database through the
// library, internal/readmodel and schedules. A string literal of their non-test Go files that starts like a
// statement fails the test.
func TestFacesHoldNoSQL(t *testing.T) {
	t.Parallel()
	statement := regexp.MustCompile(`^(SELECT|INSERT INTO|UPDATE \w+|DELETE FROM|WITH \w+ AS|CALL|ALTER|CREATE (OR|TABLE|INDEX|FUNCTION))\s`)
	for _, dir := range []string{"cmd/scheduler", "console"} {
		entries, err := os.ReadDir(dir)
		require.NoError(t, err)
		fset := token.NewFileSet()
		for _, e := range entries {
			if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, parser.SkipObjectResolution)
			require.NoError(t, err)
			ast.Inspect(f, func(n ast.Node) bool {
				lit, ok := n.(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					return true
				}
				text, err := strconv.Unquote(lit.Value)
				if err != nil {
					return true
				}
				if statement.MatchString(strings.TrimSpace(text)) {
					t.Errorf("%s: SQL in a face: %.60s", fset.Position(lit.Pos()), text)
				}
				return true
			})
		}
	}
}
