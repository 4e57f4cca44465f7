package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/steps"
)

// The worker process of the waiting and kill scenarios: this program run as `peers child SIDE …`, so that its
// resident set, goroutines and connections are its own, and so that it can be killed with SIGKILL. Every step
// body appends "start RUN STEP" and, after sleeping -work-ms, "end RUN STEP" to -log (one write(2) each with
// O_APPEND: a line written before a kill survives it in the page cache).

// stepreadyWorkerID and dbosExecutorID are the stable identities the worker process restarts under.
const (
	stepreadyWorkerID = "peers-stepready"
	dbosExecutorID    = "peers-dbos"
)

// bodyLog appends the lines of the step bodies.
type bodyLog struct {
	mu sync.Mutex
	f  *os.File
}

func (l *bodyLog) line(kind, run, step string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = fmt.Fprintf(l.f, "%s %s %s\n", kind, run, step)
}

func childMain(args []string) int {
	fs := flag.NewFlagSet("child", flag.ExitOnError)
	side := fs.String("side", "", "stepready or dbos")
	url := fs.String("url", "", "database URL")
	workMS := fs.Int("work-ms", 20, "how long each step body sleeps")
	logPath := fs.String("log", "", "the step bodies' log")
	waiting := fs.Int("waiting", 0, "DBOS: start this many workflows waiting for a signal")
	_ = fs.Parse(args)
	f, err := os.OpenFile(*logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	log := &bodyLog{f: f}
	body := func(ctx context.Context, run, step string) {
		log.line("start", run, step)
		select {
		case <-time.After(time.Duration(*workMS) * time.Millisecond):
		case <-ctx.Done():
		}
		log.line("end", run, step)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	quiet := slog.New(slog.NewTextHandler(discard{}, nil))
	// Goroutines, for the parent to read.
	go func() {
		for {
			_ = os.WriteFile(*logPath+".goroutines", []byte(strconv.Itoa(runtime.NumGoroutine())), 0o644)
			time.Sleep(200 * time.Millisecond)
		}
	}()
	switch *side {
	case "stepready":
		pool, err := pgxpool.New(ctx, *url)
		if err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			return 1
		}
		reg := steps.NewRegistry()
		reg.MustRegister("noop", steps.HandlerFunc(func(ctx context.Context, s *steps.Step) (any, error) {
			body(ctx, strconv.FormatInt(s.TaskID, 10), s.Name)
			return nil, nil
		}))
		c, err := stepready.NewClient(pool, stepready.Config{Registry: reg, Concurrency: concurrency,
			WorkerID: stepreadyWorkerID, Logger: quiet})
		if err == nil {
			err = c.Start(ctx)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			return 1
		}
		fmt.Println("ready")
		<-ctx.Done()
		_ = c.Stop(context.Background())
	case "dbos":
		d, err := dbos.NewContext(ctx, dbos.Config{DatabaseURL: *url, AppName: "peers", ExecutorID: dbosExecutorID,
			Logger: quiet})
		if err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			return 1
		}
		step := func(ctx dbos.Context, name string) error {
			id, _ := dbos.GetWorkflowID(ctx)
			_, err := dbos.RunAsStep(ctx, func(c context.Context) (string, error) {
				body(c, id, name)
				return "", nil
			}, dbos.WithStepName(name))
			return err
		}
		dbos.RegisterWorkflow(d, func(ctx dbos.Context, _ string) (string, error) {
			return "", step(ctx, "a")
		}, dbos.WithWorkflowName("noop"))
		dbos.RegisterWorkflow(d, func(ctx dbos.Context, _ string) (string, error) {
			for i := range 4 {
				if err := step(ctx, fmt.Sprintf("s%d", i+1)); err != nil {
					return "", err
				}
			}
			return "", nil
		}, dbos.WithWorkflowName("chain"))
		dbos.RegisterWorkflow(d, dbSignal, dbos.WithWorkflowName("signal"))
		if _, err := dbos.RegisterQueue(d, dbosQueue, dbos.WithWorkerConcurrency(concurrency), dbos.WithQueueBasePollingInterval(dbosQueuePoll)); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			return 1
		}
		if err := dbos.Launch(d); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			return 1
		}
		for range *waiting {
			if _, err := dbos.RunWorkflow(d, dbSignal, ""); err != nil {
				fmt.Fprintln(os.Stderr, "child:", err)
				return 1
			}
		}
		fmt.Println("ready")
		<-ctx.Done()
		_ = dbos.Shutdown(d, 10*time.Second)
	default:
		fmt.Fprintln(os.Stderr, "child: -side stepready or dbos")
		return 2
	}
	return 0
}

