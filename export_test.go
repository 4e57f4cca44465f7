package stepready

import (
	"time"

	"github.com/stepready/stepready/internal/maintenance"
)

// SetCreateTasksBatch makes CreateTasks send at most n definitions per create_tasks call until restore is called.
func SetCreateTasksBatch(n int) (restore func()) {
	old := createTasksBatch
	createTasksBatch = n
	return func() { createTasksBatch = old }
}

// The public defaults are written in the root (go doc shows their values, not an internal package) and must be
// the maintenance services' own: TestDefaultsAreTheMaintenanceServices compares them.
var maintenanceDefaults = map[string][2]time.Duration{
	"ReapIntervalDefault":      {ReapIntervalDefault, maintenance.LeaseReaperIntervalDefault},
	"RetentionCompleteDefault": {RetentionCompleteDefault, maintenance.RetentionCompleteDefault},
	"RetentionFailedDefault":   {RetentionFailedDefault, maintenance.RetentionFailedDefault},
	"PruneIntervalDefault":     {PruneIntervalDefault, maintenance.TaskPrunerIntervalDefault},
	"ScheduleIntervalDefault":  {ScheduleIntervalDefault, maintenance.ScheduleEnqueuerIntervalDefault},
	"BacklogIntervalDefault":   {BacklogIntervalDefault, maintenance.BacklogExporterIntervalDefault},
	"Off":                      {Off, maintenance.Off},
	"KeepForever":              {KeepForever, maintenance.KeepForever},
}

// MaintenanceDefaults returns, per public constant, its value and the maintenance service's.
func MaintenanceDefaults() map[string][2]time.Duration { return maintenanceDefaults }
