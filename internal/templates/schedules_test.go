package templates

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseReadsSchedules(t *testing.T) {
	t.Parallel()
	tmpl, err := Parse("etl.yaml", []byte(`name: etl
run_at: "2031-01-01T00:00:00Z"
steps: [{name: a, handler: noop}]
schedules:
  - {name: nightly, cron: "30 2 * * *", timezone: Europe/Berlin, context: {mode: full}, overlap: skip}
  - {name: other, template: report, cron: "@every 10s"}
`))
	require.NoError(t, err)
	require.Len(t, tmpl.Schedules, 2)
	require.Equal(t, "etl", tmpl.Schedules[0].Template, "defaults to the file's template")
	require.Equal(t, "Europe/Berlin", tmpl.Schedules[0].Timezone)
	require.JSONEq(t, `{"mode": "full"}`, string(tmpl.Schedules[0].Context))
	require.Equal(t, "report", tmpl.Schedules[1].Template)
	require.Equal(t, "allow", tmpl.Schedules[1].Overlap)
	require.NotContains(t, string(tmpl.Definition), "schedules", "not part of the definition")
	require.Contains(t, string(tmpl.Definition), "run_at")

	for _, tc := range []struct{ yaml, want string }{
		{`schedules: {name: x}`, `etl.yaml: schedules: must be a list of schedules`},
		{`schedules: [{name: x, cron: "61 * * * *"}]`, `etl.yaml: schedules[0]: schedule "x": schedules: invalid schedule: cron "61 * * * *"`},
		{`schedules: [{name: x, cron: "@daily", timezone: Nowhere}]`, `schedules[0]: schedule "x": schedules: invalid schedule: timezone "Nowhere"`},
		{`schedules: [{name: x, cron: "@daily", cronn: 1}]`, `schedules[0]: json: unknown field "cronn"`},
		{`schedules: [{name: x, cron: "@daily"}, {name: x, cron: "@hourly"}]`, `schedules[1]: name "x": declared twice`},
	} {
		_, err := Parse("etl.yaml", []byte("name: etl\nsteps: [{name: a, handler: noop}]\n"+tc.yaml+"\n"))
		require.ErrorContains(t, err, tc.want, tc.yaml)
	}
}
