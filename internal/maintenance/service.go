package maintenance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepready/stepready/internal/metrics"
)

// Off, as a service's Interval, turns the service off. It is -1 everywhere (River's convention): zero values in
// a Config take the defaults, so zero cannot mean off.
const Off time.Duration = -1

// Defaults shared by the services that work in batches.
const (
	// BatchDefault is how many rows one batch handles at most.
	BatchDefault = 1000
	// TimeoutDefault bounds one batch (one statement, one transaction); a batch that takes longer is cancelled
	// and retried in the next round.
	TimeoutDefault = 30 * time.Second
)

// Between two batches of one round a service pauses for a random time in [pauseMin, pauseMax): long enough for
// the locks of a large backlog to be taken as many short transactions, short enough that 10,000 rows take well
// under a second of pauses.
const (
	pauseMin = 5 * time.Millisecond
	pauseMax = 50 * time.Millisecond
)

// staggerStep separates the first rounds of the services a Maintainer starts, so that they do not all run in
// the same instant (a random part of staggerStep is added to each).
const staggerStep = 50 * time.Millisecond

// Env is what every service uses.
type Env struct {
	// Pool is the database. Required.
	Pool *pgxpool.Pool
	// Logger receives the service's logs (nil: discarded).
	Logger *slog.Logger
	// Metrics receives the service's measurements (nil: none).
	Metrics *metrics.Metrics
}

func (e Env) validate() error {
	if e.Pool == nil {
		return errors.New("maintenance: Env.Pool is required")
	}
	return nil
}

func (e Env) withDefaults() Env {
	if e.Logger == nil {
		e.Logger = slog.New(slog.DiscardHandler)
	}
	return e
}

// service is what a Maintainer runs: rounds, with a pause between them.
type service interface {
	// name is the service's name in logs.
	name() string
	// every is the pause between two rounds; Off (negative) means the service is off.
	every() time.Duration
	// round runs one round. A positive wait overrides every() until the next round.
	round(ctx context.Context) (wait time.Duration, err error)
}

// run runs s's rounds until ctx ends, the first after delay. Round errors are logged, never fatal.
func run(ctx context.Context, log *slog.Logger, s service, delay time.Duration) {
	timer := time.NewTimer(delay)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		wait, err := s.round(ctx)
		if err != nil && ctx.Err() == nil {
			log.Error("maintenance: "+s.name()+": round failed", slog.Any("error", err))
		}
		if wait <= 0 {
			wait = s.every()
		}
		timer.Reset(wait)
	}
}

// drain calls batch until it handles fewer than limit rows, each call under its own timeout (batch runs one
// transaction of its own), pausing a random moment between calls. It returns the rows handled by the batches
// that succeeded; it stops without error when ctx ends between batches.
func drain(ctx context.Context, limit int, timeout time.Duration,
	batch func(ctx context.Context, limit int) (int, error)) (int, error) {
	total := 0
	for {
		bctx, cancel := context.WithTimeout(ctx, timeout)
		n, err := batch(bctx, limit)
		cancel()
		if err != nil {
			return total, err
		}
		total += n
		if n < limit {
			return total, nil
		}
		select {
		case <-ctx.Done():
			return total, nil
		case <-time.After(pauseMin + rand.N(pauseMax-pauseMin)):
		}
	}
}

// electedDrain runs one round of a batch service if this instance wins the election of key: batches of
// batchSize under timeout until one comes back short (drain). It returns the rows handled; name prefixes errors.
func electedDrain(ctx context.Context, env Env, key int64, name string, batchSize int, timeout time.Duration,
	batch func(ctx context.Context, limit int) (int, error)) (int, error) {
	var n int
	_, err := elect(ctx, env.Pool, key, func(ctx context.Context, _ pgx.Tx) error {
		var err error
		n, err = drain(ctx, batchSize, timeout, batch)
		return err
	})
	if err != nil {
		return n, fmt.Errorf("maintenance: %s: %w", name, err)
	}
	return n, nil
}

// logRound logs what a round of a batch service did, when it did something.
func logRound(log *slog.Logger, name, what string, n int, err error) (time.Duration, error) {
	if n > 0 {
		log.Info("maintenance: "+name+": "+what, slog.Int("rows", n))
	}
	return 0, err
}

// checkInterval validates an Interval: Off, or positive.
func checkInterval(field string, d time.Duration) error {
	if d < 0 && d != Off {
		return fmt.Errorf("%s must be > 0, or Off (-1) to turn the service off; got %s", field, d)
	}
	return nil
}

// checkBatch validates the batch settings.
func checkBatch(service string, batch int, timeout time.Duration) error {
	var errs []error
	if batch < 1 {
		errs = append(errs, fmt.Errorf("%s.Batch must be >= 1, got %d", service, batch))
	}
	if timeout <= 0 {
		errs = append(errs, fmt.Errorf("%s.Timeout must be > 0, got %s", service, timeout))
	}
	return errors.Join(errs...)
}
