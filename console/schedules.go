package console

import (
	"net/http"

	"github.com/stepready/stepready/schedules"
)

// schedulesPage lists the cron schedules (SPEC §15) as `scheduler schedule list` reads them.
func (c *Console) schedulesPage(w http.ResponseWriter, r *http.Request) {
	list, err := schedules.List(r.Context(), c.pool)
	if err != nil {
		c.fail(w, "schedules", err)
		return
	}
	c.render(w, r, "schedules", "Schedules", "schedules", list)
}