// child is a running worker process.
type child struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// startChild starts the worker process and waits for its "ready".
func (e *env) startChild(ctx context.Context, side, url, log string, waiting int) (*child, error) {
	cmd := exec.CommandContext(ctx, e.bin, "child", "-side", side, "-url", url, "-log", log,
		"-work-ms", strconv.Itoa(e.workMS), "-waiting", strconv.Itoa(waiting))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, log: log, done: make(chan struct{})}
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		sent := false
		for sc.Scan() {
			if !sent && sc.Text() == "ready" {
				ready <- true
				sent = true
			}
		}
		if !sent {
			ready <- false
		}
		_ = cmd.Wait()
		close(c.done)
	}()
	select {
	case ok := <-ready:
		if !ok {
			return nil, fmt.Errorf("the %s worker process exited before it was ready", side)
		}
	case <-time.After(10 * time.Minute):
		c.kill()
		return nil, fmt.Errorf("the %s worker process was not ready within 10 minutes", side)
	}
	return c, nil
}

func (c *child) kill() {
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.done
}

func (c *child) stop() {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(30 * time.Second):
		c.kill()
	}
}

// rssMB is the process's resident set now (VmRSS), in MB.
func (c *child) rssMB() (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", c.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			kb, err := strconv.Atoi(strings.Fields(line)[1])
			return float64(kb) * 1024 / 1e6, err
		}
	}
	return 0, errors.New("no VmRSS")
}

func (c *child) goroutines() float64 {
	b, _ := os.ReadFile(c.log + ".goroutines")
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return float64(n)
}

// bodies reads the log: how many step bodies started and ended, how many (run, step) started more than once, and
// how many had started without ending.
func bodies(log string) (started, twice, open int, err error) {
	b, err := os.ReadFile(log)
	if err != nil {
		return 0, 0, 0, err
	}
	starts := map[string]int{}
	ends := map[string]int{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			continue
		}
		key := f[1] + " " + f[2]
		if f[0] == "start" {
			starts[key]++
			started++
		} else {
			ends[key]++
		}
	}
	for k, n := range starts {
		if n > 1 {
			twice++
		}
		if n > ends[k] {
			open++
		}
	}
	return started, twice, open, nil
}

