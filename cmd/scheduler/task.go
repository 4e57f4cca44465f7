package main

import "github.com/spf13/cobra"

// newTaskCommand builds `scheduler task`: create tasks, inspect them and operate on them.
func newTaskCommand(_ *globalOptions) *cobra.Command {
	var o dbOptions
	cmd := &cobra.Command{
		Use:   "task",
		Short: "Create, inspect and operate tasks: create, list, show, events, cancel, pause, resume, reset",
	}
	addDBFlags(cmd, &o)
	cmd.AddCommand(newTaskCreateCommand(&o), newTaskListCommand(&o), newTaskShowCommand(&o), newTaskEventsCommand(&o))
	cmd.AddCommand(newTaskOperatorCommands(&o)...)
	return cmd
}
