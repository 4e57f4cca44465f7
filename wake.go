package stepready

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

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
	if !claimWake(db, time.Since(wakeEpoch)) {
		return nil
	}
	return store.WakeDaemons(ctx, db, 0)
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

// wakeTimeout bounds one wake-up sent in the background.
const wakeTimeout = 10 * time.Second

// wakeAfter wakes the daemons after a library call committed work that may have readied steps (taskID: one of
// its tasks, 0 for "some task"), unless db is a transaction. On a pool, in the background: the caller does not wait for it
// (its commit can queue behind another transaction's NOTIFY, which holds PostgreSQL's notify lock through its WAL
// flush). Best effort: a failure is not the caller's (its work is committed; the counter announces it), so it is
// dropped.
func wakeAfter(ctx context.Context, db DBTX, taskID int64) {
	if _, inTx := db.(pgx.Tx); inTx {
		return
	}
	if !claimWake(db, time.Since(wakeEpoch)) {
		return
	}
	if _, pool := db.(*pgxpool.Pool); !pool {
		// A connection serves one query at a time, and its owner may use or close it as soon as we return.
		_ = store.WakeDaemons(ctx, db, taskID)
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), wakeTimeout)
		defer cancel()
		_ = store.WakeDaemons(ctx, db, taskID)
	}()
}

// claimWake says whether the caller must send a wake-up on db: not when one was sent after committed (an instant
// on wakeEpoch's clock, taken once the caller's commit returned), whose NOTIFY commits after the caller's commit,
// so that the daemons it wakes see the caller's rows. Ten producers committing together send about one. When it
// returns true, the caller's wake-up counts as sent now.
func claimWake(db DBTX, committed time.Duration) bool {
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
			return false
		}
		if st.sent.CompareAndSwap(last, int64(time.Since(wakeEpoch))) {
			return true
		}
	}
}
