package readmodel

import (
	"context"

	"github.com/stepready/stepready/internal/store"
)

// QueueStat is the backlog of one queue (stepready.queue_stats): ready now, in flight, waiting out a backoff, due
// within a minute, and the scheduling lag.
type QueueStat = store.QueueStat

// Backlog reads the backlog per queue (queue_stats at the database's now), the figures of the console's header
// and of the backlog gauges.
func Backlog(ctx context.Context, q Querier) ([]QueueStat, error) { return store.QueueStats(ctx, q) }

// FlowKey is one flow-control key with its limits, what is in flight and what it holds back (flow_status).
type FlowKey = store.FlowKey

// Flow reads every flow-control key (flow_status), by key: `scheduler flow list`, the console's flow page and
// the flow gauges read the same value.
func Flow(ctx context.Context, q Querier) ([]FlowKey, error) { return store.FlowStatus(ctx, q) }
