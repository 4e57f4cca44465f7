# stepready — run `make` (or `make help`) for the list of targets.

.DEFAULT_GOAL := help
SHELL := bash

# Go lives in /usr/local/go/bin on the project's machines; a Go already in PATH wins.
export PATH := $(PATH):/usr/local/go/bin

GO  ?= go
BIN := bin/scheduler

# The database that `make migrate` and `make db-reset` act on. Inherited from the environment; or pass it:
# make migrate DATABASE_URL=postgres://user:password@localhost:5432/stepready
DATABASE_URL ?=

.PHONY: help build run test test-race lint verify bench bench-quick migrate db-reset screenshots

help: ## Show this list of targets
	@echo "Usage: make TARGET"
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "} {printf "  %-10s %s\n", $$1, $$2}'

build: ## Build the scheduler binary into bin/scheduler
	$(GO) build -o $(BIN) ./cmd/scheduler

run: build ## Run the demo: local PostgreSQL in .stepready/ (unless DATABASE_URL), example tasks, live account
	$(BIN) demo

test: ## Run every test with the race detector (needs PostgreSQL: TEST_DATABASE_URL, Docker or a local initdb)
	$(GO) test -race -count=1 ./...

test-race: test ## Same as test: the race detector is always on

lint: ## Check formatting (gofmt), then go vet and staticcheck
	@unformatted="$$(gofmt -l .)"; \
	if [ -n "$$unformatted" ]; then echo "gofmt -l: these files need gofmt -w:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) tool staticcheck ./...

verify: ## Check that go.mod and go.sum are tidy, then lint
	$(GO) mod tidy -diff
	$(MAKE) --no-print-directory lint

bench: ## Run every benchmark scenario at full size on a throwaway PostgreSQL; prints the table, writes bench.json
	$(GO) run ./cmd/bench -size full -json bench.json

bench-quick: ## The same scenarios, small (under a few minutes); prints the table, writes bench.json
	$(GO) run ./cmd/bench -size quick -json bench.json

migrate: build ## Migrate the database at DATABASE_URL to the newest schema (scheduler migrate up)
	$(BIN) migrate up --database-url "$(DATABASE_URL)"

db-reset: build ## Migrate the database at DATABASE_URL down to nothing, then up again (all data is lost)
	$(BIN) migrate down --database-url "$(DATABASE_URL)"
	$(BIN) migrate up --database-url "$(DATABASE_URL)"

screenshots: ## Take the console's screenshots (docs/img/console-*.png) with the browser tests (needs chromium)
	STEPREADY_SCREENSHOTS=$(CURDIR)/docs/img go test -count=1 -run 'TestBrowser' ./console
