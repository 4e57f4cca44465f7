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
}

// readContextsFile reads JSON lines: one context (a JSON value, normally an object) per non-blank line. The
// error names the line.
func readContextsFile(file string) (json.RawMessage, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, usageError{err}
	}
	defer f.Close()
	var contexts []json.RawMessage
	r := bufio.NewReader(f)
	for line := 1; ; line++ {
		text, err := r.ReadBytes('\n')
		if len(bytes.TrimSpace(text)) > 0 {
			if !json.Valid(text) {
				return nil, usagef("%s:%d: not a JSON value (--contexts-file takes JSON lines: one context per line)",
					file, line)
			}
			contexts = append(contexts, json.RawMessage(bytes.TrimSpace(text)))
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
	return json.Marshal(contexts)
}

// createBulk creates one task per context of a template in one transaction, through
// stepready.create_tasks_from_template. runAt (or in, from the database's now), when set, delays every created task.
func createBulk(ctx context.Context, conn *pgx.Conn, template string, contexts json.RawMessage, runAt *time.Time,
	in time.Duration) ([]bulkCreated, error) {
	var out []bulkCreated
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if in > 0 {
			var t time.Time
			if err := tx.QueryRow(ctx, `SELECT now() + make_interval(secs => $1)`, in.Seconds()).Scan(&t); err != nil {
				return err
			}
			runAt = &t
		}
		rows, err := tx.Query(ctx,
			`SELECT ordinal, task_id, created FROM stepready.create_tasks_from_template($1, $2, NULL, $3)`,
			template, string(contexts), runAt)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, pgx.RowToStructByPos[bulkCreated])
		if err != nil {
			return err
		}
		return nil
	})
	return out, err
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
			fmt.Fprintf(w, "%d\ttask %d created\n", c.Ordinal, c.TaskID)
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
	err   error
}

// fileBatchSize is how many definitions of a file createFromFile sends per stepready.CreateTasks call: one of
// its batches.
const fileBatchSize = 1000

// createdFile is what createFromFile created: one entry per definition of the file, in order, kept compact
// (a file may hold millions of definitions) and printed once the transaction has committed.
type createdFile struct {
	ids     []int64
	created []bool
}

// createFromFile creates every definition of df in one transaction (all or nothing), sending them in batches
// while the next batch is read, so that memory stays bounded whatever the size of the file. runAt (or in, from
// the database's now) delays every task. progress, when not nil, is told how far it got. An invalid definition
// is reported with its line: `FILE:LINE: definitions[i]: …`.
func createFromFile(ctx context.Context, conn *pgx.Conn, df *definitionFile, runAt *time.Time, in time.Duration,
	progress *progressLine) (*createdFile, error) {
	out := &createdFile{}
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if in > 0 {
			var t time.Time
			if err := tx.QueryRow(ctx, `SELECT now() + make_interval(secs => $1)`, in.Seconds()).Scan(&t); err != nil {
				return err
			}
			runAt = &t
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
			for _, c := range created {
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
		if err == nil && runAt != nil {
			d.json, err = withRunAt(d.json, *runAt)
			if err != nil {
				err = fmt.Errorf("%s:%d: %w", df.name, d.line, err)
			}
		}
		if err != nil {
			b = fileBatch{err: err}
			send()
			return
		}
		b.defs = append(b.defs, d.json)
		b.lines = append(b.lines, d.line)
		if len(b.defs) == fileBatchSize && !send() {
			return
		}
	}
	if len(b.defs) > 0 {
		send()
	}
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
		if format == outputJSON {
			fmt.Fprintf(bw, `{"ordinal":%d,"task_id":%d,"created":%t}`+"\n", i+1, id, res.created[i])
			continue
		}
		if res.created[i] {
			created++
			fmt.Fprintf(bw, "%d\ttask %d created\n", i+1, id)
		} else {
			fmt.Fprintf(bw, "%d\ttask %d already exists with this idempotency key: nothing created\n", i+1, id)
		}
	}
	if format != outputJSON {
		fmt.Fprintf(bw, "%d of %d tasks created\n", created, len(res.ids))
	}
	return bw.Flush()
}
