package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/internal/readmodel"
)

// bulkCreated is one line of `task create TEMPLATE --contexts-file`: one per context, in input order (-f prints
// the same lines from createdFile).
type bulkCreated struct {
	// Ordinal is the 1-based position of the definition or context in the input.
	Ordinal int `json:"ordinal"`
	// TaskID is the task's id: new, or the existing task holding the same idempotency key.
	TaskID int64 `json:"task_id"`
	// Created is false when the idempotency key named an existing task (or an earlier element of the input).
	Created bool `json:"created"`
	// RunAt is the delayed start of a created task (--run-at, --in), when it is still to come (not a column of
	// create_tasks_from_template's rows).
	RunAt *time.Time `json:"run_at,omitempty" db:"-"`
}

// readContextsFile reads JSON lines: one context (a JSON value, normally an object) per non-blank line. The
// error names the line.
func readContextsFile(file string) ([]stepready.FromTemplate, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, usageError{err}
	}
	defer f.Close()
	var contexts []stepready.FromTemplate
	r := bufio.NewReader(f)
	for line := 1; ; line++ {
		text, err := r.ReadBytes('\n')
		if len(bytes.TrimSpace(text)) > 0 {
			if !json.Valid(text) {
				return nil, usagef("%s:%d: not a JSON value (--contexts-file takes JSON lines: one context per line)",
					file, line)
			}
			contexts = append(contexts, stepready.FromTemplate{Context: json.RawMessage(bytes.TrimSpace(text))})
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", file, err)
		}
	}
	if len(contexts) == 0 {
		return nil, usagef("%s: no contexts (one JSON context per line)", file)
	}
	return contexts, nil
}

// createBulk creates one task per context of a template in one transaction, through
// stepready.CreateTasksFromTemplate. runAt (or in, from the database's now), when set, delays every created task.
func createBulk(ctx context.Context, conn *pgx.Conn, template string, contexts []stepready.FromTemplate,
	runAt *time.Time, in time.Duration) ([]bulkCreated, error) {
	var out []bulkCreated
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		now, err := startOf(ctx, tx, &runAt, in)
		if err != nil {
			return err
		}
		var opts stepready.TemplateOptions
		if runAt != nil {
			opts.RunAt = *runAt
		}
		created, err := stepready.CreateTasksFromTemplate(ctx, tx, template, contexts, opts)
		if err != nil {
			return err
		}
		out = make([]bulkCreated, len(created))
		for i, c := range created {
			out[i] = bulkCreated{Ordinal: i + 1, TaskID: c.TaskID, Created: c.Created}
			if c.Created && runAt != nil && runAt.After(now) {
				at := runAt.UTC()
				out[i].RunAt = &at
			}
		}
		return nil
	})
	return out, err
}

// startOf reads the database's now in tx and, with in set, makes *runAt that long after it: the time a delayed
// start is judged against (a task is said to be scheduled when its run_at is after now, as in a single create).
func startOf(ctx context.Context, tx pgx.Tx, runAt **time.Time, in time.Duration) (time.Time, error) {
	now, err := readmodel.Now(ctx, tx, nil)
	if err != nil {
		return now, err
	}
	if in > 0 {
		t := now.Add(in)
		*runAt = &t
	}
	return now, nil
}

// scheduledSuffix is what a line of created tasks adds for a task whose start is still to come.
func scheduledSuffix(at *time.Time) string {
	if at == nil {
		return ""
	}
	return ", scheduled to start at " + at.UTC().Format(time.RFC3339)
}

// writeBulk prints one line per task: a table line, or with --output json one JSON object per line.
func writeBulk(w io.Writer, format string, res []bulkCreated) error {
	created := 0
	for _, c := range res {
		if format == outputJSON {
			b, err := json.Marshal(c)
			if err != nil {
				return err
			}
			fmt.Fprintf(w, "%s\n", b)
			continue
		}
		if c.Created {
			created++
			fmt.Fprintf(w, "%d\ttask %d created%s\n", c.Ordinal, c.TaskID, scheduledSuffix(c.RunAt))
		} else {
			fmt.Fprintf(w, "%d\ttask %d already exists with this idempotency key: nothing created\n", c.Ordinal, c.TaskID)
		}
	}
	if format != outputJSON {
		fmt.Fprintf(w, "%d of %d tasks created\n", created, len(res))
	}
	return nil
}

