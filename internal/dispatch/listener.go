package dispatch

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
)

// Channel is the notification channel the SQL triggers notify when steps become ready.
const Channel = "stepready_ready"

// Listener holds a dedicated connection listening on Channel and signals Wake on every notification. A lost
// connection is re-established with capped exponential backoff; after each (re)connect it signals once, since
// notifications sent meanwhile are lost.
type Listener struct {
	// ConnConfig is the connection to open (a copy of the pool's). Required.
	ConnConfig *pgx.ConnConfig
	// Wake receives a signal per notification (buffered, never blocks). Required.
	Wake chan struct{}
	// Logger receives the listener's logs. Required.
	Logger *slog.Logger
}

// Run listens until ctx is done.
func (l *Listener) Run(ctx context.Context) error {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := l.listen(ctx)
		if ctx.Err() != nil {
			return nil
		}
		l.Logger.Warn("dispatch: listener connection lost; reconnecting", slog.Any("error", err),
			slog.Duration("backoff", backoff))
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		backoff = min(backoff*2, 5*time.Second)
	}
	return nil
}

func (l *Listener) listen(ctx context.Context) error {
	conn, err := pgx.ConnectConfig(ctx, l.ConnConfig)
	if err != nil {
		return err
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+Channel); err != nil {
		return err
	}
	signal(l.Wake) // whatever was notified while we were not listening
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
		signal(l.Wake)
	}
}
