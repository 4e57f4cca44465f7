package demo

import "time"

// cursor remembers which events were shown. Identity values are handed out at insert and transactions commit
// in any order, so reading `id > last id read` could miss an event of a transaction that committed late. The
// cursor keeps floor (every id up to it was shown or given up on) and the ids shown above it; the account reads
// from floor, so a late event is still found.
type cursor struct {
	floor    int64
	seen     map[int64]bool
	gapSince time.Time // when floor+1 was first found missing below shown ids
}

// take records id and reports whether it is new.
func (c *cursor) take(id int64) bool {
	if id <= c.floor || c.seen[id] {
		return false
	}
	if c.seen == nil {
		c.seen = map[int64]bool{}
	}
	c.seen[id] = true
	return true
}

// advance moves floor over the shown ids that follow it. A missing id below shown ones is waited for gapWait
// (its transaction may still commit); after that the cursor gives up on every missing id below the lowest
// shown one (rolled back: identity values are not reused).
func (c *cursor) advance(now time.Time) {
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
		if now.Sub(c.gapSince) < gapWait {
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
