package maintenance

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"
)

// Config configures a Maintainer: the environment every service shares and each service's own settings. Zero
// values take each service's defaults; a negative Interval (Off) turns a service off.
type Config struct {
	Env
	LeaseReaper      LeaseReaperConfig
	TaskPruner       TaskPrunerConfig
	FlowKeyPruner    FlowKeyPrunerConfig
	ScheduleEnqueuer ScheduleEnqueuerConfig
	BacklogExporter  BacklogExporterConfig
}

// Maintainer runs the maintenance services of one instance (see the package documentation).
type Maintainer struct {
	log      *slog.Logger
	services []service

	mu      sync.Mutex
	state   int // 0 new, 1 started, 2 stopped
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	stopped chan struct{}
}

// New builds every service of cfg, checking each Config; the errors name the service and the field.
func New(cfg Config) (*Maintainer, error) {
	env := cfg.Env.withDefaults()
	reaper, err1 := NewLeaseReaper(env, cfg.LeaseReaper)
	tasks, err2 := NewTaskPruner(env, cfg.TaskPruner)
	keys, err3 := NewFlowKeyPruner(env, cfg.FlowKeyPruner)
	sched, err4 := NewScheduleEnqueuer(env, cfg.ScheduleEnqueuer)
	backlog, err5 := NewBacklogExporter(env, cfg.BacklogExporter)
	if err := errors.Join(err1, err2, err3, err4, err5); err != nil {
		return nil, err
	}
	m := &Maintainer{log: env.Logger, stopped: make(chan struct{})}
	for _, s := range []service{reaper, tasks, keys, sched, backlog} {
		if s.every() != Off {
			m.services = append(m.services, s)
		}
	}
	return m, nil
}

// Start starts every service that is not off, each in its own goroutine, their first rounds staggered so they
// do not all hit the database in the same instant. The services run until Stop or until ctx ends. Start on a
// Maintainer that was started or stopped before does nothing.
func (m *Maintainer) Start(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.state != 0 {
		return nil
	}
	m.state = 1
	ctx, m.cancel = context.WithCancel(ctx)
	for i, s := range m.services {
		delay := time.Duration(i)*staggerStep + rand.N(staggerStep)
		m.wg.Go(func() { run(ctx, m.log, s, delay) })
	}
	go func() {
		m.wg.Wait()
		close(m.stopped)
	}()
	names := make([]string, len(m.services))
	for i, s := range m.services {
		names[i] = s.name()
	}
	m.log.Debug("maintenance: started", slog.Any("services", names))
	return nil
}

// Stop stops every service and waits for the rounds in progress to end. It is idempotent; on a Maintainer never
// started it returns at once.
func (m *Maintainer) Stop() {
	m.mu.Lock()
	switch m.state {
	case 0:
		close(m.stopped)
	case 1:
		m.cancel()
	}
	m.state = 2
	m.mu.Unlock()
	<-m.stopped
}

// Stopped is closed once every service has stopped (after Stop, or when Start's context ended).
func (m *Maintainer) Stopped() <-chan struct{} { return m.stopped }
