"""``python3 -m stepready_worker``: run a worker from the command line.

Every option also reads the environment variable of ``scheduler run``'s flag of the same name (STEPREADY_LEASE for
--lease, STEPREADY_DATABASE_URL then DATABASE_URL for --database-url, …), with durations in Go's syntax (300ms,
2s, 1m30s), so one environment configures both workers. An option on the command line wins.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import Optional

from . import builtin
from .duration import parse_duration
from .worker import (CONCURRENCY_DEFAULT, LEASE_DEFAULT, POLL_INTERVAL_DEFAULT, PROBE_INTERVAL_DEFAULT,
                     REAP_INTERVAL_DEFAULT, SHUTDOWN_GRACE_DEFAULT, Worker)


def _env(name: str, default: Optional[str]) -> Optional[str]:
    value = os.environ.get("STEPREADY_" + name.upper().replace("-", "_"), "").strip()
    return value or default


def _duration(text: str) -> float:
    if text.strip() in ("off", "-1"):  # as scheduler run's interval flags: never
        return 0.0
    try:
        return parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _go(seconds: float) -> str:
    return f"{seconds:g}s"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python3 -m stepready_worker",
        description="Run a stepready worker: claim ready steps, run their handlers, record the outcomes. "
                    "SIGTERM or SIGINT stops it gracefully (a second one at once).",
        epilog="Every option also reads STEPREADY_<OPTION> (STEPREADY_LEASE for --lease), as scheduler run does.")
    p.add_argument("--database-url", default=_env("database-url", os.environ.get("DATABASE_URL")),
                   help="PostgreSQL URL of the migrated stepready database (env STEPREADY_DATABASE_URL, DATABASE_URL)")
    p.add_argument("--handlers", action="append", default=[], metavar="MODULE",
                   help="import MODULE and call its register(worker) to add handlers; repeatable")
    p.add_argument("--builtins", action="store_true",
                   default=_env("builtins", "false").lower() in ("1", "true", "yes"),
                   help="register noop, sleep and fail, as scheduler run's built-ins (the conformance set)")
    p.add_argument("--concurrency", type=int, default=int(_env("concurrency", str(CONCURRENCY_DEFAULT))),
                   help="attempts run at once (default %(default)s)")
    p.add_argument("--lease", type=_duration, default=_env("lease", _go(LEASE_DEFAULT)),
                   help="attempt lease, renewed every lease/3 (default %(default)s)")
    p.add_argument("--reap-interval", type=_duration, default=_env("reap-interval", _go(REAP_INTERVAL_DEFAULT)),
                   help="how often to reap expired leases (one instance reaps each round); 0 or off: never (default "
                        "%(default)s)")
    p.add_argument("--poll-interval", type=_duration, default=_env("poll-interval", _go(POLL_INTERVAL_DEFAULT)),
                   help="fallback poll when no notification or retry timer wakes the claimer (default %(default)s)")
    p.add_argument("--probe-interval", type=_duration, default=_env("probe-interval", _go(PROBE_INTERVAL_DEFAULT)),
                   help="how often to read the wake-up counter, so that work readied without a notification starts "
                        "within about this long; 0 or off: never (default %(default)s)")
    p.add_argument("--shutdown-grace", type=_duration, default=_env("shutdown-grace", _go(SHUTDOWN_GRACE_DEFAULT)),
                   help="at SIGTERM, how long running attempts may finish before they are handed back (default "
                        "%(default)s)")
    p.add_argument("--worker-id", default=_env("worker-id", None), help="name in leases and events (default "
                                                                        "hostname-pid)")
    p.add_argument("--poll-only", action="store_true",
                   default=_env("poll-only", "false").lower() in ("1", "true", "yes"),
                   help="never LISTEN, only poll (behind PgBouncer in transaction pooling mode)")
    p.add_argument("--queues", default=_env("queues", None),
                   help="comma-separated queues to work, once the database's claim takes routing filters "
                        "(routing); until then every queue")
    p.add_argument("--log-level", default=_env("log-level", "info"), choices=["debug", "info", "warn", "error"])
    args = p.parse_args(argv)
    for name in ("lease", "reap_interval", "poll_interval", "probe_interval", "shutdown_grace"):
        if isinstance(getattr(args, name), str):
            setattr(args, name, _duration(getattr(args, name)))
    if not args.database_url:
        p.error("no database: give --database-url or set STEPREADY_DATABASE_URL")
    return args


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    level = {"warn": logging.WARNING}.get(args.log_level, getattr(logging, args.log_level.upper(), logging.INFO))
    logging.basicConfig(level=level, stream=sys.stderr,
                        format="%(asctime)s level=%(levelname)s msg=%(message)s")
    try:
        worker = Worker(args.database_url, concurrency=args.concurrency, lease=args.lease,
                        reap_interval=args.reap_interval or None, poll_interval=args.poll_interval,
                        shutdown_grace=args.shutdown_grace, worker_id=args.worker_id, listen=not args.poll_only,
                        probe_interval=args.probe_interval or None,
                        queues=[q for q in args.queues.split(",") if q] if args.queues else None)
    except ValueError as e:
        print(f"stepready_worker: {e}", file=sys.stderr)
        return 2
    if args.builtins:
        builtin.register(worker)
    for module in args.handlers:
        mod = importlib.import_module(module)
        register = getattr(mod, "register", None)
        if register is None:
            print(f"stepready_worker: --handlers {module}: the module has no register(worker) function",
                  file=sys.stderr)
            return 2
        register(worker)
    if not worker.handler_names:
        print("stepready_worker: no handlers: give --handlers MODULE or --builtins", file=sys.stderr)
        return 2
    worker.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
