package main

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/spf13/cobra"

	"github.com/stepready/stepready/internal/readmodel"
	"github.com/stepready/stepready/internal/store"
)

// newFlowCommand builds `scheduler flow`: the flow control keys and their operator overrides (SPEC §14).
func newFlowCommand(_ *globalOptions) *cobra.Command {
	var o dbOptions
	cmd := &cobra.Command{
		Use:   "flow",
		Short: "Flow control keys: list them, set or clear an operator's override of their limits",
		Long: "Steps name a concurrency key and a rate key in their definitions (docs/policies.md). `flow list`\n" +
			"shows every key with its limits, steps in flight, tokens left and steps waiting; `flow set` overrides\n" +
			"a key's limits (stepready.flow_limits) from the next claim on, for every daemon.",
	}
	addDBFlags(cmd, &o)
	cmd.AddCommand(newFlowListCommand(&o), newFlowSetCommand(&o))
	return cmd
}

func newFlowListCommand(o *dbOptions) *cobra.Command {
	return &cobra.Command{
		Use:     "list",
		Short:   "List the flow control keys: limits, in flight, tokens, waiting steps",
		Example: "  scheduler flow list\n  scheduler flow list --output json",
		Args:    usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.withConn(cmd.Context(), func(conn *pgx.Conn, format string) error {
				keys, err := store.FlowStatus(cmd.Context(), conn)
				if err != nil {
					return err
				}
				if format == outputJSON {
					if keys == nil {
						keys = []store.FlowKey{}
					}
					return writeJSON(cmd.OutOrStdout(), keys)
				}
				now, err := readmodel.Now(cmd.Context(), conn, nil)
				if err != nil {
					return err
				}
				tw := newTable(cmd.OutOrStdout())
				fmt.Fprintln(tw, "KEY\tCONCURRENCY\tIN FLIGHT\tRATE\tTOKENS\tNEXT TOKEN\tWAITING\tBLOCKED\tOVERRIDE")
				for _, k := range keys {
					conc, rate, tokens, next := "-", "-", "-", "-"
					if k.ConcurrencyLimit != nil {
						conc = strconv.Itoa(*k.ConcurrencyLimit)
					}
					if k.RateLimit != nil && k.RatePeriodMS != nil {
						rate = fmt.Sprintf("%d/%s", *k.RateLimit, time.Duration(*k.RatePeriodMS)*time.Millisecond)
					}
					if k.Tokens != nil {
						tokens = strconv.FormatFloat(*k.Tokens, 'f', 2, 64)
					}
					if k.NextTokenAt != nil {
						next = relative(*k.NextTokenAt, now)
					}
					override := "no"
					if k.Overridden {
						override = "yes"
					}
					blocked := k.Blocked
					if blocked == "" {
						blocked = "-"
					}
					waiting := strconv.Itoa(k.Waiting)
					if k.WaitingCapped {
						waiting += "+" // flow_status stopped counting at the key's share of its read budget
					}
					fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", termSafe(k.Key), conc, k.InFlight, rate, tokens,
						next, waiting, termSafe(blocked), override)
				}
				return tw.Flush()
			})
		},
	}
}

func newFlowSetCommand(o *dbOptions) *cobra.Command {
	var concurrency, rate int
	var period time.Duration
	var clear bool
	cmd := &cobra.Command{
		Use:   "set KEY [--concurrency N] [--rate N --period DURATION] | --clear",
		Short: "Override a key's limits (from the next claim on), or --clear the override",
		Long: "Stores an operator override in stepready.flow_limits: a value given here wins over the limits of\n" +
			"the steps' definitions; a value not given keeps what an earlier override set. --clear removes the\n" +
			"override, and the steps' own limits apply again.",
		Example: "  scheduler flow set tenant:42 --concurrency 2\n" +
			"  scheduler flow set api:github --rate 50 --period 1m\n" +
			"  scheduler flow set tenant:42 --clear",
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			key := args[0]
			fs := cmd.Flags()
			var l store.FlowLimit
			if fs.Changed("concurrency") {
				if concurrency < 1 {
					return usagef("--concurrency must be >= 1, got %d", concurrency)
				}
				l.Concurrency = &concurrency
			}
			if fs.Changed("rate") != fs.Changed("period") {
				return usagef("--rate and --period go together")
			}
			if fs.Changed("rate") {
				if rate < 1 {
					return usagef("--rate must be >= 1, got %d", rate)
				}
				if period < time.Millisecond {
					return usagef("--period must be at least 1ms, got %s", period)
				}
				l.Rate, l.Period = &rate, &period
			}
			if clear == (l.Concurrency != nil || l.Rate != nil) {
				return usagef("give --concurrency and/or --rate with --period, or --clear alone")
			}
			return o.withConn(cmd.Context(), func(conn *pgx.Conn, format string) error {
				if clear {
					had, err := store.ClearFlowLimit(cmd.Context(), conn, key)
					if err != nil {
						return flowError(err)
					}
					if format == outputJSON {
						return writeJSON(cmd.OutOrStdout(), map[string]any{"key": key, "cleared": had})
					}
					if had {
						fmt.Fprintf(cmd.OutOrStdout(), "flow key %s: override cleared\n", termSafe(key))
					} else {
						fmt.Fprintf(cmd.OutOrStdout(), "flow key %s had no override\n", termSafe(key))
					}
					return nil
				}
				if err := store.SetFlowLimit(cmd.Context(), conn, key, l); err != nil {
					return flowError(err)
				}
				if format == outputJSON {
					return writeJSON(cmd.OutOrStdout(), map[string]any{"key": key, "concurrency_limit": l.Concurrency,
						"rate_limit": l.Rate, "rate_period_ms": msOrNil(l.Period)})
				}
				fmt.Fprintf(cmd.OutOrStdout(), "flow key %s: override set (applies from the next claim)\n", termSafe(key))
				return nil
			})
		},
	}
	fs := cmd.Flags()
	fs.IntVar(&concurrency, "concurrency", 0, "at most N steps of the key enqueued or in progress")
	fs.IntVar(&rate, "rate", 0, "at most N starts of the key per --period")
	fs.DurationVar(&period, "period", 0, "the rate limit's period (for example 1s, 1m)")
	fs.BoolVar(&clear, "clear", false, "remove the key's override")
	return cmd
}

func msOrNil(d *time.Duration) *int64 {
	if d == nil {
		return nil
	}
	ms := d.Milliseconds()
	return &ms
}

// flowError makes a refused argument (SQLSTATE 22023) a usage error, and any other refusal the database's
// own message.
func flowError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "22023" {
		return usageError{errors.New(pgErr.Message)}
	}
	return dbError(err)
}
