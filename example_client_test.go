package stepready_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/steps"
)

// chargeCard is a handler a library user writes: it decodes the step's input, classifies its failures, and
// returns an output.
func chargeCard(ctx context.Context, s *steps.Step) (any, error) {
	var in struct {
		Card   string `json:"card"`
		Amount int    `json:"amount"`
	}
	if err := s.DecodeInput(&in); err != nil {
		return nil, err // undecodable input is a permanent failure
	}
	switch {
	case in.Amount <= 0:
		return nil, steps.Permanent(errors.New("amount must be positive"))
	case in.Card == "declined":
		return nil, steps.Fail("card_declined", errors.New("the bank declined the card")) // a class of your own
	case in.Card == "busy":
		return nil, steps.FailAfter(steps.ClassRateLimited, errors.New("gateway busy"), 2*time.Second)
	}
	return map[string]any{"charged": in.Amount, "attempt": s.Attempt}, nil
}

// Registering handlers in your own binary: the registry maps the steps.handler names of your task definitions
// to Go code.
func Example_registerHandlers() {
	reg := steps.NewRegistry()
	reg.MustRegister("charge_card", steps.HandlerFunc(chargeCard))

	h, _ := reg.Lookup("charge_card")
	out, err := h.Handle(context.Background(), &steps.Step{Name: "charge", Attempt: 1,
		Input: []byte(`{"card": "4242", "amount": 1200}`)})
	fmt.Println(out, err)

	_, err = h.Handle(context.Background(), &steps.Step{Name: "charge", Attempt: 1,
		Input: []byte(`{"card": "declined", "amount": 1200}`)})
	e, _ := steps.AsError(err)
	fmt.Println(e.Class, "-", e.Err)
	// Output:
	// map[attempt:1 charged:1200] <nil>
	// card_declined - the bank declined the card
}

// Running the daemon inside your own program: build a registry, a client on a pool, start it, and stop it
// gracefully on Ctrl-C. (Needs a migrated database: `scheduler migrate up`.)
func Example_embedTheDaemon() {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		return // this example needs a database
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	reg := steps.NewRegistry()
	reg.MustRegister("charge_card", steps.HandlerFunc(chargeCard))
	client, err := stepready.NewClient(pool, stepready.Config{
		Registry:    reg,
		Dispatch:    stepready.DispatchDirect,
		Concurrency: 20,
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		log.Fatal(err)
	}
	<-ctx.Done()
	if err := client.Stop(context.Background()); err != nil {
		log.Fatal(err)
	}
}
