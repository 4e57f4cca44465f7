package dispatch

import (
	"context"

	"github.com/stepready/stepready/internal/store"
)

// Dispatcher hands claimed steps to workers. Implementations: Direct (an in-process pool) and River (jobs in the
// claim's transaction).
type Dispatcher interface {
	// Free returns how many more steps it can take now (never negative).
	Free(ctx context.Context) (int, error)
	// Dispatch claims up to limit ready steps and hands them on; it returns how many it claimed and next_claim_at
	// read in the claim's transaction before the claim (the poller arms its timer from it).
	Dispatch(ctx context.Context, limit int) (int, store.NextDue, error)
	// Freed is signalled (without blocking) whenever capacity is freed.
	Freed() <-chan struct{}
}

// signal sends on a 1-buffered channel without blocking: one pending wake-up is enough.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
