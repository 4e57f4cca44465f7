package maintenance_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/internal/maintenance"
)

// The flow key pruner deletes idle flow keys in batches until one comes back short, on the elected instance
// only.
func TestFlowKeyPrunerPrunesIdleKeys(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.exec(`INSERT INTO stepready.flow_state (key) SELECT 'k' || g FROM generate_series(1, 5) g`)
	p, err := maintenance.NewFlowKeyPruner(b.env, maintenance.FlowKeyPrunerConfig{Batch: 2})
	require.NoError(t, err)

	release := b.holdLock(maintenance.LockFlowKeyPruner)
	n, err := p.RunOnce(b.ctx)
	require.NoError(t, err)
	require.Zero(t, n)
	require.Equal(t, 5, b.count(`SELECT count(*) FROM stepready.flow_state`))
	release()

	n, err = p.RunOnce(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 5, n, "batches of 2 until one comes back short")
	require.Zero(t, b.count(`SELECT count(*) FROM stepready.flow_state`))
}
