"""The stepready worker protocol (docs/workers.md) on psycopg 3, with handlers run in threads.

One coordinator thread (the one that calls :meth:`Worker.run`) alone talks to the database on one connection: it
claims, heartbeats, records outcomes and reaps. Handlers run in threads of their own, one per attempt, and hand
their result back through a queue; they never touch that connection. A second connection, in a thread of its own,
LISTENs on ``stepready_ready`` and wakes the coordinator. So nothing shares a connection across threads, and a
handler that blocks (I/O, a C extension) blocks only its own thread.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import select
import signal
import socket
import threading
import time
import traceback
from typing import Any, Callable, Iterable, Optional

import psycopg
from psycopg.rows import dict_row

from . import outcomes
from .outcomes import Permanent, Repeat, StepError

log = logging.getLogger("stepready_worker")

Handler = Callable[["Step"], Any]

# The transaction advisory lock that elects the one reaper of each round, the Go daemon's lease reaper key
# ("StepRep\x01", internal/maintenance/elect.go): Python workers and Go daemons on one database take turns, and
# only one reaps at a time.
REAPER_LOCK_KEY = 0x5374_6570_5265_7001

# Defaults, those of `scheduler run` (SPEC §11) unless said otherwise.
CONCURRENCY_DEFAULT = 10
LEASE_DEFAULT = 30.0
LEASE_MIN = 0.3
REAP_INTERVAL_DEFAULT = 10.0
POLL_INTERVAL_DEFAULT = 5.0
PROBE_INTERVAL_DEFAULT = 0.025   # how often the wake-up counter is read (the Go daemon's ProbeIntervalDefault)
SETTLE_MAX = 1.0                 # re-claims after a move of the counter: the wait doubles up to this
SHUTDOWN_GRACE_DEFAULT = 10.0
DEFAULT_TIMEOUT = 300.0          # a step without timeout_ms
ABANDON_GRACE_DEFAULT = 5.0      # how long a handler may run on after it was asked to stop
MAX_OUTPUT_BYTES_DEFAULT = 1 << 20
RECORD_TIMEOUT = 60.0            # how long recording one outcome keeps retrying a lost connection
CLAIM_BATCH_MAX = 1000
REAP_BATCH = 1000                # leases one reap_expired_leases call handles (the Go reaper's batch)

# SQLSTATE classes of an outcome the database refuses for what it holds (a value jsonb cannot store, a size
# limit): recorded at once as a contract_failure instead of being left to the lease.
_REFUSED_FOR_CONTENT = ("22", "54")

# What jsonb cannot hold in a string: the NUL character and lone UTF-16 surrogates.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


class Step:
    """One attempt of one step, as the handler sees it.

    Attributes come from the claim row (docs/workers.md, "The claim row"): ``id``, ``task_id``, ``name``,
    ``handler``, ``input`` (decoded JSON, its ``${…}`` references already resolved by the database) and
    ``context``, ``attempt`` (the attempt number users see, 1-based within the iteration), ``iteration``
    (0-based), ``queue``, ``timeout`` (seconds, from ``timeout_ms``; None: the worker's default), ``rules``,
    ``deps`` (a dict: the outputs of the step's direct parents that are complete or resolved, by step name;
    read one with :meth:`dep`), ``element`` and ``element_index`` (a map element's item and 0-based index; None
    and -1 for a step that is not an element). ``token`` is the fencing token; handlers have no use for it.

    A handler that runs for long should look at :meth:`cancelled` or sleep with :meth:`wait`: the worker asks it
    to stop when the step's timeout passes, when the attempt is no longer the running one (cancelled, resolved,
    reset, reaped: a heartbeat came back false) and at shutdown once the grace has passed.
    """

    def __init__(self, row: dict[str, Any], default_timeout: float):
        self.id: int = row["step_id"]
        self.task_id: int = row["task_id"]
        self.name: str = row["name"]
        self.handler: str = row["handler"]
        self.input: Any = row["input"]
        self.context: Any = row.get("context")
        self.token: int = row["attempt"]
        self.attempt: int = row.get("attempt_number") or row["attempt"]
        self.iteration: int = row.get("iteration") or 0
        self.queue: Optional[str] = row.get("queue")
        timeout_ms = row.get("timeout_ms")
        self.timeout: float = timeout_ms / 1000.0 if timeout_ms else default_timeout
        self.rules: Any = row.get("rules")
        # Data flow (SPEC §18, §19): deps on every started row; element and element_index NULL but for a map
        # element.
        self.deps: dict[str, Any] = row.get("deps") or {}
        self.element: Any = row.get("element")
        index = row.get("element_index")
        self.element_index: int = -1 if index is None else index
        self._cancel = threading.Event()
        self.cancel_reason: Optional[str] = None  # "timeout", "fenced" or "shutdown" once asked to stop

    def dep(self, name: str) -> Any:
        """The output of the direct parent ``name``. A parent that is not a direct parent, or was skipped, has no
        output here: that raises :class:`~stepready_worker.outcomes.Permanent` naming it (it will not appear
        on a later attempt either)."""
        if name not in self.deps:
            raise Permanent(f"step {self.name!r}: deps.{name}: no such member in deps "
                                 "(not a direct parent, or skipped)")
        return self.deps[name]

    def cancelled(self) -> bool:
        """True once the worker has asked the handler to stop (see cancel_reason)."""
        return self._cancel.is_set()

    def wait(self, seconds: float) -> bool:
        """Sleeps up to ``seconds``; returns True, early, when the handler is asked to stop."""
        return self._cancel.wait(seconds)

    def _ask_to_stop(self, reason: str) -> None:
        if self.cancel_reason is None:
            self.cancel_reason = reason
        self._cancel.set()

    def __repr__(self) -> str:
        return f"Step(id={self.id}, name={self.name!r}, handler={self.handler!r}, attempt={self.attempt})"


class _Attempt:
    """The coordinator's bookkeeping of one running attempt."""

    def __init__(self, step: Step, now: float, lease: float):
        self.step = step
        self.deadline = now + step.timeout
        self.next_beat = now + lease / 3
        self.fenced = False          # a heartbeat came back false: the result is not ours to record
        self.stop_asked_at: Optional[float] = None
        self.finished = False        # the handler returned (or was abandoned)


