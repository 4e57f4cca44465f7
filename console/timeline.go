package console

import (
	"fmt"
	"strings"
	"time"

	"github.com/stepready/stepready/internal/readmodel"
)

// timelineBar is one attempt drawn on the task's timeline.
type timelineBar struct {
	X, Y, W int
	Label   string
	Outcome string
}

// timeline is a task's attempts drawn over time, one lane per step.
type timeline struct {
	Width, Height int
	Bars          []timelineBar
	Lanes         []timelineLane
	Span          string
}

type timelineLane struct {
	Y    int
	Name string
}

// drawTimeline lays out one lane per step that has attempts and one bar per attempt, x proportional to time
// from the first attempt's start; the gaps between bars of a lane are the backoff waits.
func drawTimeline(steps []readmodel.Step, attempts []readmodel.Attempt, now time.Time) timeline {
	const laneH, labelW, plotW = 22, 150, 700
	tl := timeline{Width: labelW + plotW + 20}
	if len(attempts) == 0 {
		return tl
	}
	start, end := attempts[0].Started, attempts[0].Started
	for _, a := range attempts {
		e := now
		if a.Ended != nil {
			e = *a.Ended
		}
		start = minTime(start, a.Started)
		end = maxTime(end, e)
	}
	span := end.Sub(start)
	if span <= 0 {
		span = time.Millisecond
	}
	tl.Span = span.Round(time.Millisecond).String()
	lane := map[int64]int{}
	for _, s := range steps {
		for _, a := range attempts {
			if a.StepID == s.ID {
				lane[s.ID] = len(tl.Lanes)
				tl.Lanes = append(tl.Lanes, timelineLane{Y: len(tl.Lanes)*laneH + 15, Name: s.Name})
				break
			}
		}
	}
	for _, a := range attempts {
		e := now
		if a.Ended != nil {
			e = *a.Ended
		}
		x := labelW + int(float64(plotW)*float64(a.Started.Sub(start))/float64(span))
		wd := max(int(float64(plotW)*float64(e.Sub(a.Started))/float64(span)), 3)
		tl.Bars = append(tl.Bars, timelineBar{X: x, Y: lane[a.StepID]*laneH + 4, W: wd,
			Label:   fmt.Sprintf("attempt %d: %s", a.Attempt, strings.TrimPrefix(a.Outcome, "attempt.")),
			Outcome: strings.ReplaceAll(a.Outcome, ".", "-")})
	}
	tl.Height = len(tl.Lanes)*laneH + 10
	return tl
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