// backends counts the server processes connected to the database of url.
func backends(ctx context.Context, e *env, url string) (float64, error) {
	pool, err := pgxpool.New(ctx, e.cl.URL)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return 0, err
	}
	var n int
	err = pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = $1`, cfg.ConnConfig.Database).Scan(&n)
	return float64(n), err
}

// waitingScenario: e.size.Waiting runs wait for a signal while the worker process is up; read its RSS, its
// goroutines and the database's backends. stepready: tasks whose first step waits (created with CreateTasks);
// DBOS: workflows blocked in Recv, started by the worker process (each is a goroutine there).
func waitingScenario(ctx context.Context, e *env) ([]row, error) {
	sr, db, done, err := both(ctx, e, false)
	if err != nil {
		return nil, err
	}
	defer done()
	n := e.size.Waiting
	defs := make([]json.RawMessage, n)
	for i := range defs {
		defs[i] = signalDef
	}
	if _, err := stepready.CreateTasks(ctx, sr.pool, defs); err != nil {
		return nil, err
	}
	srChild, err := e.startChild(ctx, "stepready", sr.url, e.tmp+"/waiting-stepready.log", 0)
	if err != nil {
		return nil, err
	}
	defer srChild.stop()
	dbChild, err := e.startChild(ctx, "dbos", db.url, e.tmp+"/waiting-dbos.log", n)
	if err != nil {
		return nil, err
	}
	defer dbChild.stop()
	time.Sleep(2 * time.Second) // both settle: a few claim rounds, DBOS's pollers
	var rss, gor, conns [2]float64
	for i, c := range []*child{srChild, dbChild} {
		if rss[i], err = c.rssMB(); err != nil {
			return nil, err
		}
		gor[i] = c.goroutines()
	}
	if conns[0], err = backends(ctx, e, sr.url); err != nil {
		return nil, err
	}
	if conns[1], err = backends(ctx, e, db.url); err != nil {
		return nil, err
	}
	// The benchmark's own pools hold connections too: theirs are in both counts alike (one pool each).
	fig := fmt.Sprintf("%d runs waiting for a signal: the worker process's", n)
	return []row{
		measure("waiting", fig+" RSS", "MB", false, rss[:1], rss[1:], "", nil),
		measure("waiting", fig+" goroutines", "", false, gor[:1], gor[1:], "", nil),
		measure("waiting", fig+" database backends (the benchmark's pool included)", "", false, conns[:1], conns[1:], "", nil),
	}, nil
}

// killScenario: e.size.KillChains 4-step chains (each step body sleeps e.workMS) are queued and the worker process
// started; once a quarter of the step bodies have started, it is killed with SIGKILL and started again under the
// same identity. Timed: from the restart until every chain finished. Counted: step bodies that ran more than once,
// against the bodies open (started, not ended) at the kill.
func killScenario(ctx context.Context, e *env) ([]row, error) {
	sr, db, done, err := both(ctx, e, false)
	if err != nil {
		return nil, err
	}
	defer done()
	n := e.size.KillChains
	defs := make([]json.RawMessage, n)
	for i := range defs {
		defs[i] = chainDef
	}
	if _, err := stepready.CreateTasks(ctx, sr.pool, defs); err != nil {
		return nil, err
	}
	if _, _, err := produce(ctx, 0, n, func() error { return db.enqueue("chain") }); err != nil {
		return nil, err
	}
	run := func(side, url string, idle func(context.Context) (bool, error)) (took time.Duration, twice, open int, err error) {
		log := e.tmp + "/kill-" + side + ".log"
		c, err := e.startChild(ctx, side, url, log, 0)
		if err != nil {
			return 0, 0, 0, err
		}
		for {
			started, _, _, err := bodies(log)
			if err != nil && !os.IsNotExist(err) {
				c.kill()
				return 0, 0, 0, err
			}
			if started >= n {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		c.kill()
		_, _, open, err = bodies(log)
		if err != nil {
			return 0, 0, 0, err
		}
		begin := time.Now()
		c, err = e.startChild(ctx, side, url, log, 0)
		if err != nil {
			return 0, 0, 0, err
		}
		defer c.stop()
		if err := waitIdle(ctx, idle, 10*time.Minute); err != nil {
			return 0, 0, 0, err
		}
		took = time.Since(begin)
		_, twice, _, err = bodies(log)
		return took, twice, open, err
	}
	srTook, srTwice, srOpen, err := run("stepready", sr.url, sr.idle)
	if err != nil {
		return nil, fmt.Errorf("stepready: %w", err)
	}
	dbTook, dbTwice, dbOpen, err := run("dbos", db.url, db.idle)
	if err != nil {
		return nil, fmt.Errorf("dbos: %w", err)
	}
	fig := fmt.Sprintf("kill -9 with %d 4-step chains in flight (%d ms per step), restart", n, e.workMS)
	twiceRow := measure("kill", fig+": step bodies run twice", "", false, []float64{float64(srTwice)},
		[]float64{float64(dbTwice)}, fmt.Sprintf("≤ open at the kill (stepready %d, DBOS %d)", srOpen, dbOpen), nil)
	met := srTwice <= srOpen
	twiceRow.Met = &met
	return []row{
		measure("kill", fig+": restart → all finished", "s", false, []float64{srTook.Seconds()},
			[]float64{dbTook.Seconds()}, "≤ DBOS (ratio ≥ 1)", atLeast(1)),
		twiceRow,
	}, nil
}
