package main

import (
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/stepready/stepready/internal/readmodel"
)

// `scheduler policy list` and `scheduler policy simulate`. The timeline is computed by the database with the
// functions the runtime uses (retry_eligible, backoff_delay_ms and the jitter formula of fail_step), so what
// the command prints is what runs.

// maxSimulatedAttempts bounds the timeline.
const maxSimulatedAttempts = 1000

func newPolicyCommand(_ *globalOptions) *cobra.Command {
	var o dbOptions
	cmd := &cobra.Command{
		Use:   "policy",
		Short: "List retry policy presets and simulate their retry timelines",
	}
	addDBFlags(cmd, &o)

	list := &cobra.Command{
		Use:     "list",
		Short:   "List the retry policy presets (stepready.retry_policies)",
		Example: "  scheduler policy list\n  scheduler policy list --output json",
		Args:    usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.withConn(cmd.Context(), func(conn *pgx.Conn, format string) error {
				ps, err := readmodel.Policies(cmd.Context(), conn)
				if err != nil {
					return err
				}
				if format == outputJSON {
					return writeJSON(cmd.OutOrStdout(), ps)
				}
				tw := newTable(cmd.OutOrStdout())
				fmt.Fprintln(tw, "NAME\tMAX ATTEMPTS\tRETRYABLE\tBACKOFF\tBASE MS\tMULTIPLIER\tMAX DELAY MS\tJITTER")
				for _, p := range ps {
					maxDelay := orDash(p.MaxDelayMs)
					if p.MaxDelayMs == nil {
						maxDelay = "uncapped"
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", termSafe(p.Name), orDash(p.MaxAttempts), orDash(p.Retryable),
						orDash(p.Backoff), orDash(p.BaseDelayMs), orDash(p.Multiplier), maxDelay, orDash(p.Jitter))
				}
				return tw.Flush()
			})
		},
	}

	var (
		backoff                          string
		baseDelay, maxDelay              int64
		multiplier, jitter, seed         float64
		attempts                         int
		retryable, uncapped              bool
		flagBackoff, flagBase, flagMax   bool
		flagMult, flagJitter, flagSeed   bool
		flagAttempts, flagRetry, flagCap bool
	)
	simulate := &cobra.Command{
		Use:   "simulate [NAME] [--backoff B] [--base-delay-ms N] [--multiplier X] [--max-delay-ms N] [--jitter J]",
		Short: "Print the exact retry timeline of a preset, or of a policy given by flags",
		Long: "Print the retry timeline of preset NAME (or, without NAME, of the standard preset, as policy resolution\n" +
			"does), with any field overridden by a flag: for each attempt, when it starts (attempts taking no time),\n" +
			"whether a failure is retried (retry_eligible), the backoff (backoff_delay_ms), the jitter sample and the\n" +
			"delay actually waited (the jitter formula of fail_step), and the cumulative wait. Everything is computed\n" +
			"by the database's own functions. Jitter samples are drawn with random() after setseed(--jitter-seed);\n" +
			"without a seed the sample is 0 (no jitter: the longest delays). Failures are assumed retryable by class;\n" +
			"the circuit breaker and Retry-After are not simulated.",
		Example: "  scheduler policy simulate standard\n" +
			"  scheduler policy simulate aggressive --attempts 8\n" +
			"  scheduler policy simulate --backoff linear --base-delay-ms 500 --max-delay-ms 2000 --attempts 6\n" +
			"  scheduler policy simulate patient --jitter 0.5 --jitter-seed 0.42 --output json",
		Args: usageArgs(cobra.MaximumNArgs(1)),
		PreRun: func(cmd *cobra.Command, _ []string) {
			f := cmd.Flags()
			flagBackoff, flagBase, flagMax = f.Changed("backoff"), f.Changed("base-delay-ms"), f.Changed("max-delay-ms")
			flagMult, flagJitter, flagSeed = f.Changed("multiplier"), f.Changed("jitter"), f.Changed("jitter-seed")
			flagAttempts, flagRetry, flagCap = f.Changed("attempts"), f.Changed("retryable"), f.Changed("uncapped")
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			name := "standard"
			if len(args) == 1 {
				name = args[0]
			}
			if flagSeed && (seed < -1 || seed > 1) {
				return usagef("--jitter-seed %v: must be between -1 and 1 (PostgreSQL setseed)", seed)
			}
			if flagAttempts && (attempts < 0 || attempts > maxSimulatedAttempts) {
				return usagef("--attempts %d: must be between 0 and %d", attempts, maxSimulatedAttempts)
			}
			if flagMax && flagCap {
				return usagef("--max-delay-ms and --uncapped: give one")
			}
			// Flags not given stay nil: the preset's value stays.
			var ov readmodel.PolicyOverrides
			if flagAttempts {
				ov.MaxAttempts = new(int32(attempts))
			}
			if flagRetry {
				ov.Retryable = &retryable
			}
			if flagBackoff {
				ov.Backoff = &backoff
			}
			if flagBase {
				ov.BaseDelayMs = &baseDelay
			}
			if flagMult {
				ov.Multiplier = &multiplier
			}
			if flagMax {
				ov.MaxDelayMs = &maxDelay
			}
			ov.Uncapped = flagCap
			if flagJitter {
				ov.Jitter = &jitter
			}
			opts := readmodel.SimulateOptions{Overrides: ov, MaxAttempts: maxSimulatedAttempts}
			if flagSeed {
				opts.Seed = &seed
			}
			return o.withConn(cmd.Context(), func(conn *pgx.Conn, format string) error {
				var sim *readmodel.Simulation
				// setseed and random() share the transaction's session.
				err := pgx.BeginFunc(cmd.Context(), conn, func(tx pgx.Tx) error {
					var err error
					sim, err = readmodel.Simulate(cmd.Context(), tx, name, opts)
					return err
				})
				if err != nil {
					return err
				}
				if format == outputJSON {
					return writeJSON(cmd.OutOrStdout(), sim)
				}
				writeSimulation(cmd, sim)
				return nil
			})
		},
	}
	f := simulate.Flags()
	f.StringVar(&backoff, "backoff", "", "backoff strategy: none, fixed, linear or exponential")
	f.Int64Var(&baseDelay, "base-delay-ms", 0, "base delay in milliseconds")
	f.Float64Var(&multiplier, "multiplier", 0, "exponential multiplier (>= 1)")
	f.Int64Var(&maxDelay, "max-delay-ms", 0, "cap of one delay in milliseconds")
	f.BoolVar(&uncapped, "uncapped", false, "no cap on one delay (max_delay_ms NULL)")
	f.Float64Var(&jitter, "jitter", 0, "jitter, 0..1: a delay is shortened by up to this fraction")
	f.IntVar(&attempts, "attempts", 0, "max_attempts: total attempts including the first")
	f.BoolVar(&retryable, "retryable", true, "whether failures are retried at all")
	f.Float64Var(&seed, "jitter-seed", 0, "seed (-1..1) for the jitter samples, drawn with PostgreSQL random()")
	for _, n := range []string{"backoff", "base-delay-ms", "multiplier", "max-delay-ms", "jitter", "attempts",
		"retryable"} {
		setDefaultText(f, n, "the preset's")
	}
	setDefaultText(f, "jitter-seed", "none: sample 0")
	cmd.AddCommand(list, simulate)
	return cmd
}

