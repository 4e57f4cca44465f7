package integration

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/schedules"
)

type schedBundle struct {
	*lifecycleBundle
}

func schedSetup(t *testing.T) *schedBundle {
	t.Helper()
	return &schedBundle{lifecycleBundle: lifecycleSetup(t)}
}

func (b *schedBundle) put(d schedules.Definition) {
	b.t.Helper()
	_, err := schedules.Put(b.ctx, b.db.Pool, d, false)
	require.NoError(b.t, err)
}

func (b *schedBundle) get(name string) schedules.Schedule {
	b.t.Helper()
	s, err := schedules.Get(b.ctx, b.db.Pool, name)
	require.NoError(b.t, err)
	return s
}

// The schedules table of SPEC §15 refuses what its constraints forbid.
func TestSchedulesTableConstraints(t *testing.T) {
	t.Parallel()
	b := schedSetup(t)
	b.exec(`INSERT INTO stepready.schedules (name, template, cron) VALUES ('ok', 't', '@hourly')`)
	var tz, overlap, ctx string
	var paused bool
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT timezone, overlap, context::text, paused
		FROM stepready.schedules WHERE name = 'ok'`).Scan(&tz, &overlap, &ctx, &paused))
	require.Equal(t, []any{"UTC", "allow", "{}", false}, []any{tz, overlap, ctx, paused})
	for _, bad := range []string{
		`INSERT INTO stepready.schedules (name, template, cron) VALUES ('ok', 't', '@hourly')`,
		`INSERT INTO stepready.schedules (name, template, cron, overlap) VALUES ('o', 't', '@hourly', 'queue')`,
		`INSERT INTO stepready.schedules (name, template, cron) VALUES ('', 't', '@hourly')`,
		`INSERT INTO stepready.schedules (name, template, cron) VALUES ('n', NULL, '@hourly')`,
		`INSERT INTO stepready.schedules (name, template, cron) VALUES ('n', 't', NULL)`,
		`INSERT INTO stepready.schedules (name, template, cron, context) VALUES ('n', 't', '@hourly', '[1]')`,
	} {
		_, err := b.db.Pool.Exec(b.ctx, bad)
		require.Error(t, err, bad)
	}
}

func TestSchedulePutValidates(t *testing.T) {
	t.Parallel()
	b := schedSetup(t)
	for _, tc := range []struct {
		d    schedules.Definition
		want string
	}{
		{schedules.Definition{Name: "x", Template: "t", Cron: "nope"}, `schedule "x": schedules: invalid schedule: cron "nope"`},
		{schedules.Definition{Name: "x", Template: "t", Cron: "@daily", Timezone: "Nowhere/Land"}, `timezone "Nowhere/Land"`},
		{schedules.Definition{Name: "x", Template: "t", Cron: "@daily", Overlap: "queue"}, "overlap: must be allow or skip"},
		{schedules.Definition{Name: "x", Cron: "@daily"}, "template: is required"},
		{schedules.Definition{Name: "x", Template: "t", Cron: "@daily", Context: json.RawMessage(`[1]`)}, "context: must be a JSON object"},
	} {
		_, err := schedules.Put(b.ctx, b.db.Pool, tc.d, false)
		require.ErrorIs(t, err, schedules.ErrInvalid)
		require.ErrorContains(t, err, tc.want)
	}
	b.put(schedules.Definition{Name: "x", Template: "t", Cron: "@daily"})
	_, err := schedules.Put(b.ctx, b.db.Pool, schedules.Definition{Name: "x", Template: "t", Cron: "@daily"}, false)
	require.ErrorIs(t, err, schedules.ErrExists)
	require.NotNil(t, b.get("x").NextFireAt)
}