class Worker:
    """A stepready worker: claims ready steps, runs their handlers, records the outcomes.

    ``dsn`` is a libpq connection string or URL of a migrated stepready database, on a login role that is a
    member of ``stepready_worker``. Durations are in seconds. ``reap_interval=None`` leaves lease reaping to
    other processes (a Go daemon reaps too; exactly one instance reaps each round, whoever wins the advisory
    lock). ``listen=False`` polls only (behind PgBouncer in transaction pooling mode, where LISTEN does not work).
    ``queues`` is the routing hook (SPEC §21): passed to the claim as ``p_queues``, with the registered handler
    names as ``p_handlers``, once the database's claim function takes them; until then every ready step is
    claimed and a step whose handler is not registered here fails ``deterministic``.
    """

    def __init__(self, dsn: str, *, concurrency: int = CONCURRENCY_DEFAULT, lease: float = LEASE_DEFAULT,
                 poll_interval: float = POLL_INTERVAL_DEFAULT, reap_interval: Optional[float] = REAP_INTERVAL_DEFAULT,
                 shutdown_grace: float = SHUTDOWN_GRACE_DEFAULT, worker_id: Optional[str] = None,
                 listen: bool = True, default_timeout: float = DEFAULT_TIMEOUT,
                 abandon_grace: float = ABANDON_GRACE_DEFAULT, max_output_bytes: int = MAX_OUTPUT_BYTES_DEFAULT,
                 queues: Optional[Iterable[str]] = None, probe_interval: Optional[float] = PROBE_INTERVAL_DEFAULT):
        problems = []
        if probe_interval is not None and probe_interval <= 0:
            problems.append(f"probe_interval must be more than 0 or None, got {probe_interval}s")
        if concurrency < 1:
            problems.append(f"concurrency must be 1 or more, got {concurrency}")
        if lease < LEASE_MIN:
            problems.append(f"lease must be at least {LEASE_MIN}s, got {lease}s")
        if poll_interval <= 0:
            problems.append(f"poll_interval must be more than 0, got {poll_interval}s")
        if reap_interval is not None and not 0 < reap_interval < lease:
            problems.append(f"reap_interval must be more than 0 and shorter than the lease ({lease}s), got {reap_interval}s")
        if shutdown_grace < 0:
            problems.append(f"shutdown_grace must be 0 or more, got {shutdown_grace}s")
        if default_timeout <= 0:
            problems.append(f"default_timeout must be more than 0, got {default_timeout}s")
        if max_output_bytes < 1:
            problems.append(f"max_output_bytes must be 1 or more, got {max_output_bytes}")
        if worker_id is not None and (not worker_id or worker_id.strip() != worker_id):
            problems.append(f"worker_id must be non-empty without leading or trailing spaces, got {worker_id!r}")
        if problems:
            raise ValueError("stepready_worker: " + "; ".join(problems))
        self.dsn = dsn
        self.concurrency = concurrency
        self.lease = lease
        self.poll_interval = poll_interval
        self.reap_interval = reap_interval
        self.shutdown_grace = shutdown_grace
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}"
        self.listen = listen
        self.probe_interval = probe_interval
        self.default_timeout = default_timeout
        self.abandon_grace = abandon_grace
        self.max_output_bytes = max_output_bytes
        self.queues = list(queues) if queues is not None else None
        self._handlers: dict[str, Handler] = {}

        self._wake = threading.Event()
        self._claim_wanted = threading.Event()   # a notification or a freed slot: claim at the next turn
        self._stop = threading.Event()
        self._done: queue.SimpleQueue = queue.SimpleQueue()  # (attempt, output, exception) from handler threads
        self._running: dict[tuple[int, int], _Attempt] = {}
        self._conn: Optional[psycopg.Connection] = None
        self._claim_takes_filters = False
        self._listener: Optional[threading.Thread] = None
        self.started = threading.Event()   # set once run() is connected and claiming
        self.stats = {"claimed": 0, "completed": 0, "failed": 0, "repeated": 0, "released": 0, "fenced": 0}

    # -- handlers ---------------------------------------------------------------------------------------------

    def register(self, name: str, fn: Handler) -> None:
        """Registers ``fn`` as the handler of steps whose ``handler`` is ``name``."""
        if not isinstance(name, str) or not name or len(name) > 255:
            raise ValueError(f"handler name must be a non-empty string of at most 255 characters, got {name!r}")
        if name in self._handlers:
            raise ValueError(f"handler {name!r} is already registered")
        if not callable(fn):
            raise TypeError(f"handler {name!r}: {fn!r} is not callable")
        self._handlers[name] = fn

    def handler(self, name: str) -> Callable[[Handler], Handler]:
        """Decorator form of :meth:`register`: ``@worker.handler("resize")``."""
        def decorate(fn: Handler) -> Handler:
            self.register(name, fn)
            return fn
        return decorate

    @property
    def handler_names(self) -> list[str]:
        """The registered handler names, sorted."""
        return sorted(self._handlers)

    # -- lifecycle --------------------------------------------------------------------------------------------

    def stop(self) -> None:
        """Asks :meth:`run` to stop: no more claims, running attempts get ``shutdown_grace`` to finish, the rest are
        asked to stop and handed back uncharged (``release_step``). Safe from any thread and from a signal
        handler; run() returns when it is done."""
        self._stop.set()
        self._wake.set()

    def run(self, install_signal_handlers: Optional[bool] = None) -> None:
        """Works steps until :meth:`stop` (or SIGTERM/SIGINT when signal handlers are installed: by default when
        called in the main thread; a second signal exits at once, leaving running leases to expire)."""
        if install_signal_handlers is None:
            install_signal_handlers = threading.current_thread() is threading.main_thread()
        previous = {}
        if install_signal_handlers:
            def on_signal(signum, _frame):
                if self._stop.is_set():
                    os._exit(1)
                log.info("worker: %s received; stopping (grace %.3gs)", signal.Signals(signum).name,
                         self.shutdown_grace)
                self.stop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, on_signal)
        try:
            self._run()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _run(self) -> None:
        try:
            self._connect(deadline=None)
        except _Stopped:
            log.info("worker: stopped while waiting for the database")
            return
        if self.listen or self.probe_interval:
            self._listener = threading.Thread(target=self._listen, name="stepready-listen", daemon=True)
            self._listener.start()
        log.info("worker: %s running: handlers %s, concurrency %d, lease %.3gs, %s", self.worker_id,
                 ", ".join(self.handler_names) or "(none)", self.concurrency, self.lease,
                 "LISTEN and poll" if self.listen else "poll only")
        self.started.set()
        now = time.monotonic()
        next_poll = now
        next_due: Optional[float] = None
        next_reap = now + self.reap_interval if self.reap_interval else None
        grace_end: Optional[float] = None
        try:
            while True:
                self._wake.clear()
                self._collect()
                now = time.monotonic()
                if self._stop.is_set():
                    if grace_end is None:
                        grace_end = now + self.shutdown_grace
                        log.info("worker: stopping: %d attempts running", len(self._running))
                    if now >= grace_end:
                        for a in self._running.values():
                            a.step._ask_to_stop("shutdown")
                            if a.stop_asked_at is None:
                                a.stop_asked_at = now
                    if not self._running:
                        break
                self._watch_deadlines(now)
                self._heartbeat(now)
                free = self.concurrency - len(self._running)
                due = next_due is not None and now >= next_due
                if not self._stop.is_set() and free > 0 and (self._claim_wanted.is_set() or now >= next_poll or due):
                    self._claim_wanted.clear()
                    next_due = self._next_due(now)
                    claimed = self._claim(min(free, CLAIM_BATCH_MAX))
                    next_poll = now + self.poll_interval
                    if claimed == min(free, CLAIM_BATCH_MAX):
                        self._claim_wanted.set()  # there may be more: claim again as soon as a slot is free
                    if due and next_due is not None and next_due <= now:
                        next_due = None
                if next_reap is not None and now >= next_reap and not self._stop.is_set():
                    self._reap()
                    next_reap = time.monotonic() + self.reap_interval
                self._wake.wait(self._sleep_for(next_poll, next_due, next_reap, grace_end))
        finally:
            self._stop.set()
            self._collect()
            if self._listener is not None:
                self._listener.join(timeout=2)
            if self._conn is not None:
                self._conn.close()
            log.info("worker: stopped")

    def _sleep_for(self, next_poll: float, next_due: Optional[float], next_reap: Optional[float],
                   grace_end: Optional[float]) -> float:
        """How long the coordinator may wait before something needs it (a wake-up cuts it short)."""
        times = [next_poll]
        if self._claim_wanted.is_set() and len(self._running) < self.concurrency and not self._stop.is_set():
            return 0
        times += [t for t in (next_due, next_reap, grace_end) if t is not None]
        for a in self._running.values():
            if not a.fenced:
                times.append(a.next_beat)
            times.append(a.deadline)
            if a.stop_asked_at is not None:
                times.append(a.stop_asked_at + self.abandon_grace)
        return max(0.0, min(times) - time.monotonic())

    # -- the database -----------------------------------------------------------------------------------------

    def _connect(self, deadline: Optional[float]) -> None:
        """(Re)connects the coordinator's connection, with backoff, until deadline (None: until stopped)."""
        if self._conn is not None:
            try:
                self._conn.close()
            except psycopg.Error:
                pass
            self._conn = None
        backoff = 0.1
        while True:
            try:
                conn = psycopg.connect(self.dsn, autocommit=True, row_factory=dict_row)
                row = conn.execute("""
                    SELECT coalesce(bool_or('p_queues' = ANY (p.proargnames)), false) AS filters,
                           count(*) AS found
                      FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
                     WHERE n.nspname = 'stepready' AND p.proname = 'claim_and_start_steps'""").fetchone()
                if not row["found"]:
                    conn.close()
                    raise RuntimeError("stepready.claim_and_start_steps does not exist: migrate the database "
                                       "first (scheduler migrate up)")
                self._claim_takes_filters = row["filters"]
                self._conn = conn
                return
            except psycopg.OperationalError as e:
                if deadline is None and self._stop.is_set() and not self._running:
                    raise _Stopped() from e
                if deadline is not None and time.monotonic() + backoff > deadline:
                    raise
                log.warning("worker: database unreachable; trying again in %.1fs: %s", backoff, e)
                if deadline is None:
                    self._stop.wait(backoff)  # a stop() ends the wait at once
                else:
                    time.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    def _exec(self, sql: str, params: Any = None, *, retry_for: float = 0.0) -> list[dict[str, Any]]:
        """Runs one autocommit statement and returns its rows. A lost connection is reconnected; the statement is
        tried again while retry_for seconds have not passed (every call made here is fenced or idempotent, so a
        statement that did commit before the connection broke changes nothing the second time)."""
        deadline = time.monotonic() + retry_for
        while True:
            try:
                if self._conn is None or self._conn.closed:
                    self._connect(deadline=deadline)
                cur = self._conn.execute(sql, params)
                return cur.fetchall() if cur.description else []
            except (psycopg.OperationalError, psycopg.InterfaceError) as e:
                if time.monotonic() >= deadline:
                    raise
                log.warning("worker: lost the database connection; reconnecting: %s", e)
                self._conn = None

    def _next_due(self, now: float) -> Optional[float]:
        """When the next step waiting on its backoff becomes due, on the database's clock (next_claim_at)."""
        try:
            rows = self._exec("SELECT EXTRACT(EPOCH FROM stepready.next_claim_at() - now())::float8 AS due_in")
        except psycopg.Error as e:
            log.warning("worker: read next_claim_at: %s", e)
            return None
        due_in = rows[0]["due_in"] if rows else None
        return None if due_in is None else now + max(due_in, 0.0)

    def _claim(self, limit: int) -> int:
        lease_ms = int(self.lease * 1000)
        try:
            if self._claim_takes_filters:
                # Routing (SPEC §21): only the steps of our queues whose handler we have.
                rows = self._exec(
                    "SELECT * FROM stepready.claim_and_start_steps(p_limit => %s, p_worker => %s, "
                    "p_lease_ms => %s, p_queues => %s, p_handlers => %s)",
                    (limit, self.worker_id, lease_ms, self.queues, self.handler_names))
            else:
                rows = self._exec("SELECT * FROM stepready.claim_and_start_steps(%s, %s, %s)",
                                  (limit, self.worker_id, lease_ms))
        except psycopg.Error as e:
            log.error("worker: claim: %s", e)
            return 0
        now = time.monotonic()
        for row in rows:
            step = Step(row, self.default_timeout)
            a = _Attempt(step, now, self.lease)
            self._running[(step.id, step.token)] = a
            self.stats["claimed"] += 1
            threading.Thread(target=self._run_handler, args=(a,), name=f"stepready-step-{step.id}",
                             daemon=True).start()
        return len(rows)

    def _heartbeat(self, now: float) -> None:
        due = [a for a in self._running.values() if not a.fenced and not a.finished and a.next_beat <= now]
        if not due:
            return
        ids = [a.step.id for a in due]
        tokens = [a.step.token for a in due]
        try:
            rows = self._exec(
                "SELECT h.id, stepready.heartbeat_step(h.id, h.token, %s) AS ok "
                "FROM unnest(%s::bigint[], %s::int[]) AS h(id, token)",
                (int(self.lease * 1000), ids, tokens), retry_for=self.lease / 3)
        except psycopg.Error as e:
            # The lease still covers two more beats.
            log.warning("worker: heartbeat: %s", e)
            for a in due:
                a.next_beat = now + min(1.0, self.lease / 3)
            return
        ok = {r["id"]: r["ok"] for r in rows}
        for a in due:
            a.next_beat = now + self.lease / 3
            if not ok.get(a.step.id):
                # Cancelled, resolved, reset or reaped: no longer the running attempt. Stop the handler; its result
                # will be refused.
                a.fenced = True
                a.step._ask_to_stop("fenced")
                a.stop_asked_at = now
                log.warning("worker: step %d (%s) attempt %d is no longer the running one; stopping its handler",
                            a.step.id, a.step.name, a.step.attempt)

    def _watch_deadlines(self, now: float) -> None:
        for key, a in list(self._running.items()):
            if a.finished:
                continue
            if not a.step.cancelled() and now >= a.deadline:
                a.step._ask_to_stop("timeout")
                a.stop_asked_at = now
            if a.stop_asked_at is not None and now >= a.stop_asked_at + self.abandon_grace:
                # The handler ignores the request to stop: abandon it (its thread runs on; its result is dropped).
                a.finished = True
                del self._running[key]
                self._claim_wanted.set()
                reason = a.step.cancel_reason
                if a.fenced:
                    log.warning("worker: step %d: handler did not stop after its attempt was fenced out; its lease "
                                "is left to expire", a.step.id)
                elif reason == "shutdown":
                    self._release(a)
                else:
                    self._fail(a, {"class": outcomes.TIMEOUT,
                                   "message": "handler ignored the end of its timeout and was abandoned"})

    def _reap(self) -> None:
        try:
            with self._conn.transaction():
                won = self._conn.execute("SELECT pg_try_advisory_xact_lock(%s) AS won",
                                         (REAPER_LOCK_KEY,)).fetchone()["won"]
                total = 0
                while won:  # in batches until a short one, so a backlog of any size is reaped in one round
                    n = self._conn.execute("SELECT stepready.reap_expired_leases(now(), %s) AS n",
                                           (REAP_BATCH,)).fetchone()["n"]
                    total += n
                    if n < REAP_BATCH:
                        break
                if total:
                    log.info("worker: reaped %d expired leases", total)
        except (psycopg.OperationalError, psycopg.InterfaceError) as e:
            log.warning("worker: reap: %s", e)
            self._conn = None
        except psycopg.Error as e:
            log.error("worker: reap: %s", e)

    # -- handlers and their outcomes -------------------------------------------------------------------------

    def _run_handler(self, a: _Attempt) -> None:
        step = a.step
        fn = self._handlers.get(step.handler)
        output: Any = None
        exc: Optional[BaseException] = None
        if _has_rules(step.rules):
            # Outcome rules (SPEC §8) are evaluated by the Go daemon; this worker does not implement them, so it
            # fails the step without running the handler, whose effects could not be judged.
            exc = StepError(
                f"step {step.name!r} has outcome rules, which the Python worker does not evaluate: "
                "run this step on the Go daemon (scheduler run) or remove its rules",
                class_=outcomes.DETERMINISTIC, code="rules_unsupported", retryable=False)
        elif fn is None:
            exc = StepError(
                f"no handler named {step.handler!r} is registered on worker {self.worker_id} "
                f"(registered: {', '.join(self.handler_names) or 'none'})",
                class_=outcomes.DETERMINISTIC, code="unknown_handler")
        else:
            try:
                output = fn(step)
            except BaseException as e:  # noqa: BLE001 - a handler's failure, whatever it is, is an outcome
                exc = e
        self._done.put((a, output, exc))
        self._wake.set()

    def _collect(self) -> None:
        """Records the outcomes handler threads have handed back: completions together (complete_steps), the
        rest one by one."""
        completions: list[tuple[_Attempt, str]] = []
        while True:
            try:
                a, output, exc = self._done.get_nowait()
            except queue.Empty:
                break
            if a.finished:
                continue  # abandoned earlier: already accounted for
            a.finished = True
            self._running.pop((a.step.id, a.step.token), None)
            self._claim_wanted.set()
            doc = self._record(a, output, exc)
            if doc is not None:
                completions.append((a, doc))
        if completions:
            self._complete(completions)

    def _record(self, a: _Attempt, output: Any, exc: Optional[BaseException]) -> Optional[str]:
        """Records the outcome of one finished attempt, or returns the encoded output of a plain success for
        _collect to record with the others."""
        step = a.step
        if a.fenced:
            # The database refuses this report (the attempt is no longer the running one); it only ends the lease
            # an operator's action may have left on the step, so its concurrency slot is free at once.
            self._fail(a, {"class": outcomes.CANCELED, "message": "attempt fenced out while running"})
            return None
        failed = exc is not None
        if failed and step.cancel_reason == "shutdown":
            self._release(a)  # not the step's fault: hand it back uncharged
            return None
        if failed:
            self._fail(a, _error_document(exc, timed_out=step.cancel_reason == "timeout"))
            return None
        if isinstance(output, Repeat):
            out, err = self._encode(output.output, "handler output")
            nxt, err2 = (None, None) if output.next_input is None else self._encode(output.next_input, "next input")
            if err or err2:
                self._fail(a, {"class": outcomes.CONTRACT_FAILURE, "message": err or err2})
                return None
            self._write(a, "SELECT stepready.continue_step(%s, %s, %s::jsonb, %s::jsonb, %s) AS ok",
                        (step.id, step.token, out, nxt, output.delay_ms), "repeated")
            return None
        out, err = self._encode(output, "handler output")
        if err:
            self._fail(a, {"class": outcomes.CONTRACT_FAILURE, "message": err})
            return None
        return out

    def _encode(self, value: Any, what: str) -> tuple[Optional[str], Optional[str]]:
        try:
            text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError) as e:
            return None, f"{what} does not encode as JSON: {e}"
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > self.max_output_bytes:
            return None, f"{what} is {size} bytes, over the limit of {self.max_output_bytes} bytes (max_output_bytes)"
        return text, None

    def _complete(self, batch: list[tuple[_Attempt, str]]) -> None:
        try:
            rows = self._exec(
                "SELECT c.step_id, c.completed FROM stepready.complete_steps(%s::bigint[], %s::int[], "
                "%s::text[]::jsonb[]) c",
                ([a.step.id for a, _ in batch], [a.step.token for a, _ in batch], [d for _, d in batch]),
                retry_for=RECORD_TIMEOUT)
        except psycopg.Error as e:
            if not _refused_for_content(e) or len(batch) == 1:
                if len(batch) == 1 and _refused_for_content(e):
                    self._refused(batch[0][0], e)
                else:
                    log.error("worker: could not record %d completions; their leases will expire: %s", len(batch), e)
                return
            for a, doc in batch:  # find the entry the database refuses; record the others
                self._complete([(a, doc)])
            return
        done = {r["step_id"]: r["completed"] for r in rows}
        for a, _ in batch:
            if done.get(a.step.id):
                self.stats["completed"] += 1
            else:
                self.stats["fenced"] += 1
                log.warning("worker: step %d attempt %d: completion refused (fenced out); result dropped",
                            a.step.id, a.step.attempt)

    def _fail(self, a: _Attempt, doc: dict[str, Any]) -> None:
        try:
            rows = self._exec("SELECT state, reason FROM stepready.fail_step(%s, %s, %s::jsonb)",
                              (a.step.id, a.step.token, json.dumps(_storable(doc), ensure_ascii=False)),
                              retry_for=RECORD_TIMEOUT)
        except psycopg.Error as e:
            log.error("worker: step %d: could not record the failure; its lease will expire: %s", a.step.id, e)
            return
        if rows and rows[0]["reason"] == "stale_attempt":
            self.stats["fenced"] += 1
            log.warning("worker: step %d attempt %d: failure refused (fenced out); result dropped",
                        a.step.id, a.step.attempt)
            return
        self.stats["failed"] += 1
        log.info("worker: step %d (%s) attempt %d failed (%s): %s -> %s", a.step.id, a.step.name, a.step.attempt,
                 doc.get("class"), doc.get("message"), rows[0]["state"] if rows else "?")

    def _release(self, a: _Attempt) -> None:
        if self._write(a, "SELECT stepready.release_step(%s, %s) AS ok", (a.step.id, a.step.token), "released"):
            log.info("worker: step %d attempt %d released uncharged at shutdown", a.step.id, a.step.attempt)

    def _write(self, a: _Attempt, sql: str, params: Any, stat: str) -> bool:
        """One fenced call that returns a boolean; False: refused, the result is dropped."""
        try:
            rows = self._exec(sql, params, retry_for=RECORD_TIMEOUT)
        except psycopg.Error as e:
            if _refused_for_content(e):
                self._refused(a, e)
            else:
                log.error("worker: step %d: could not record the outcome; its lease will expire: %s", a.step.id, e)
            return False
        if rows and rows[0]["ok"]:
            self.stats[stat] += 1
            return True
        self.stats["fenced"] += 1
        log.warning("worker: step %d attempt %d: refused (fenced out); result dropped", a.step.id, a.step.attempt)
        return False

    def _refused(self, a: _Attempt, e: psycopg.Error) -> None:
        """The database refused an outcome for what it holds: record that as a contract_failure at once."""
        message = f"the database refused to record the attempt's outcome: {e} [SQLSTATE {e.sqlstate}]"
        self._fail(a, {"class": outcomes.CONTRACT_FAILURE, "message": message, "code": e.sqlstate})

    # -- LISTEN -----------------------------------------------------------------------------------------------

    def _listen(self) -> None:
        """On a connection of its own: LISTENs on stepready_ready (unless poll-only) and wakes the coordinator at
        every notification, and reads the wake-up counter (``stepready.wake_count()``) every probe interval,
        waking the coordinator when it moved, again at doubling intervals up to SETTLE_MAX, then once every
        transaction running at the move has ended (a transaction advances the counter before it commits). Writing transactions send no NOTIFY since schema
        version 21, so the probe is how work created by plain SQL or readied by another process starts promptly.
        Reconnects with backoff, waking the coordinator once after each (re)connect since notifications sent
        meanwhile are lost."""
        backoff = 0.1
        probing = self.probe_interval is not None
        while not self._stop.is_set():
            conn = None
            try:
                conn = psycopg.connect(self.dsn, autocommit=True)
                if self.listen:
                    conn.execute("LISTEN stepready_ready")
                backoff = 0.1
                self._poke()
                count: Optional[int] = None
                recheck_at: Optional[float] = None
                step = 0.0
                horizon = 0
                moved_at = 0.0
                next_probe = time.monotonic()
                while not self._stop.is_set():
                    timeout = max(0.0, next_probe - time.monotonic()) if probing else 0.5
                    readable = []
                    if self.listen:
                        readable, _, _ = select.select([conn.fileno()], [], [], timeout)
                    else:
                        self._stop.wait(timeout)
                    if readable:
                        conn.pgconn.consume_input()  # raises when the connection is gone
                        got = False
                        while conn.pgconn.notifies() is not None:
                            got = True
                        if got:
                            self._poke()
                    if not probing or time.monotonic() < next_probe:
                        continue
                    now = time.monotonic()
                    next_probe = now + self.probe_interval
                    try:
                        n, xmin, xmax = conn.execute(
                            "SELECT stepready.wake_count(), pg_snapshot_xmin(s)::text::bigint,"
                            " pg_snapshot_xmax(s)::text::bigint FROM pg_current_snapshot() AS s").fetchone()
                    except psycopg.errors.UndefinedFunction:
                        log.info("worker: the database has no wake-up counter (schema before version 21): not probing")
                        probing = False
                        continue
                    if count is not None and n != count:
                        # Claim now, again at doubling intervals up to SETTLE_MAX, then once more when every
                        # transaction running at the move (ids below xmax) has ended: the counter moves before
                        # the transaction that moved it commits.
                        step = self.probe_interval
                        recheck_at = now + step
                        horizon = max(horizon, xmax)
                        moved_at = now
                        self._poke()
                    elif recheck_at is not None and now >= recheck_at:
                        if step >= SETTLE_MAX and (xmin >= horizon or now - moved_at > self.poll_interval):
                            recheck_at, horizon = None, 0
                        else:
                            step = min(step * 2, SETTLE_MAX)
                            recheck_at = now + step
                        self._poke()
                    count = n
            except (psycopg.Error, OSError, ValueError) as e:
                if self._stop.is_set():
                    break
                log.warning("worker: LISTEN connection lost; reconnecting in %.1fs: %s", backoff, e)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
            finally:
                if conn is not None:
                    conn.close()

    def _poke(self) -> None:
        self._claim_wanted.set()
        self._wake.set()


