package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

// runStubMessage is what `scheduler run` prints until the daemon exists.
const runStubMessage = "the daemon arrives with the scheduler issue (#3)"

// newRunCommand builds `scheduler run`. For now it is a stub that says when the daemon arrives and succeeds.
func newRunCommand(_ *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "run",
		Short: "Run the scheduler daemon (not yet: it arrives with issue #3)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintln(cmd.OutOrStdout(), runStubMessage)
			return nil
		},
	}
}
