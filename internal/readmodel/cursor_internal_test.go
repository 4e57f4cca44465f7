package readmodel

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestCursorFindsLateEventsAndGivesUpOnGaps(t *testing.T) {
	t.Parallel()
	c := NewEventCursorAt(10)
	c.GapWait = 2 * time.Second
	now := time.Now()

	require.True(t, c.take(11))
	require.True(t, c.take(13)) // 12 is not committed yet
	require.False(t, c.take(13), "shown once")
	require.False(t, c.take(9), "below the floor")
	c.advance(now)
	require.Equal(t, int64(11), c.floor, "the floor waits below the gap")

	require.True(t, c.take(12), "the late event is still found")
	c.advance(now.Add(time.Second))
	require.Equal(t, int64(13), c.floor)
	require.Empty(t, c.seen)

	// 14 and 15 never appear (rolled back); 16 does.
	require.True(t, c.take(16))
	c.advance(now)
	require.Equal(t, int64(13), c.floor)
	c.advance(now.Add(c.GapWait - time.Millisecond))
	require.Equal(t, int64(13), c.floor, "still waiting")
	c.advance(now.Add(c.GapWait))
	require.Equal(t, int64(16), c.floor, "gave up on 14 and 15")
	require.Empty(t, c.seen)
}

// Every face shows a step's last error as "class: message", and none once the step has succeeded.
func TestLastErrorText(t *testing.T) {
	t.Parallel()
	doc := []byte(`{"class": "permanent", "message": "card\n  declined", "attempt": 2}`)
	require.Equal(t, "permanent: card declined", Step{State: "error", LastError: doc}.LastErrorText())
	require.Equal(t, "permanent: card declined", Step{State: "waiting_for_retry", LastError: doc}.LastErrorText())
	require.Empty(t, Step{State: "complete", LastError: doc}.LastErrorText(), "an old error of a step that then succeeded")
	require.Empty(t, Step{State: "resolved_manually", LastError: doc}.LastErrorText())
	require.Empty(t, Step{State: "error"}.LastErrorText())
	require.Equal(t, "transient", ErrorText([]byte(`{"class": "transient"}`)))
}
