package maintenance_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/internal/maintenance"
)

// Every service's Config is checked when the Maintainer is built; the error names the service and the field.
func TestMaintainerRefusesBadConfig(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tc := range []struct {
		cfg  maintenance.Config
		want string
	}{
		{maintenance.Config{}, "Env.Pool is required"},
		{maintenance.Config{Env: b.env, LeaseReaper: maintenance.LeaseReaperConfig{Interval: -2}},
			"lease reaper: LeaseReaperConfig.Interval must be > 0, or Off (-1)"},
		{maintenance.Config{Env: b.env, TaskPruner: maintenance.TaskPrunerConfig{RetentionFailed: -time.Hour}},
			"task pruner: TaskPrunerConfig.RetentionFailed must be > 0, or KeepForever (-1)"},
		{maintenance.Config{Env: b.env, FlowKeyPruner: maintenance.FlowKeyPrunerConfig{Batch: -1}},
			"flow key pruner: FlowKeyPrunerConfig.Batch must be >= 1"},
		{maintenance.Config{Env: b.env, ScheduleEnqueuer: maintenance.ScheduleEnqueuerConfig{Timeout: -time.Second}},
			"schedule enqueuer: ScheduleEnqueuerConfig.Timeout must be > 0"},
		{maintenance.Config{Env: b.env, BacklogExporter: maintenance.BacklogExporterConfig{Interval: -time.Minute}},
			"backlog exporter: BacklogExporterConfig.Interval must be > 0"},
	} {
		_, err := maintenance.New(tc.cfg)
		require.ErrorContains(t, err, tc.want)
	}
}

// A started Maintainer runs its services on their own: an expired lease is reaped and a finished task past its
// retention pruned without anyone calling RunOnce; a service set to Off does nothing; Stop is idempotent.
func TestMaintainerRunsItsServices(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.task(1, "default")
	b.exec(`SELECT count(*) FROM stepready.claim_and_start_steps(1, 'dead', 1, now() - interval '1 hour')`)
	done := b.task(1, "default")
	b.exec(`UPDATE stepready.steps SET state = 'complete' WHERE task_id = $1`, done)
	b.exec(`UPDATE stepready.tasks SET completed_at = now() - interval '1 hour' WHERE id = $1`, done)
	b.exec(`INSERT INTO stepready.flow_state (key) VALUES ('idle')`)

	m, err := maintenance.New(maintenance.Config{Env: b.env,
		LeaseReaper:   maintenance.LeaseReaperConfig{Interval: 20 * time.Millisecond},
		TaskPruner:    maintenance.TaskPrunerConfig{Interval: 20 * time.Millisecond, RetentionComplete: time.Minute},
		FlowKeyPruner: maintenance.FlowKeyPrunerConfig{Interval: maintenance.Off},
	})
	require.NoError(t, err)
	require.NoError(t, m.Start(b.ctx))
	deadline := time.Now().Add(30 * time.Second)
	for b.count(`SELECT count(*) FROM stepready.steps WHERE state = 'in_progress'`) > 0 ||
		b.count(`SELECT count(*) FROM stepready.tasks WHERE id = $1`, done) > 0 {
		require.True(t, time.Now().Before(deadline), "the lease was not reaped or the task not pruned")
		<-time.After(10 * time.Millisecond)
	}
	m.Stop()
	m.Stop()
	<-m.Stopped()
	require.Equal(t, 1, b.count(`SELECT count(*) FROM stepready.flow_state`), "the flow key pruner is off")
}

// A Maintainer that was never started stops at once.
func TestMaintainerStopWithoutStart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	m, err := maintenance.New(maintenance.Config{Env: b.env})
	require.NoError(t, err)
	m.Stop()
	<-m.Stopped()
	require.NoError(t, m.Start(b.ctx), "a stopped Maintainer does not start again")
}
