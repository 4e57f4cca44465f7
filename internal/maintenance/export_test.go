package maintenance

// The election lock keys, for tests that play another instance holding a round.
const (
	LockLeaseReaper      = lockLeaseReaper
	LockTaskPruner       = lockTaskPruner
	LockFlowKeyPruner    = lockFlowKeyPruner
	LockScheduleEnqueuer = lockScheduleEnqueuer
	LockBacklogExporter  = lockBacklogExporter
)
