package store

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"time"
)

// The bounds of sql/015_bounds.sql on what a claim row hands to River and the Go runtime. The tables hold them with
// CHECK constraints and the insert trigger names the field that breaks one, so a claimed row always meets them;
// these copies let a dispatcher fail alone a row that was written around the constraints (a superuser's write, a
// session with session_replication_role = replica, a restored dump) instead of stopping every claim.

// MaxDurationMS is the longest duration a definition may give, in milliseconds: the largest whole number of
// milliseconds a time.Duration holds (about 292 years). sql/015_bounds.sql's _max_duration_ms() is the same.
const MaxDurationMS = math.MaxInt64 / int64(time.Millisecond)

// riverQueueName is River's own queue name pattern (river v0.51.1, client.go validateQueueName), character for
// character: River refuses a job whose queue does not match it, and with it every job of the same InsertManyTx.
// TestQueueNameRuleIsRiversOwn checks it against River's client.
var riverQueueName = regexp.MustCompile(`^(?:[a-z0-9])+(?:[_|\-]?[a-z0-9]+)*$`)

// riverQueueNameMaxBytes is River's longest queue name.
const riverQueueNameMaxBytes = 64

// CheckQueueName returns why River would refuse name as a queue, or nil. The rule is River's: 1 to 64 bytes of
// lowercase ASCII letters and digits, in groups joined by one "_", "-" or "|".
func CheckQueueName(name string) error {
	switch {
	case name == "default":
		return nil
	case name == "":
		return errors.New("must be a non-empty string")
	case len(name) > riverQueueNameMaxBytes:
		return fmt.Errorf("must be a River queue name of at most %d characters, got %s", riverQueueNameMaxBytes,
			shown(name))
	case !riverQueueName.MatchString(name):
		return fmt.Errorf("must be a River queue name: lowercase letters and digits, in groups joined by one "+
			`"_", "-" or "|" (as in "emails", "high-priority"), got %s`, shown(name))
	}
	return nil
}

// shown quotes at most 80 bytes of s for a message.
func shown(s string) string {
	if len(s) <= 80 {
		return strconv.Quote(s)
	}
	return fmt.Sprintf("%s… (%d bytes)", strconv.Quote(s[:80]), len(s))
}

// Check returns why the runtime cannot use the claimed row, or nil: a value that did not decode, a queue River
// refuses, or a timeout that no time.Duration holds. The error names the field. A dispatcher fails such a step
// alone, with class deterministic, and goes on with the rest of its batch.
func (c ClaimedStep) Check() error {
	if c.DecodeErr != nil {
		return c.DecodeErr
	}
	if err := CheckQueueName(c.Queue); err != nil {
		return fmt.Errorf("queue: %w", err)
	}
	if c.TimeoutMS != nil && (*c.TimeoutMS < 1 || *c.TimeoutMS > MaxDurationMS) {
		return fmt.Errorf("timeout_ms: must be between 1 and %d ms (the longest duration a Go time.Duration holds, "+
			"about 292 years), got %d", MaxDurationMS, *c.TimeoutMS)
	}
	return nil
}
