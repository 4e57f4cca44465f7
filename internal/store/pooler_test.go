package store

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

func TestUsePoolerQueryMode(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, url string
		set       pgx.QueryExecMode // set in code after parsing (0: not)
		changed   bool
		want      pgx.QueryExecMode
	}{
		{"a plain URL gets the pooler mode", "postgres://u@h/db", 0, true, PoolerQueryExecMode},
		{"a plain keyword/value string too", "host=h user=u dbname=db", 0, true, PoolerQueryExecMode},
		{"a URL naming cache_statement keeps it (PgBouncer 1.21+ with max_prepared_statements)",
			"postgres://u@h/db?default_query_exec_mode=cache_statement", 0, false, pgx.QueryExecModeCacheStatement},
		{"a keyword/value string naming a mode keeps it", "host=h default_query_exec_mode=cache_describe", 0, false,
			pgx.QueryExecModeCacheDescribe},
		{"a mode set in code is kept", "postgres://u@h/db", pgx.QueryExecModeSimpleProtocol, false,
			pgx.QueryExecModeSimpleProtocol},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg, err := pgx.ParseConfig(tc.url)
			require.NoError(t, err)
			if tc.set != 0 {
				cfg.DefaultQueryExecMode = tc.set
			}
			require.Equal(t, tc.changed, UsePoolerQueryMode(cfg))
			require.Equal(t, tc.want, cfg.DefaultQueryExecMode)
		})
	}
}
