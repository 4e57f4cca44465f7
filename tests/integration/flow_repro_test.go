package integration

import (
	"fmt"
	"math/rand/v2"
	"time"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFlowReproTwoClaimers(t *testing.T) {
	for _, keys := range [][2]string{{"big", "small"}, {"zbig", "asmall"}, {"", "small"}, {"big", ""}, {"big", "a"}} {
		t.Run(keys[0]+"-"+keys[1], func(t *testing.T) {
			b := lcSetup(t)
			b.exec(`INSERT INTO stepready.tasks (name) VALUES ('big'), ('small')`)
			b.exec(`INSERT INTO stepready.steps (task_id, name, handler, concurrency_key, concurrency_limit)
				SELECT 1, 'b' || g, 'h', NULLIF($1, ''), CASE WHEN $1 <> '' THEN 100000 END FROM generate_series(1, 1000) g`, keys[0])
			b.exec(`INSERT INTO stepready.steps (task_id, name, handler, concurrency_key, concurrency_limit)
				SELECT 1, 'o' || g, 'h', 'other' || (g % 5), 100000 FROM generate_series(1, 1000) g`)
			var mu sync.Mutex
			var seq []int64
			arrived := -1
			smallDone := 0
			var wg sync.WaitGroup
			for c := range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					worker := fmt.Sprintf("w%d", c)
					type run struct {
						id      int64
						attempt int
					}
					var inflight []run
					for {
						mu.Lock()
						stop := smallDone >= 20
						if arrived < 0 && len(seq) >= 10 {
							arrived = len(seq)
							mu.Unlock()
							b.exec(`INSERT INTO stepready.steps (task_id, name, handler, concurrency_key, concurrency_limit)
								SELECT 2, 's' || g, 'h', NULLIF($1, ''), CASE WHEN $1 <> '' THEN 100000 END FROM generate_series(1, 20) g`, keys[1])
							mu.Lock()
						}
						mu.Unlock()
						if stop {
							return
						}
						if free := 2 - len(inflight); free > 0 {
							tx, err := b.db.Pool.Begin(b.ctx)
							require.NoError(t, err)
							rows, err := tx.Query(b.ctx, `SELECT step_id, c.task_id, attempt, COALESCE(s.concurrency_key, '') FROM stepready.claim_and_start_steps($1, $2, 60000, $3) c JOIN stepready.steps s ON s.id = step_id`, free, worker, lcBase)
							require.NoError(t, err)
							for rows.Next() {
								var id, task int64
								var att int
								var key string
								require.NoError(t, rows.Scan(&id, &task, &att, &key))
								inflight = append(inflight, run{id, att})
								cls := int64(0)
								if task == 2 {
									cls = 2
									smallDone++
								} else if key == keys[0] {
									cls = 1
								}
								mu.Lock()
								seq = append(seq, cls)
								mu.Unlock()
							}
							require.NoError(t, rows.Err())
							time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
							require.NoError(t, tx.Commit(b.ctx))
						}
						if len(inflight) > 0 {
							r := inflight[0]
							inflight = inflight[1:]
							b.exec(`SELECT stepready.complete_step($1, $2, '{}', $3)`, r.id, r.attempt, lcBase)
						}
					}
				}()
			}
			wg.Wait()
			big := 0
			for _, task := range seq[arrived:] {
				if task == 1 {
					big++
				}
			}
			t.Logf("big starts after small arrived, until small's 20 started: %d (seq %v)", big, seq[arrived:])
		})
	}
}
