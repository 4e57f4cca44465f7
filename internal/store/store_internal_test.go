package store

import (
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/tests/integration/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// A claim row that does not decode (here a NULL where a value is required) is one row with DecodeErr, which Check
// returns; the rows after it decode as usual. (A scan error would have closed the result: every step of the claim
// would have been lost with it.)
func TestClaimRowsThatDoNotDecodeStandAlone(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	rows, err := db.Pool.Query(t.Context(), `SELECT * FROM (VALUES
		(1::bigint, 10::bigint, 'a'::text, 'h'::text, '{}'::jsonb, 1, 1, NULL::bigint, 'default'::text, 0, '{}'::jsonb, NULL::jsonb,
		 '{}'::jsonb, NULL::jsonb, NULL::int),
		(2, 20, NULL, 'h', '{}', 5, 3, 1000, 'default', 0, '{}', NULL, '{}', NULL, NULL),
		(3, 30, 'c', 'h', '{"x": 1}', 1, 1, NULL, 'emails', 2, '{}', '[]', '{"a": [1]}', '"e"', 4)) AS r`)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, scanClaimedStarted)
	require.NoError(t, err)
	require.Len(t, got, 3)

	require.NoError(t, got[0].Check())
	require.Equal(t, ClaimedStep{StepID: 1, TaskID: 10, Name: "a", Handler: "h", Input: []byte(`{}`), Queue: "default"},
		got[0].ClaimedStep)

	require.EqualError(t, got[1].Check(), "the claim row of step 2 does not decode: no value for name")
	require.Equal(t, int64(2), got[1].StepID)
	require.Equal(t, 3, got[1].Started.Attempt, "the attempt is still known: the step can be failed")
	require.Equal(t, 5, got[1].Started.Token)

	require.NoError(t, got[2].Check())
	require.Equal(t, "c", got[2].Name)
	require.Equal(t, 2, got[2].Started.Iteration)
	require.JSONEq(t, `{"x": 1}`, string(got[2].Started.Input))
	require.JSONEq(t, `{"a": [1]}`, string(got[2].Started.Deps))
	require.JSONEq(t, `"e"`, string(got[2].Started.Element))
	require.Equal(t, 4, got[2].Started.Index)
	require.Equal(t, -1, got[0].Started.Index, "not an element")
}

// Check refuses what the runtime cannot use, naming the field.
func TestClaimedStepCheck(t *testing.T) {
	t.Parallel()
	ms := func(v int64) *int64 { return &v }
	require.NoError(t, ClaimedStep{Queue: "default", TimeoutMS: ms(MaxDurationMS)}.Check())
	require.NoError(t, ClaimedStep{Queue: "a|b-c_d"}.Check())
	require.ErrorContains(t, ClaimedStep{Queue: "Bad Queue!"}.Check(), `queue: must be a River queue name`)
	require.ErrorContains(t, ClaimedStep{Queue: ""}.Check(), `queue: must be a non-empty string`)
	require.ErrorContains(t, ClaimedStep{Queue: "default", TimeoutMS: ms(MaxDurationMS + 1)}.Check(),
		"timeout_ms: must be between 1 and 9223372036854 ms")
	require.ErrorContains(t, ClaimedStep{Queue: "default", TimeoutMS: ms(0)}.Check(), "timeout_ms")
}
