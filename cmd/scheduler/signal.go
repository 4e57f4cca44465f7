package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/internal/readmodel"
)

// The signal commands (SPEC §20, docs/signals.md): faces of stepready.SendSignal / SendSignalToKey and of the
// read model's mailbox (readmodel.Signals).

// cliSignalActor is the actor the CLI's signals record (details.actor of their signal.received events).
const cliSignalActor = "cli"

// signalPayloadChars is how many characters of a payload `signal list` prints in its table.
const signalPayloadChars = 60

func newSignalCommand(_ *globalOptions) *cobra.Command {
	var o dbOptions
	cmd := &cobra.Command{
		Use:   "signal",
		Short: "Send a signal to a task's waiting step, list a task's signals: send, list",
	}
	addDBFlags(cmd, &o)
	cmd.AddCommand(newSignalSendCommand(&o), newSignalListCommand(&o))
	return cmd
}

// signalSent is what `signal send --output json` prints.
type signalSent struct {
	readmodel.Signal
	// Delivered is true when a waiting step took the signal at once, false when it was buffered for a step that
	// has not started waiting yet.
	Delivered bool `json:"delivered"`
}

func newSignalSendCommand(o *dbOptions) *cobra.Command {
	var key, payload, idempotencyKey string
	cmd := &cobra.Command{
		Use:   "send (TASK_ID | --key KEY) NAME [--payload JSON] [--idempotency-key K]",
		Short: "Send signal NAME to a task: the step waiting for it completes with the payload as its output",
		Long: "Send signal NAME with --payload (a JSON document, default {}) to a task (stepready.send_signal), named by\n" +
			"its id or, with --key, by its idempotency key (stepready.send_signal_to_key). The oldest step of the task\n" +
			"waiting for NAME completes at once with the payload as its output; when none waits yet, the signal is\n" +
			"buffered for the first that starts to. Refused for a finished task, or when no step that is not finished\n" +
			"waits for NAME (nothing is buffered that nobody will read). --idempotency-key makes a retry safe: the\n" +
			"same key to the same task returns the first signal's id. Prints the signal's id and whether it was\n" +
			"delivered now or buffered.",
		Example: "  scheduler signal send 12 approval --payload '{\"approved_by\": \"ann\"}'\n" +
			"  scheduler signal send --key order-7 paid --idempotency-key evt_123",
		Args: usageArgs(cobra.RangeArgs(1, 2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			var taskID int64
			var name string
			switch {
			case key != "" && len(args) == 1:
				name = args[0]
			case key == "" && len(args) == 2:
				id, err := parseID("TASK_ID", args[0])
				if err != nil {
					return err
				}
				taskID, name = id, args[1]
			default:
				return usagef("want TASK_ID NAME, or --key KEY NAME")
			}
			body := json.RawMessage(strings.TrimSpace(payload))
			if len(body) == 0 {
				body = json.RawMessage(`{}`)
			}
			if !json.Valid(body) {
				return usagef("--payload %q: not a JSON document", payload)
			}
			return o.withConn(cmd.Context(), func(conn *pgx.Conn, format string) error {
				opts := stepready.SignalOptions{IdempotencyKey: idempotencyKey, Actor: cliSignalActor}
				var id int64
				var err error
				if key != "" {
					id, err = stepready.SendSignalToKey(cmd.Context(), conn, key, name, body, opts)
				} else {
					id, err = stepready.SendSignal(cmd.Context(), conn, taskID, name, body, opts)
				}
				if err != nil {
					return err
				}
				g, err := readmodel.ReadSignal(cmd.Context(), conn, id)
				if err != nil {
					return err
				}
				sent := signalSent{Signal: g, Delivered: g.ConsumedBy != nil}
				if format == outputJSON {
					return writeJSON(cmd.OutOrStdout(), sent)
				}
				out := cmd.OutOrStdout()
				if g.ConsumedBy != nil {
					fmt.Fprintf(out, "signal %d %q delivered to step %d (%s) of task %d\n", g.ID, g.Name, *g.ConsumedBy,
						orDash(g.ConsumedByName), g.TaskID)
				} else {
					fmt.Fprintf(out, "signal %d %q buffered for task %d: the first step that starts waiting for it takes it\n",
						g.ID, g.Name, g.TaskID)
				}
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&key, "key", "", "the task's idempotency key, instead of TASK_ID")
	cmd.Flags().StringVar(&payload, "payload", "{}", "the signal's payload: a JSON document, the waiting step's output")
	cmd.Flags().StringVar(&idempotencyKey, "idempotency-key", "",
		"the signal's idempotency key: a repeat with the same key to the same task returns the first id")
	return cmd
}

func newSignalListCommand(o *dbOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "list TASK_ID",
		Short: "List a task's signals: id, name, when, consumed by which step and when, payload",
		Long: "List the signals sent to a task (stepready.signals), oldest first: each one's id, name, when it was sent,\n" +
			"the step that consumed it and when (\"buffered\" while no step has taken it), and its payload (cut in the\n" +
			"table; whole with --output json).",
		Example: "  scheduler signal list 12\n  scheduler signal list 12 --output json",
		Args:    usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseID("TASK_ID", args[0])
			if err != nil {
				return err
			}
			return o.withConn(cmd.Context(), func(conn *pgx.Conn, format string) error {
				sigs, err := readmodel.Signals(cmd.Context(), conn, id)
				if err != nil {
					return err
				}
				if format == outputJSON {
					return writeJSON(cmd.OutOrStdout(), sigs)
				}
				out := cmd.OutOrStdout()
				if len(sigs) == 0 {
					fmt.Fprintf(out, "task %d has no signals\n", id)
					return nil
				}
				tw := newTable(out)
				fmt.Fprintln(tw, "ID\tNAME\tSENT\tCONSUMED BY\tCONSUMED AT\tKEY\tPAYLOAD")
				for _, g := range sigs {
					by, at := "buffered", "-"
					if g.ConsumedBy != nil {
						by = fmt.Sprintf("%d (%s)", *g.ConsumedBy, orDash(g.ConsumedByName))
						at = g.ConsumedAt.UTC().Format(time.RFC3339Nano)
					}
					fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", g.ID, termSafe(g.Name),
						g.CreatedAt.UTC().Format(time.RFC3339Nano), termSafe(by), at, termSafe(orDash(g.IdempotencyKey)),
						termSafe(clipText(string(g.Payload), signalPayloadChars)))
				}
				return tw.Flush()
			})
		},
	}
}

// clipText cuts s to n characters, with "…" when it was longer.
func clipText(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n]) + "…"
}
