package console

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepready/stepready/internal/readmodel"
)

// hub is the console's one source of live updates: a single goroutine per console process reads the step
// events written since its last look (a range of the step_events primary key, so each poll costs what is new,
// not what exists) every interval, and fans the task ids out to every open event stream of those tasks, however
// many browsers are open. The reads go through readmodel.EventCursor, which misses no event that commits late. Polling was chosen over LISTEN: it needs no trigger on step_events (nothing added to
// the claim/complete hot path) and no dedicated connection, at the price of up to one interval of delay
// (300 ms by default, within SPEC §16's one second).
type hub struct {
	pool     *pgxpool.Pool
	interval time.Duration
	log      *slog.Logger

	mu    sync.Mutex
	subs  map[int64]map[chan struct{}]struct{}
	read  int64 // the highest event id read so far (tests wait on it)
	polls int   // polls done (tests wait on it)
}

func newHub(pool *pgxpool.Pool, interval time.Duration, log *slog.Logger) *hub {
	return &hub{pool: pool, interval: interval, log: log, subs: map[int64]map[chan struct{}]struct{}{}}
}

// subscribe returns a channel that receives (without blocking the hub; coalesced) when task id has new events.
func (h *hub) subscribe(id int64) (chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	h.mu.Lock()
	if h.subs[id] == nil {
		h.subs[id] = map[chan struct{}]struct{}{}
	}
	h.subs[id][ch] = struct{}{}
	h.mu.Unlock()
	return ch, func() {
		h.mu.Lock()
		delete(h.subs[id], ch)
		if len(h.subs[id]) == 0 {
			delete(h.subs, id)
		}
		h.mu.Unlock()
	}
}

func (h *hub) run(ctx context.Context) {
	cursor, err := readmodel.NewEventCursor(ctx, h.pool)
	if err != nil {
		if ctx.Err() == nil {
			h.log.Warn("console: live updates: first read failed", "err", err)
		}
		cursor = readmodel.NewEventCursorAt(0)
	}
	ticker := time.NewTicker(h.interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		// The cursor also finds an event whose transaction committed after a later one's.
		seen, err := cursor.Poll(ctx, h.pool, 10_000, time.Now())
		if err != nil {
			if ctx.Err() == nil {
				h.log.Warn("console: live updates: poll failed", "err", err)
			}
			continue
		}
		h.mu.Lock()
		h.polls++
		for _, s := range seen {
			h.read = max(h.read, s.ID)
			for ch := range h.subs[s.TaskID] {
				select {
				case ch <- struct{}{}:
				default:
				}
			}
		}
		h.mu.Unlock()
	}
}

// events is the server-sent event stream of /events?task=ID: an event "changed" whenever the task has new step
// events. The task page's script then fetches the page again and swaps its live fragment.
func (c *Console) events(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.URL.Query().Get("task"), 10, 64)
	if err != nil || id <= 0 {
		http.Error(w, "task: want a positive task id", http.StatusBadRequest)
		return
	}
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	ch, unsubscribe := c.live.subscribe(id)
	defer unsubscribe()
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = fmt.Fprint(w, "retry: 1000\n\n")
	flusher.Flush()
	keepalive := time.NewTicker(15 * time.Second)
	defer keepalive.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-c.ctx.Done():
			return
		case <-keepalive.C:
			_, _ = fmt.Fprint(w, ": keepalive\n\n")
		case <-ch:
			_, _ = fmt.Fprintf(w, "event: changed\ndata: %d\n\n", id)
		}
		flusher.Flush()
	}
}

// readUpTo reports whether the poller has read event id, and how many polls it has done.
func (h *hub) readUpTo(id int64) (bool, int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.read >= id, h.polls
}
