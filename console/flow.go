package console

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/stepready/stepready/internal/readmodel"
)

// waitingText is a key's waiting count, "N+" when flow_status stopped counting at its share of the read budget.
func waitingText(k readmodel.FlowKey) string {
	if k.WaitingCapped {
		return strconv.Itoa(k.Waiting) + "+"
	}
	return strconv.Itoa(k.Waiting)
}

// genericTable is a table of text cells (the flow page's).
type genericTable struct {
	Exists  bool
	Empty   string
	Columns []string
	Rows    [][]string
}

// flowPage lists the flow control keys (SPEC §14) from stepready.flow_status, the read model `scheduler flow
// list` prints: limits, steps in flight, tokens, waiting steps and what holds them back.
func (c *Console) flowPage(w http.ResponseWriter, r *http.Request) {
	keys, err := readmodel.Flow(r.Context(), c.pool)
	if err != nil {
		c.fail(w, "flow limits", err)
		return
	}
	t := genericTable{Exists: true,
		Empty: "No flow control keys: no step names a concurrency or rate key, and no operator override is set.",
		Columns: []string{"key", "concurrency limit", "in flight", "rate", "tokens", "next token", "waiting",
			"blocked", "override"}}
	for _, k := range keys {
		conc, rate, tokens, next := "-", "-", "-", "-"
		if k.ConcurrencyLimit != nil {
			conc = strconv.Itoa(*k.ConcurrencyLimit)
		}
		if k.RateLimit != nil && k.RatePeriodMS != nil {
			rate = fmt.Sprintf("%d per %s", *k.RateLimit, time.Duration(*k.RatePeriodMS)*time.Millisecond)
		}
		if k.Tokens != nil {
			tokens = strconv.FormatFloat(*k.Tokens, 'f', 2, 64)
		}
		if k.NextTokenAt != nil {
			next = k.NextTokenAt.UTC().Format("15:04:05.000")
		}
		blocked, override := "-", "no"
		if k.Blocked != "" {
			blocked = k.Blocked
		}
		if k.Overridden {
			override = "yes"
		}
		t.Rows = append(t.Rows, []string{k.Key, conc, strconv.Itoa(k.InFlight), rate, tokens, next,
			waitingText(k), blocked, override})
	}
	c.render(w, r, "table", "Flow limits", "flow", t)
}
