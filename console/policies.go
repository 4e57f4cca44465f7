package console

import (
	"fmt"
	"net/http"
	"time"

	"github.com/stepready/stepready/internal/readmodel"
)

// policyView is a preset with its timeline drawn.
type policyView struct {
	readmodel.Policy
	Timeline policyTimeline
}

type policyTimeline struct {
	Width   int
	Marks   []policyMark
	TotalMs int64
}

type policyMark struct {
	X      int
	LabelY int
	Label  string // drawn; empty when it would overlap its neighbour
	Title  string // the attempt's tooltip, always
	Retry  bool
	GapX   int
	GapW   int
	HasGap bool
}

// maxDrawnAttempts bounds a drawn timeline (the CLI's simulate shows up to 1,000).
const maxDrawnAttempts = 50

// policiesPage lists the retry presets, each with the timeline `scheduler policy simulate` prints for it.
func (c *Console) policiesPage(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	list, err := readmodel.Policies(ctx, c.pool)
	if err != nil {
		c.fail(w, "policies", err)
		return
	}
	views := make([]policyView, len(list))
	for i, p := range list {
		sim, err := readmodel.Simulate(ctx, c.pool, p.Name, readmodel.SimulateOptions{MaxAttempts: maxDrawnAttempts})
		if err != nil {
			c.fail(w, "policies", err)
			return
		}
		views[i] = policyView{Policy: p, Timeline: drawPolicy(sim.Timeline)}
	}
	c.render(w, r, "policies", "Retry policies", "policies", views)
}

// drawPolicy places each simulated attempt on a line whose length is the total time to the last attempt. Labels
// alternate above and below the line, and a label too close to the previous one on its side is left out (its
// attempt keeps its mark and tooltip), so labels never overlap.
func drawPolicy(sim []readmodel.SimulatedAttempt) policyTimeline {
	const plotW, x0, minGap = 640, 20, 70
	pt := policyTimeline{Width: plotW + 2*x0 + 60}
	if len(sim) == 0 {
		return pt
	}
	pt.TotalMs = sim[len(sim)-1].StartsAtMs
	scale := func(ms int64) int {
		if pt.TotalMs == 0 {
			return x0
		}
		return x0 + int(float64(plotW)*float64(ms)/float64(pt.TotalMs))
	}
	lastX := [2]int{-minGap, -minGap}
	for i, a := range sim {
		m := policyMark{X: scale(a.StartsAtMs), Label: fmt.Sprintf("#%d", a.Attempt), Retry: a.Retry}
		if a.Retry && a.DelayMs != nil && i+1 < len(sim) {
			m.HasGap, m.GapX, m.GapW = true, m.X, scale(sim[i+1].StartsAtMs)-m.X
			m.Label += " +" + (time.Duration(*a.DelayMs) * time.Millisecond).String()
		}
		m.Title = m.Label
		side := i % 2
		m.LabelY = []int{16, 52}[side]
		if m.X-lastX[side] < minGap {
			m.Label = ""
		} else {
			lastX[side] = m.X
		}
		pt.Marks = append(pt.Marks, m)
	}
	return pt
}