// fileBatch is the definitions sent to stepready.CreateTasks at once by createFromFile, with their lines.
type fileBatch struct {
	defs  []json.RawMessage
	lines []int
	// runAts are the definitions' run_at (the zero time: none).
	runAts []time.Time
	err    error
}

// fileBatchSize is how many definitions of a file createFromFile sends per stepready.CreateTasks call: one of
// its batches.
const fileBatchSize = 1000

// createdFile is what createFromFile created: one entry per definition of the file, in order, kept compact
// (a file may hold millions of definitions) and printed once the transaction has committed.
type createdFile struct {
	ids     []int64
	created []bool
	// every is the start of every created task (--run-at, --in), when it is still to come.
	every *time.Time
	// scheduled are the created tasks whose run_at of the file is still to come, by their index in ids: only
	// these, so that a file without run_at costs nothing more.
	scheduled map[int]time.Time
}

// createFromFile creates every definition of df in one transaction (all or nothing), sending them in batches
// while the next batch is read, so that memory stays bounded whatever the size of the file. runAt (or in, from
// the database's now) delays every task. progress, when not nil, is told how far it got. An invalid definition
// is reported with its line: `FILE:LINE: definitions[i]: …`.
func createFromFile(ctx context.Context, conn *pgx.Conn, df *definitionFile, runAt *time.Time, in time.Duration,
	progress *progressLine) (*createdFile, error) {
	out := &createdFile{scheduled: map[int]time.Time{}}
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		now, err := startOf(ctx, tx, &runAt, in)
		if err != nil {
			return err
		}
		if runAt != nil && runAt.After(now) {
			every := runAt.UTC()
			out.every = &every
		}
		readCtx, stop := context.WithCancel(ctx)
		defer stop()
		batches := make(chan fileBatch, 1)
		go readBatches(readCtx, df, runAt, batches)
		offset := 0
		for b := range batches {
			if b.err != nil {
				return b.err
			}
			created, err := stepready.CreateTasks(ctx, tx, b.defs)
			if err != nil {
				return atLine(df.name, err, b.lines, offset)
			}
			for i, c := range created {
				if c.Created && b.runAts[i].After(now) {
					out.scheduled[len(out.ids)] = b.runAts[i]
				}
				out.ids = append(out.ids, c.TaskID)
				out.created = append(out.created, c.Created)
			}
			offset += len(b.defs)
			progress.update(offset, len(out.ids))
		}
		return nil
	})
	progress.done()
	if err != nil {
		return nil, err
	}
	return out, nil
}

// readBatches reads the definitions of df into batches of fileBatchSize and sends them, then closes out. A
// read error is sent as the last batch.
func readBatches(ctx context.Context, df *definitionFile, runAt *time.Time, out chan<- fileBatch) {
	defer close(out)
	b := fileBatch{}
	send := func() bool {
		select {
		case out <- b:
			b = fileBatch{}
			return true
		case <-ctx.Done():
			return false
		}
	}
	for {
		d, err := df.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		var at time.Time // the file's run_at; --run-at and --in replace it (createdFile.every)
		if err == nil && runAt != nil {
			d.json, err = withRunAt(d.json, *runAt)
			if err != nil {
				err = fmt.Errorf("%s:%d: %w", df.name, d.line, err)
			}
		} else if err == nil {
			at = definitionRunAt(d.json)
		}
		if err != nil {
			b = fileBatch{err: err}
			send()
			return
		}
		b.defs = append(b.defs, d.json)
		b.lines = append(b.lines, d.line)
		b.runAts = append(b.runAts, at)
		if len(b.defs) == fileBatchSize && !send() {
			return
		}
	}
	if len(b.defs) > 0 {
		send()
	}
}

// runAtKey is looked for before a definition is decoded for its run_at: most definitions have none.
var runAtKey = []byte(`"run_at"`)

// definitionRunAt is the run_at of a definition, or the zero time when it has none (or one the database will
// refuse, with its own message).
func definitionRunAt(def json.RawMessage) time.Time {
	if !bytes.Contains(def, runAtKey) {
		return time.Time{}
	}
	var d struct {
		RunAt *string `json:"run_at"`
	}
	if json.Unmarshal(def, &d) != nil || d.RunAt == nil {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339Nano, *d.RunAt)
	if err != nil {
		return time.Time{}
	}
	return t
}

