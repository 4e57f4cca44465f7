package store

import (
	"context"
	"fmt"
)

// StepPosition returns the 0-based position of a step among the steps of its task in id order. For a task made
// by stepready.create_task it is the step's index in the definition's `steps` array (create_task inserts them
// in that order); for plain INSERTs it is the insertion order. The executor names a step this way in a message
// that must read like the one creation-time validation gives (`steps[2] "fetch": …`).
func StepPosition(ctx context.Context, db DBTX, stepID int64) (int, error) {
	var n int
	err := db.QueryRow(ctx, `SELECT count(*) FROM stepready.steps s
		WHERE s.task_id = (SELECT task_id FROM stepready.steps WHERE id = $1) AND s.id < $1`, stepID).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("store: position of step %d: %w", stepID, err)
	}
	return n, nil
}
