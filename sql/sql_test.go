package sql_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	stepreadysql "github.com/stepready/stepready/sql"
)

func TestFilesAreEveryEmbeddedSQLFileInNameOrder(t *testing.T) {
	t.Parallel()
	files, err := stepreadysql.Files()
	require.NoError(t, err)
	require.NotEmpty(t, files)

	names := make([]string, 0, len(files))
	for _, file := range files {
		require.True(t, strings.HasSuffix(file.Name, ".sql"), file.Name)
		require.NotEmpty(t, strings.TrimSpace(file.Contents), "%s is empty", file.Name)
		names = append(names, file.Name)
	}
	require.True(t, slices.IsSorted(names), "%v", names)
}
