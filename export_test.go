package stepready

// SetCreateTasksBatch makes CreateTasks send at most n definitions per create_tasks call until restore is called.
func SetCreateTasksBatch(n int) (restore func()) {
	old := createTasksBatch
	createTasksBatch = n
	return func() { createTasksBatch = old }
}
