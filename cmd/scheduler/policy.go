package main

import (
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"
)

// `scheduler policy list` and `scheduler policy simulate`. The timeline is computed by the database with the
// functions the runtime uses (retry_eligible, backoff_delay_ms and the jitter formula of fail_step), so what
// the command prints is what runs.

type policyRow struct {
	Name        string   `json:"name"`
	MaxAttempts *int32   `json:"max_attempts"`
	Retryable   *bool    `json:"retryable"`
	Backoff     *string  `json:"backoff"`
	BaseDelayMs *int64   `json:"base_delay_ms"`
	Multiplier  *float64 `json:"multiplier"`
	MaxDelayMs  *int64   `json:"max_delay_ms"`
	Jitter      *float64 `json:"jitter"`
}

// simulatedAttempt is one row of the timeline: attempt k starts at StartsAtMs (after the first attempt's
// start, attempts taking no time) and, if it fails, either a retry follows after DelayMs or the step ends.
type simulatedAttempt struct {
	Attempt      int32    `json:"attempt"`
	StartsAtMs   int64    `json:"starts_at_ms"`
	Retry        bool     `json:"retry"`
	BackoffMs    *int64   `json:"backoff_delay_ms"`
	JitterSample *float64 `json:"jitter_sample"`
	DelayMs      *int64   `json:"delay_ms"`
	CumulativeMs *int64   `json:"cumulative_ms"`
}

type simulation struct {
	Policy policyRow `json:"policy"`
	// Overridden is true when flags changed fields of the preset named in Policy.
	Overridden bool               `json:"overridden"`
	Timeline   []simulatedAttempt `json:"timeline"`
}

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
				rows, err := conn.Query(cmd.Context(), `SELECT name, max_attempts, retryable, backoff, base_delay_ms,
					multiplier, max_delay_ms, jitter FROM stepready.retry_policies ORDER BY name`)
				if err != nil {
					return err
				}
				ps, err := pgx.CollectRows(rows, pgx.RowToStructByPos[policyRow])
				if err != nil {
					return err
				}
				if format == outputJSON {
					return writeJSON(cmd.OutOrStdout(), append([]policyRow{}, ps...))
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
			// Flags not given are NULL: the preset's value stays.
			pick := func(set bool, v any) any {
				if set {
					return v
				}
				return nil
			}
			return o.withConn(cmd.Context(), func(conn *pgx.Conn, format string) error {
				sim := &simulation{Timeline: []simulatedAttempt{}, Overridden: flagBackoff || flagBase || flagMax ||
					flagMult || flagJitter || flagAttempts || flagRetry || flagCap}
				err := pgx.BeginFunc(cmd.Context(), conn, func(tx pgx.Tx) error {
					err := tx.QueryRow(cmd.Context(), `SELECT p.name, COALESCE($2, p.max_attempts),
							COALESCE($3, p.retryable), COALESCE($4, p.backoff), COALESCE($5, p.base_delay_ms),
							COALESCE($6, p.multiplier), CASE WHEN $8 THEN NULL ELSE COALESCE($7, p.max_delay_ms) END,
							COALESCE($9, p.jitter)
						FROM stepready.retry_policies p WHERE p.name = $1`,
						name, pick(flagAttempts, attempts), pick(flagRetry, retryable), pick(flagBackoff, backoff),
						pick(flagBase, baseDelay), pick(flagMult, multiplier), pick(flagMax, maxDelay), flagCap,
						pick(flagJitter, jitter)).
						Scan(&sim.Policy.Name, &sim.Policy.MaxAttempts, &sim.Policy.Retryable, &sim.Policy.Backoff,
							&sim.Policy.BaseDelayMs, &sim.Policy.Multiplier, &sim.Policy.MaxDelayMs, &sim.Policy.Jitter)
					if err == pgx.ErrNoRows {
						return fmt.Errorf("no retry policy %q (see `scheduler policy list`)", name)
					} else if err != nil {
						return err
					}
					if flagSeed {
						if _, err := tx.Exec(cmd.Context(), `SELECT setseed($1)`, seed); err != nil {
							return err
						}
					}
					p := sim.Policy
					// Attempt k fails; retry_eligible(k, …) says whether a retry follows (exactly fail_step's
					// exhaustion rule), and the delay is the jittered backoff of attempt k. Samples are drawn in
					// attempt order (the series is generated and read in order, one random() per row).
					rows, err := tx.Query(cmd.Context(), `
						WITH a AS (
							SELECT k, CASE WHEN $8 THEN random() ELSE 0 END AS sample
							  FROM generate_series(1, LEAST(GREATEST(COALESCE($1::int, 3), 1), $9)) AS k
						), d AS (
							SELECT k, stepready.retry_eligible(k, $1, $2) AS retry, sample,
							       stepready.backoff_delay_ms($3, k, $4, $5, $6) AS backoff
							  FROM a
						), j AS (
							SELECT k, retry, sample, backoff,
							       CASE WHEN retry THEN stepready._jittered_delay_ms(backoff, $7, sample) END AS delay
							  FROM d
						)
						SELECT k, COALESCE(sum(delay) OVER (ORDER BY k ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)::bigint,
						       retry, CASE WHEN retry THEN backoff END, CASE WHEN retry AND $8 THEN sample END, delay,
						       CASE WHEN retry THEN sum(delay) OVER (ORDER BY k)::bigint END
						  FROM j ORDER BY k`,
						p.MaxAttempts, p.Retryable, p.Backoff, p.BaseDelayMs, p.Multiplier, p.MaxDelayMs, p.Jitter,
						flagSeed, maxSimulatedAttempts)
					if err != nil {
						return err
					}
					sim.Timeline, err = pgx.CollectRows(rows, pgx.RowToStructByPos[simulatedAttempt])
					return err
				})
				if err != nil {
					return err
				}
				if format == outputJSON {
					return writeJSON(cmd.OutOrStdout(), sim)
				}
				sim.writeTable(cmd)
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

func (s *simulation) writeTable(cmd *cobra.Command) {
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