// withRunAt sets the run_at of a definition.
func withRunAt(def json.RawMessage, runAt time.Time) (json.RawMessage, error) {
	var d map[string]json.RawMessage
	if err := json.Unmarshal(def, &d); err != nil {
		return nil, err
	}
	at, err := json.Marshal(runAt.Format(time.RFC3339Nano))
	if err != nil {
		return nil, err
	}
	d["run_at"] = at
	return json.Marshal(d)
}

// definitionsIndex finds the `definitions[i]` of stepready.CreateTasks' errors.
var definitionsIndex = regexp.MustCompile(`definitions\[(\d+)\]`)

// lineError is an invalid definition of a file: the message names the file and line, and the definition's index
// in the file; the original error stays in the chain (errors.Is ErrInvalidDefinition, the SQLSTATE).
type lineError struct {
	msg string
	err error
}

func (e *lineError) Error() string { return e.msg }
func (e *lineError) Unwrap() error { return e.err }

// atLine names the line of the definition that err (of a batch of definitions starting at offset in the file,
// lines[i] the line of its i-th definition) is about, and its index in the whole file.
func atLine(file string, err error, lines []int, offset int) error {
	msg := strings.TrimPrefix(err.Error(), stepready.ErrInvalidDefinition.Error()+": ")
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		msg = pgErr.Message // the database's own words, as dbError shows them
	}
	m := definitionsIndex.FindStringSubmatchIndex(msg)
	if m == nil {
		return err
	}
	i, convErr := strconv.Atoi(msg[m[2]:m[3]])
	if convErr != nil || i < 0 || i >= len(lines) {
		return err
	}
	msg = msg[:m[0]] + fmt.Sprintf("definitions[%d]", offset+i) + msg[m[1]:]
	if lines[i] == 0 {
		return &lineError{msg: fmt.Sprintf("%s: %s", file, msg), err: err}
	}
	return &lineError{msg: fmt.Sprintf("%s:%d: %s", file, lines[i], msg), err: err}
}

// progressLine shows how far a long creation got, on one line of a terminal, at most four times a second.
type progressLine struct {
	w     io.Writer
	begin time.Time
	last  time.Time
	shown bool
}

// newProgressLine returns a progress line on w when w is a terminal, else nil (which shows nothing).
func newProgressLine(w io.Writer) *progressLine {
	f, ok := w.(*os.File)
	if !ok {
		return nil
	}
	if st, err := f.Stat(); err != nil || st.Mode()&os.ModeCharDevice == 0 {
		return nil
	}
	return &progressLine{w: w, begin: time.Now()}
}

// update shows that read definitions were read and done of them sent.
func (p *progressLine) update(read, done int) {
	if p == nil || time.Since(p.last) < 250*time.Millisecond {
		return
	}
	p.last = time.Now()
	p.shown = true
	rate := float64(done) / max(time.Since(p.begin).Seconds(), 1e-3)
	fmt.Fprintf(p.w, "\r%d definitions read, %d sent (%.0f/s), not committed yet ", read, done, rate)
}

// done ends the line.
func (p *progressLine) done() {
	if p != nil && p.shown {
		fmt.Fprintln(p.w)
	}
}

// writeCreated prints one line per definition of the file, as writeBulk does.
func writeCreated(w io.Writer, format string, res *createdFile) error {
	bw := bufio.NewWriterSize(w, 1<<16)
	created := 0
	for i, id := range res.ids {
		at, scheduled := res.scheduled[i]
		if res.every != nil && res.created[i] {
			at, scheduled = *res.every, true
		}
		if format == outputJSON {
			if scheduled {
				fmt.Fprintf(bw, `{"ordinal":%d,"task_id":%d,"created":%t,"run_at":%q}`+"\n", i+1, id, res.created[i],
					at.UTC().Format(time.RFC3339Nano))
				continue
			}
			fmt.Fprintf(bw, `{"ordinal":%d,"task_id":%d,"created":%t}`+"\n", i+1, id, res.created[i])
			continue
		}
		if res.created[i] {
			created++
			var when *time.Time
			if scheduled {
				when = &at
			}
			fmt.Fprintf(bw, "%d\ttask %d created%s\n", i+1, id, scheduledSuffix(when))
		} else {
			fmt.Fprintf(bw, "%d\ttask %d already exists with this idempotency key: nothing created\n", i+1, id)
		}
	}
	if format != outputJSON {
		fmt.Fprintf(bw, "%d of %d tasks created\n", created, len(res.ids))
	}
	return bw.Flush()
}