class _Stopped(Exception):
    """stop() was called while run() waited for the database."""


def _has_rules(rules: Any) -> bool:
    return rules is not None and rules != [] and rules != {}


def _refused_for_content(e: BaseException) -> bool:
    sqlstate = getattr(e, "sqlstate", None) or ""
    return sqlstate[:2] in _REFUSED_FOR_CONTENT


def _error_document(exc: BaseException, timed_out: bool) -> dict[str, Any]:
    """fail_step's error document for what a handler raised: a StepError keeps its class and fields; anything
    else is transient (timeout when the step's timeout had passed), with the traceback kept in ``stack``."""
    if isinstance(exc, StepError):
        return exc.document()
    doc = {"class": outcomes.TIMEOUT if timed_out else outcomes.TRANSIENT,
           "message": f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__,
           "stack": "".join(traceback.format_exception(exc))}
    return doc


def _storable(doc: dict[str, Any]) -> dict[str, Any]:
    """An error document jsonb can store: NUL characters and lone surrogates in its strings replaced by U+FFFD,
    so a failure is always recorded."""
    def clean(v: Any) -> Any:
        if isinstance(v, str):
            return _UNSTORABLE.sub("\ufffd", v)
        if isinstance(v, dict):
            return {clean(k): clean(x) for k, x in v.items()}
        if isinstance(v, list):
            return [clean(x) for x in v]
        return v
    return clean(doc)
