package stepready

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stepready/stepready/internal/store"
)

// Wake-ups after commit (docs/design-core.md, "Wake-ups"). The SQL functions send no NOTIFY in the transaction
// that creates, completes or signals: PostgreSQL makes every notifying commit wait for the one before it. The
// library calls that commit their own transaction (db a pool or a connection) wake the daemons afterwards with
// wake_daemons, a NOTIFY in a transaction of its own whose commit does not wait for the WAL flush. Calls given a
// transaction do not: its commit is the caller's, and the daemons see the work through the wake-up counter within
// their probe interval, or at once if the caller calls Wake after its commit.

// Wake tells the daemons listening on stepready_ready that steps may be ready: call it after committing a
// transaction in which you created tasks, sent signals or acted as an operator (CreateTask and the others given a
// transaction do not wake anyone, since they cannot know when you commit). db is a pool or a connection, not
// inside a transaction. Without it the daemons still find the work through the wake-up counter, within their
// probe interval (Config.ProbeInterval, 25 ms by default). Calls that come while another call's wake-up is
// already on its way after theirs are folded into it.
func Wake(ctx context.Context, db DBTX) error {
	return wakeAfterCommit(ctx, db, 0, time.Since(wakeEpoch))
}

// wakeEpoch is the origin of the monotonic instants the wake-up coalescing compares.
var wakeEpoch = time.Now()

// wakeState is, per database handle, the instant the last wake-up was sent.
type wakeState struct{ sent atomic.Int64 }

var (
	wakeStates sync.Map // DBTX → *wakeState
	wakeCount  atomic.Int64
)

// wakeStatesMax bounds wakeStates (handles of pools long closed would otherwise stay in it); past it the map is
// cleared, which costs at most one wake-up per handle that is not folded.
const wakeStatesMax = 1024

// wakeAfter wakes the daemons after a library call committed work that may have readied steps (taskID: one of
// its tasks, 0 for "some task"), unless db is a transaction. Best effort: a failure is not the caller's (its
// work is committed; the counter announces it), so it is dropped.
func wakeAfter(ctx context.Context, db DBTX, taskID int64) {
	if _, inTx := db.(pgx.Tx); inTx {
		return
	}
	_ = wakeAfterCommit(ctx, db, taskID, time.Since(wakeEpoch))
}

// wakeAfterCommit sends wake_daemons on db unless a wake-up sent after committed (an instant on wakeEpoch's
// clock, taken once the caller's commit returned) is already on its way: its NOTIFY commits after the caller's
// commit, so the daemons it wakes see the caller's rows. Ten producers committing together send about one.
func wakeAfterCommit(ctx context.Context, db DBTX, taskID int64, committed time.Duration) error {
	v, loaded := wakeStates.Load(db)
	if !loaded {
		if wakeCount.Add(1) > wakeStatesMax {
			wakeStates.Clear()
			wakeCount.Store(1)
		}
		v, _ = wakeStates.LoadOrStore(db, new(wakeState))
	}
	st := v.(*wakeState)
	for {
		last := st.sent.Load()
		if last > int64(committed) {
			return nil
		}
		if st.sent.CompareAndSwap(last, int64(time.Since(wakeEpoch))) {
			break
		}
	}
	return store.WakeDaemons(ctx, db, taskID)
}
