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

# The Python interpreter of the Python worker (workers/python) and its tests: $STEPREADY_PYTHON when set, else the first of
# /usr/bin/python3 (Debian's, which sees python3-psycopg and python3-pytest) and python3 in PATH that imports
# psycopg and pytest. Not simply the python3 first in PATH: a version manager's shim (pyenv) runs a Python that
# does not see Debian's packages. The Go tests get it as STEPREADY_PYTHON (internal/python).
PYTHON ?= $(shell for p in $${STEPREADY_PYTHON:-/usr/bin/python3 python3}; do \
	"$$p" -c 'import psycopg, pytest' >/dev/null 2>&1 && { command -v "$$p"; break; }; done)

.PHONY: help build install run test test-race lint verify bench bench-quick bench-peers migrate db-reset screenshots conformance python-check

help: ## Show this list of targets
	@echo "Usage: make TARGET"
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "} {printf "  %-12s %s\n", $$1, $$2}'

build: ## Build the scheduler binary into bin/scheduler
	$(GO) build -o $(BIN) ./cmd/scheduler

install: ## Install the scheduler command into $GOBIN (default $(go env GOPATH)/bin): go install ./cmd/scheduler
	$(GO) install ./cmd/scheduler

run: build ## Run the demo: local PostgreSQL in .stepready/ (unless DATABASE_URL), example tasks, live account
	$(BIN) demo

test: python-check ## Run every test with the race detector (needs PostgreSQL: TEST_DATABASE_URL, Docker or a local initdb)
	STEPREADY_PYTHON="$(PYTHON)" $(GO) test -race -count=1 ./...

# The suite's contract (WORKER_CMD, WORKER_RULES, the handlers) is tests/conformance/README.md.
conformance: build python-check ## Run the worker conformance suite against scheduler run (both dispatch modes) and the Python worker
	WORKER_NAME=go-river WORKER_RULES=1 WORKER_CMD="$(CURDIR)/$(BIN) run --dispatch river" \
		$(GO) test -count=1 -run '^TestConformance$$' ./tests/conformance/
	WORKER_NAME=go-direct WORKER_RULES=1 WORKER_CMD="$(CURDIR)/$(BIN) run --dispatch direct" \
		$(GO) test -count=1 -run '^TestConformance$$' ./tests/conformance/
	WORKER_NAME=python PYTHONPATH="$(CURDIR)/workers/python" WORKER_CMD="$(PYTHON) -m stepready_worker --builtins" \
		$(GO) test -count=1 -run '^TestConformance$$' ./tests/conformance/

python-check: ## Check that a Python interpreter imports psycopg and pytest (the Python worker and its tests)
	@if [ -z "$(PYTHON)" ]; then \
		echo "make: no Python interpreter imports psycopg and pytest (tried \$$STEPREADY_PYTHON when set, else /usr/bin/python3 and python3)."; \
		echo "      Install Debian's packages: apt-get install python3-psycopg python3-pytest"; \
		echo "      (a pyenv or asdf python3 first in PATH does not see them; /usr/bin/python3 does),"; \
		echo "      or set STEPREADY_PYTHON to an interpreter that imports them."; \
		exit 1; \
	fi

test-race: test ## Same as test: the race detector is always on

lint: ## Check formatting (gofmt), then go vet and staticcheck
	@unformatted="$$(gofmt -l .)"; \
	if [ -n "$$unformatted" ]; then echo "gofmt -l: these files need gofmt -w:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) tool staticcheck ./...
	cd bench/peers && $(GO) vet ./...

verify: ## Check that go.mod and go.sum are tidy, then lint
	$(GO) mod tidy -diff
	$(MAKE) --no-print-directory lint

bench: ## Every benchmark scenario at full size, durable profile then fast, on throwaway PostgreSQL; writes bench.json
	$(GO) run ./cmd/bench -size full -json bench.json

bench-quick: ## The same scenarios, small; durable profile then fast; prints the table, writes bench.json
	$(GO) run ./cmd/bench -size quick -json bench.json

bench-peers: ## stepready beside DBOS Transact for Go (bench/peers, its own module), durable profile; writes bench-peers.json
	cd bench/peers && $(GO) run . -size full -json $(CURDIR)/bench-peers.json

migrate: build ## Migrate the database at DATABASE_URL to the newest schema (scheduler migrate up)
	$(BIN) migrate up --database-url "$(DATABASE_URL)"

db-reset: build ## Migrate the database at DATABASE_URL down to nothing, then up again (all data is lost)
	$(BIN) migrate down --database-url "$(DATABASE_URL)"
	$(BIN) migrate up --database-url "$(DATABASE_URL)"

screenshots: ## Take the console's screenshots (docs/img/console-*.png) with the browser tests (needs chromium)
	STEPREADY_SCREENSHOTS=$(CURDIR)/docs/img go test -count=1 -run 'TestBrowser' ./console
