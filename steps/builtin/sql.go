package builtin

import (
	"bytes"
	"context"
	"database/sql/driver"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepready/stepready/steps"
)

// sqlInput is the input of the `sql` handler.
type sqlInput struct {
	// Query is one SQL statement, with $1, $2… placeholders for Args. Required.
	Query string `json:"query"`
	// Args are the statement's parameters, sent in PostgreSQL's text format (see sqlArg).
	Args []json.RawMessage `json:"args"`
}

// sqlOutput is the output of the `sql` handler.
type sqlOutput struct {
	// Rows holds the returned rows, one object per row keyed by column name (always an array, maybe empty).
	Rows []map[string]any `json:"rows"`
	// RowsAffected is the row count of the command tag (rows returned, inserted, updated or deleted).
	RowsAffected int64 `json:"rows_affected"`
}

// sqlTransientCodes are the SQLSTATEs that say "the same statement may well succeed if tried again":
// serialization_failure, deadlock_detected, lock_not_available and query_canceled (statement_timeout, or an
// operator's pg_cancel_backend). Connection exceptions (class 08) are transient too.
var sqlTransientCodes = map[string]bool{
	"40001": true,
	"40P01": true,
	"55P03": true,
	"57014": true,
}

// errSQLDisabled is the failure of a `sql` step when no database was given for step SQL.
var errSQLDisabled = errors.New("sql handler is disabled: step SQL never runs on the scheduler's own connection; " +
	"start the scheduler with --sql-database-url (STEPREADY_SQL_DATABASE_URL) naming a database URL whose role has " +
	"the rights step SQL needs (builtin.Options.Pool)")

// handleSQLDisabled is the `sql` handler when no pool was given for step SQL.
func handleSQLDisabled(context.Context, *steps.Step) (any, error) {
	return nil, &steps.Error{Class: steps.ClassPermanent, Code: "sql_disabled", Err: errSQLDisabled}
}

// sqlHandler is the `sql` handler.
type sqlHandler struct {
	pool *pgxpool.Pool
}

// Handle implements steps.Handler.
func (h *sqlHandler) Handle(ctx context.Context, step *steps.Step) (any, error) {
	query, args, err := decodeSQLInput(step)
	if err != nil {
		return nil, err
	}

	out, err := h.query(ctx, query, args)
	if err != nil {
		return nil, classifySQLError(ctx, err)
	}
	return out, nil
}

// decodeSQLInput decodes the input of the `sql` handler into the statement and its parameters (see sqlArg); a
// bad input is a permanent error naming the field.
func decodeSQLInput(step *steps.Step) (string, []any, error) {
	var in sqlInput
	if err := decodeInput(step, &in); err != nil {
		return "", nil, err
	}
	if in.Query == "" {
		return "", nil, badInput(step, "query", "required")
	}
	args := make([]any, len(in.Args))
	for i, raw := range in.Args {
		arg, err := sqlArg(raw)
		if err != nil {
			return "", nil, badInput(step, fmt.Sprintf("args[%d]", i), "%v", err)
		}
		args[i] = arg
	}
	return in.Query, args, nil
}

