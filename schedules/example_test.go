package schedules_test

import (
	"fmt"
	"time"

	"github.com/stepready/stepready/schedules"
)

// A daily 02:30 in Berlin around the spring DST change: 02:30 does not exist on 29 March 2026, so that day has
// no fire.
func ExampleSpec_Preview() {
	spec, err := schedules.Parse("30 2 * * *", "Europe/Berlin")
	if err != nil {
		panic(err)
	}
	for _, t := range spec.Preview(time.Time{}, time.Date(2026, 3, 27, 12, 0, 0, 0, time.UTC), 3) {
		fmt.Println(t.Format(time.RFC3339), t.In(spec.Location()).Format("Mon 15:04 MST"))
	}
	// Output:
	// 2026-03-28T01:30:00Z Sat 02:30 CET
	// 2026-03-30T00:30:00Z Mon 02:30 CEST
	// 2026-03-31T00:30:00Z Tue 02:30 CEST
}
