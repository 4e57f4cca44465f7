package readmodel

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Event is one row of a task's history (stepready.step_events).
type Event struct {
	ID     int64 `json:"id"`
	TaskID int64 `json:"task_id"`
	// TaskName is filled by EventCursor.Poll only (the task's own pages know it).
	TaskName  string          `json:"task_name,omitempty"`
	StepID    *int64          `json:"step_id"`
	StepName  *string         `json:"step_name"`
	Attempt   *int32          `json:"attempt"`
	Iteration *int32          `json:"iteration"`
	Event     string          `json:"event"`
	FromState *string         `json:"from_state"`
	ToState   *string         `json:"to_state"`
	Details   json.RawMessage `json:"details"`
	At        time.Time       `json:"at"`
}

func scanEvent(row pgx.Row, e *Event) error {
	return row.Scan(&e.ID, &e.TaskID, &e.StepID, &e.StepName, &e.Attempt, &e.Iteration, &e.Event, &e.FromState,
		&e.ToState, &e.Details, &e.At)
}

// Events returns a page of task taskID's events (of step stepID only, unless 0), newest first: at most limit,
// older than before (0: the newest); more says that older ones follow.
func Events(ctx context.Context, q Querier, taskID, stepID, before int64, limit int) (events []Event, more bool, err error) {
	return eventsPage(ctx, q, taskID, stepID, before, limit)
}

func eventsPage(ctx context.Context, q Querier, taskID, stepID, before int64, limit int) ([]Event, bool, error) {
	if limit <= 0 {
		return nil, false, fmt.Errorf("readmodel: events: limit %d: must be more than 0", limit)
	}
	events, err := collect(ctx, q, "events", scanEvent, taskID, optID(before), limit+1, optID(stepID))
	if err != nil {
		return nil, false, err
	}
	if len(events) > limit {
		return events[:limit], true, nil
	}
	return events, false, nil
}

// Timeline returns every event of task taskID, oldest first.
func Timeline(ctx context.Context, q Querier, taskID int64) ([]Event, error) {
	return collect(ctx, q, "timeline", scanEvent, taskID)
}

// TaskTimeline reads every event of task taskID, oldest first, in one snapshot; a task that does not exist is an
// error wrapping ErrNotFound.
func TaskTimeline(ctx context.Context, db Beginner, taskID int64) ([]Event, error) {
	var events []Event
	err := Snapshot(ctx, db, func(tx pgx.Tx) error {
		var exists bool
		if err := tx.QueryRow(ctx, query("task_exists"), taskID).Scan(&exists); err != nil {
			return fmt.Errorf("readmodel: task exists: %w", err)
		}
		if !exists {
			return notFoundf("task %d does not exist", taskID)
		}
		var err error
		events, err = Timeline(ctx, tx, taskID)
		return err
	})
	return events, err
}

// EventCursor follows the events written after it was made, for live views. Identity values are handed out at
// insert and transactions commit in any order, so "id > the last id read" would miss an event whose
// transaction committed after a later one. The cursor keeps a floor (every id up to it was seen or given up on)
// and the ids seen above it, reads from the floor, and gives up on a missing id below seen ones only after
// GapWait (its transaction may still commit; after that it rolled back: identity values are never reused).
type EventCursor struct {
	// GapWait is how long a missing id below seen ones is waited for (default DefaultGapWait).
	GapWait time.Duration

	floor    int64
	seen     map[int64]bool
	gapSince time.Time
}

// DefaultGapWait is how long an EventCursor waits for a late-committing event: far longer than the transactions
// that write events (short lifecycle calls).
const DefaultGapWait = 10 * time.Second

// NewEventCursor returns a cursor positioned after the newest event.
func NewEventCursor(ctx context.Context, q Querier) (*EventCursor, error) {
	var last int64
	if err := q.QueryRow(ctx, query("last_event_id")).Scan(&last); err != nil {
		return nil, fmt.Errorf("readmodel: last event id: %w", err)
	}
	return &EventCursor{floor: last, GapWait: DefaultGapWait}, nil
}

// NewEventCursorAt returns a cursor that has seen every event up to id floor.
func NewEventCursorAt(floor int64) *EventCursor {
	return &EventCursor{floor: floor, GapWait: DefaultGapWait}
}

// Poll returns the events not seen before, with their task's name, oldest first, at most limit (the rest at the
// next Poll); now is the caller's clock, used only to time the wait for a missing id.
func (c *EventCursor) Poll(ctx context.Context, q Querier, limit int, now time.Time) ([]Event, error) {
	events, err := collect(ctx, q, "new_events", func(row pgx.Row, e *Event) error {
		return row.Scan(&e.ID, &e.TaskID, &e.TaskName, &e.StepID, &e.StepName, &e.Attempt, &e.Iteration, &e.Event,
			&e.FromState, &e.ToState, &e.Details, &e.At)
	}, c.floor, limit+len(c.seen))
	if err != nil {
		return nil, err
	}
	fresh := events[:0]
	for _, e := range events {
		if c.take(e.ID) {
			fresh = append(fresh, e)
			if len(fresh) == limit {
				break
			}
		}
	}
	c.advance(now)
	return fresh, nil
}

// take records id and reports whether it is new.
func (c *EventCursor) take(id int64) bool {
	if id <= c.floor || c.seen[id] {
		return false
	}
	if c.seen == nil {
		c.seen = map[int64]bool{}
	}
	c.seen[id] = true
	return true
}

// advance moves the floor over the seen ids that follow it; a missing id below seen ones is waited for GapWait,
// then given up on (with every other missing id below the lowest seen one).
func (c *EventCursor) advance(now time.Time) {
	for {
		if c.seen[c.floor+1] {
			delete(c.seen, c.floor+1)
			c.floor++
			c.gapSince = time.Time{}
			continue
		}
		if len(c.seen) == 0 {
			c.gapSince = time.Time{}
			return
		}
		if c.gapSince.IsZero() {
			c.gapSince = now
			return
		}
		if now.Sub(c.gapSince) < c.GapWait {
			return
		}
		lowest := int64(-1)
		for id := range c.seen {
			if lowest < 0 || id < lowest {
				lowest = id
			}
		}
		c.floor = lowest - 1
		c.gapSince = time.Time{}
	}
}