func writeSimulation(cmd *cobra.Command, s *readmodel.Simulation) {
	out := cmd.OutOrStdout()
	p := s.Policy
	maxDelay := "uncapped"
	if p.MaxDelayMs != nil {
		maxDelay = fmt.Sprintf("cap %d ms", *p.MaxDelayMs)
	}
	retry := "retryable"
	if p.Retryable != nil && !*p.Retryable {
		retry = "not retryable"
	}
	name := p.Name
	if s.Overridden {
		name += " with flags"
	}
	fmt.Fprintf(out, "policy %s: %s, base %s ms, multiplier %s, %s, jitter %s, max_attempts %s, %s\n", name,
		orDash(p.Backoff), orDash(p.BaseDelayMs), orDash(p.Multiplier), maxDelay, orDash(p.Jitter),
		orDash(p.MaxAttempts), retry)
	tw := newTable(out)
	fmt.Fprintln(tw, "ATTEMPT\tSTARTS AT\tIF IT FAILS\tBACKOFF MS\tSAMPLE\tDELAY MS\tCUMULATIVE MS")
	for _, a := range s.Timeline {
		then := "retry"
		if !a.Retry {
			then = "error: retries exhausted"
			if p.Retryable != nil && !*p.Retryable {
				then = "error: not retryable"
			}
		}
		fmt.Fprintf(tw, "%d\t+%d ms\t%s\t%s\t%s\t%s\t%s\n", a.Attempt, a.StartsAtMs, then, orDash(a.BackoffMs),
			orDash(a.JitterSample), orDash(a.DelayMs), orDash(a.CumulativeMs))
	}
	_ = tw.Flush()
	if len(s.Timeline) == maxSimulatedAttempts {
		fmt.Fprintf(out, "(first %d attempts shown)\n", maxSimulatedAttempts)
	}
}
