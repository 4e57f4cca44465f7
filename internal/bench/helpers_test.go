package bench

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestPercentile(t *testing.T) {
	ms := func(vs ...int) []time.Duration {
		ds := make([]time.Duration, len(vs))
		for i, v := range vs {
			ds[i] = time.Duration(v) * time.Millisecond
		}
		return ds
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = 100 - i // 100 … 1, unsorted on purpose
	}
	for _, tc := range []struct {
		name string
		ds   []time.Duration
		p    float64
		want time.Duration
	}{
		{"no values", nil, 50, 0},
		{"one value, p50", ms(7), 50, 7 * time.Millisecond},
		{"one value, p99", ms(7), 99, 7 * time.Millisecond},
		{"two values, p50 is the lower", ms(9, 3), 50, 3 * time.Millisecond},
		{"two values, p51 is the upper", ms(9, 3), 51, 9 * time.Millisecond},
		{"hundred, p50", ms(hundred...), 50, 50 * time.Millisecond},
		{"hundred, p99", ms(hundred...), 99, 99 * time.Millisecond},
		{"hundred, p100 is the max", ms(hundred...), 100, 100 * time.Millisecond},
		{"hundred, tiny p is the min", ms(hundred...), 0.001, 1 * time.Millisecond},
		{"two hundred, p99 is rank 198", ms(append(hundred, hundred...)...), 99, 99 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := append([]time.Duration(nil), tc.ds...)
			require.Equal(t, tc.want, percentile(tc.ds, tc.p))
			require.Equal(t, in, tc.ds, "percentile must not reorder its input")
		})
	}
}

const sampleStatus = `Name:	scheduler
Umask:	0022
State:	S (sleeping)
Pid:	4242
VmPeak:	 1258064 kB
VmSize:	 1257808 kB
VmHWM:	   41236 kB
VmRSS:	   38112 kB
Threads:	9
`

func TestStatusKB(t *testing.T) {
	for _, tc := range []struct {
		name, status, field string
		want                int64
		err                 string
	}{
		{name: "VmHWM", status: sampleStatus, field: "VmHWM", want: 41236},
		{name: "VmRSS", status: sampleStatus, field: "VmRSS", want: 38112},
		{name: "zero", status: "VmHWM:\t0 kB\n", field: "VmHWM", want: 0},
		{name: "last line without newline", status: "Name:\tx\nVmHWM:\t12 kB", field: "VmHWM", want: 12},
		{name: "prefix of another field does not match", status: "VmHWMX:\t5 kB\n", field: "VmHWM", err: "no field VmHWM"},
		{name: "missing", status: "Name:\tx\n", field: "VmHWM", err: "no field VmHWM"},
		{name: "empty document", status: "", field: "VmRSS", err: "no field VmRSS"},
		{name: "no unit", status: "VmHWM:\t12\n", field: "VmHWM", err: `want "<number> kB", got "12"`},
		{name: "other unit", status: "VmHWM:\t12 MB\n", field: "VmHWM", err: `want "<number> kB"`},
		{name: "not a number", status: "VmHWM:\tlots kB\n", field: "VmHWM", err: `"lots" is not a size in kB`},
		{name: "negative", status: "VmHWM:\t-1 kB\n", field: "VmHWM", err: `"-1" is not a size in kB`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := statusKB([]byte(tc.status), tc.field)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestTailBuffer(t *testing.T) {
	b := &tailBuffer{max: 8}
	n, err := b.Write([]byte("abc"))
	require.NoError(t, err)
	require.Equal(t, 3, n)
	require.Equal(t, "abc", b.String())
	_, _ = b.Write([]byte("defgh"))
	require.Equal(t, "abcdefgh", b.String(), "exactly max bytes are all kept")
	_, _ = b.Write([]byte("ij"))
	require.Equal(t, "cdefghij", b.String(), "the oldest bytes go first")
	_, _ = b.Write([]byte(strings.Repeat("z", 20)))
	require.Equal(t, strings.Repeat("z", 8), b.String())
}

// mergeReport keeps every profile's rows, in order, and lists each profile once. (The first version made the first
// profile's report the merged one and emptied its rows before appending them: a run printed no row at all.)
func TestMergeReportKeepsEveryProfilesRows(t *testing.T) {
	t.Parallel()
	durable := &Report{Size: "quick", Profiles: []string{ProfileDurable}, Options: Options{ServerDefaults: true},
		Rows: []Row{{Profile: ProfileDurable, Scenario: "a"}, {Profile: ProfileDurable, Scenario: "b"}}}
	fast := &Report{Size: "quick", Profiles: []string{ProfileFast}, Rows: []Row{{Profile: ProfileFast, Scenario: "a"}}}
	all := mergeReport(nil, ProfileDurable, 3, durable)
	all = mergeReport(all, ProfileFast, 4, fast)
	all = mergeReport(all, "none", 5, nil)
	require.Equal(t, []string{ProfileDurable, ProfileFast}, all.Profiles)
	require.Equal(t, map[string]float64{ProfileDurable: 3, ProfileFast: 4}, all.Load)
	var got []string
	for _, r := range all.Rows {
		got = append(got, r.Profile+"/"+r.Scenario)
	}
	require.Equal(t, []string{"durable/a", "durable/b", "fast/a"}, got)
	require.False(t, all.Options.ServerDefaults)
	require.Len(t, durable.Rows, 2, "the profile's own report is left as it was")
}