// query runs the statement and collects its rows.
func (h *sqlHandler) query(ctx context.Context, query string, args []any) (*sqlOutput, error) {
	rows, err := h.pool.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()

	fields := rows.FieldDescriptions()
	out := &sqlOutput{Rows: []map[string]any{}}
	for rows.Next() {
		values, err := rows.Values()
		if err != nil {
			return nil, err
		}
		row := make(map[string]any, len(fields))
		raw := rows.RawValues()
		for i, field := range fields {
			row[field.Name] = columnValue(field, values[i], raw[i])
		}
		out.Rows = append(out.Rows, row)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	out.RowsAffected = rows.CommandTag().RowsAffected()
	return out, nil
}

// columnValue returns the output value of one column: json and jsonb columns as their JSON text (so that large
// numbers inside keep every digit), other columns through jsonValue.
func columnValue(field pgconn.FieldDescription, value any, raw []byte) any {
	if value == nil || raw == nil {
		return nil
	}
	switch {
	case field.DataTypeOID == pgtype.JSONOID,
		field.DataTypeOID == pgtype.JSONBOID && field.Format == pgtype.TextFormatCode:
		return json.RawMessage(bytes.Clone(raw))
	case field.DataTypeOID == pgtype.JSONBOID && len(raw) > 1 && raw[0] == 1: // binary jsonb: version 1, then text
		return json.RawMessage(bytes.Clone(raw[1:]))
	}
	return jsonValue(value)
}

// sqlArg converts one JSON argument to a query parameter. Every non-null value is sent as text and converted by
// the server to the parameter's type, so a value that does not fit is a SQLSTATE error (22P02 and the like,
// permanent) rather than a client-side encoding error: strings as they are, numbers as written (no float
// rounding), booleans as true/false, objects and arrays as their JSON text (for json and jsonb parameters).
func sqlArg(raw json.RawMessage) (any, error) {
	raw = bytes.TrimSpace(raw)
	switch {
	case len(raw) == 0 || string(raw) == "null":
		return nil, nil
	case raw[0] == '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, err
		}
		return s, nil
	default:
		return string(raw), nil
	}
}

// classifySQLError classifies a failed statement by SQLSTATE, never by message: the step's deadline is
// `timeout`, a cancelled context is returned wrapped (the daemon is shutting down), the SQLSTATEs of
// sqlTransientCodes and class 08 are `transient`, every other SQLSTATE is `permanent`, and an error without
// a SQLSTATE (the connection failed or broke) is `transient`. The SQLSTATE, when there is one, is the Code.
func classifySQLError(ctx context.Context, err error) error {
	err = fmt.Errorf("sql handler: %w", err)
	code := ""
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok {
		code = pgErr.Code
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		if errors.Is(ctxErr, context.DeadlineExceeded) {
			return &steps.Error{Class: steps.ClassTimeout, Code: code, Err: err}
		}
		return err
	}
	class := steps.ClassPermanent
	if code == "" || sqlTransientCodes[code] || strings.HasPrefix(code, "08") {
		class = steps.ClassTransient
	}
	return &steps.Error{Class: class, Code: code, Err: err}
}

// jsonValue converts a value of rows.Values to one that encodes as JSON faithfully: uuids as their text,
// NaN and infinite floats as "NaN", "Infinity" and "-Infinity", pgtype values through their JSON or SQL
// text form, arrays element by element. bytea stays []byte (base64 in JSON).
func jsonValue(v any) any {
	switch v := v.(type) {
	case nil, bool, string, []byte, int8, int16, int32, int64, int, uint8, uint16, uint32, uint64, uint:
		return v
	case float32:
		return jsonFloat(float64(v), v)
	case float64:
		return jsonFloat(v, v)
	case [16]byte: // uuid
		return fmt.Sprintf("%x-%x-%x-%x-%x", v[0:4], v[4:6], v[6:8], v[8:10], v[10:16])
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = jsonValue(e)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[k] = jsonValue(e)
		}
		return out
	}
	if m, ok := v.(json.Marshaler); ok {
		if _, err := m.MarshalJSON(); err == nil {
			return v
		}
	}
	if valuer, ok := v.(driver.Valuer); ok {
		if val, err := valuer.Value(); err == nil {
			if _, again := val.(driver.Valuer); !again {
				return jsonValue(val)
			}
		}
	}
	if m, ok := v.(encoding.TextMarshaler); ok {
		if text, err := m.MarshalText(); err == nil {
			return string(text)
		}
	}
	if s, ok := v.(fmt.Stringer); ok {
		return s.String()
	}
	if _, err := json.Marshal(v); err != nil {
		return fmt.Sprint(v)
	}
	return v
}

// jsonFloat returns v (the original value) unless f has no JSON number form.
func jsonFloat(f float64, v any) any {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	return v
}
