"""The Python worker against a real PostgreSQL: each outcome a handler can have, and how it is recorded."""

from __future__ import annotations

import datetime as dt
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest

from conftest import WORKER_URL, create_task, events, running_worker, state_is, step, wait_for
from stepready_worker import Permanent, Repeat, RetryAfter, StepError, Worker


def test_completes_with_the_output_recorded(db):
    task = create_task(db, {"name": "a", "handler": "noop", "input": {"hello": "world", "n": [1, 2.5, None]}})
    with running_worker():
        row = wait_for("step complete", state_is(db, task, "a", "complete"))
    assert row["output"] == {"hello": "world", "n": [1, 2.5, None]}
    assert row["attempts"] == 1
    assert row["lease_owner"] is None
    assert [e["event"] for e in events(db, task, "a")] == [
        "step.enqueued", "attempt.started", "attempt.succeeded", "step.completed"]
    assert db.execute("SELECT status FROM stepready.tasks WHERE id = %s", (task,)).fetchone()["status"] == "complete"


def test_a_dag_runs_in_dependency_order_and_every_step_once(db):
    task = create_task(db,
                       {"name": "a", "handler": "noop"},
                       {"name": "b", "handler": "noop", "depends_on": ["a"]},
                       {"name": "c", "handler": "noop", "depends_on": ["a"]},
                       {"name": "d", "handler": "noop", "depends_on": ["b", "c"]})
    with running_worker(concurrency=4):
        wait_for("task complete", lambda: db.execute("SELECT status = 'complete' AS ok FROM stepready.tasks "
                                                     "WHERE id = %s", (task,)).fetchone()["ok"])
    starts = db.execute("""SELECT s.name, count(*) AS n, min(e.id) AS first FROM stepready.step_events e
                             JOIN stepready.steps s ON s.id = e.step_id
                            WHERE e.task_id = %s AND e.event = 'attempt.started' GROUP BY s.name""", (task,)).fetchall()
    by_name = {r["name"]: r for r in starts}
    assert {n: r["n"] for n, r in by_name.items()} == {"a": 1, "b": 1, "c": 1, "d": 1}
    assert by_name["a"]["first"] < by_name["b"]["first"] < by_name["d"]["first"]
    assert by_name["c"]["first"] < by_name["d"]["first"]


def test_many_steps_with_concurrency_each_started_once(db):
    task = create_task(db, *({"name": f"s{i}", "handler": "noop", "input": {"i": i}} for i in range(60)))
    with running_worker(concurrency=8):
        wait_for("task complete", lambda: db.execute("SELECT status = 'complete' AS ok FROM stepready.tasks "
                                                     "WHERE id = %s", (task,)).fetchone()["ok"], timeout=60)
    rows = db.execute("SELECT attempts, output, input FROM stepready.steps WHERE task_id = %s", (task,)).fetchall()
    assert all(r["attempts"] == 1 and r["output"] == r["input"] for r in rows)


def test_permanent_error_is_not_retried(db):
    def bad(step):
        raise Permanent("the object is gone", code="gone", http_status=404)
    task = create_task(db, {"name": "a", "handler": "bad", "retry": {"max_attempts": 5}})
    with running_worker({"bad": bad}):
        row = wait_for("step error", state_is(db, task, "a", "error"))
    assert row["attempts"] == 1
    assert row["last_error"]["class"] == "permanent"
    assert row["last_error"]["reason"] == "not_retryable"
    assert row["last_error"]["code"] == "gone"
    assert row["last_error"]["http_status"] == 404
    assert row["last_error"]["message"] == "the object is gone"


def test_retry_after_waits_exactly_the_requested_delay(db):
    def limited(step):
        if step.attempt == 1:
            raise RetryAfter("HTTP 429", delay_ms=700, http_status=429)
        return {"attempt": step.attempt}
    # The policy's own backoff (a minute) would be used without the request.
    task = create_task(db, {"name": "a", "handler": "limited",
                            "retry": {"backoff": "fixed", "base_delay_ms": 60000, "jitter": 0.5}})
    with running_worker({"limited": limited}):
        row = wait_for("step complete", state_is(db, task, "a", "complete"))
    assert row["output"] == {"attempt": 2}
    ev = {e["event"]: e for e in events(db, task, "a") if e["event"] in ("attempt.failed", "retry.scheduled")}
    failed = ev["retry.scheduled"]
    assert failed["details"]["class"] == "rate_limited"
    assert failed["details"]["retry_after_ms"] == 700
    next_at = dt.datetime.fromisoformat(failed["details"]["next_attempt_at"])
    assert next_at - failed["at"] == dt.timedelta(milliseconds=700)
    second_start = [e for e in events(db, task, "a") if e["event"] == "attempt.started"][1]
    assert second_start["at"] >= next_at


def test_a_plain_exception_is_transient_with_its_traceback(db):
    def flaky(step):
        if step.attempt < 3:
            raise ConnectionResetError("peer reset")
        return "ok"
    task = create_task(db, {"name": "a", "handler": "flaky",
                            "retry": {"backoff": "fixed", "base_delay_ms": 100, "max_attempts": 3}})
    with running_worker({"flaky": flaky}):
        row = wait_for("step complete", state_is(db, task, "a", "complete"))
    assert row["attempts"] == 3 and row["output"] == "ok"
    failures = [e for e in events(db, task, "a") if e["event"] == "attempt.failed"]
    assert len(failures) == 2
    doc = failures[0]["details"]["error"]
    assert doc["class"] == "transient"
    assert doc["message"] == "ConnectionResetError: peer reset"
    assert "Traceback" in doc["stack"] and "flaky" in doc["stack"]


def test_repeat_continues_the_step_with_the_next_input(db):
    def pages(step):
        page = step.input["page"]
        if page < 3:
            return Repeat({"page": page}, next_input={"page": page + 1}, delay_ms=0)
        return {"page": page}
    task = create_task(db, {"name": "a", "handler": "pages", "input": {"page": 1}, "collect": "append"})
    with running_worker({"pages": pages}):
        row = wait_for("step complete", state_is(db, task, "a", "complete"))
    assert row["output"] == [{"page": 1}, {"page": 2}, {"page": 3}]
    assert row["iteration"] == 2
    # Each iteration's attempt 1 has a token of its own: the worker fences with the token, not the number.
    assert row["attempts"] == 1 and row["fence_token"] == 3
    assert [e["event"] for e in events(db, task, "a")].count("iteration.continued") == 2


def test_a_step_with_rules_is_failed_deterministic_without_running_its_handler(db):
    ran = threading.Event()

    def judged(step):
        ran.set()
        return {}
    task = create_task(db, {"name": "a", "handler": "judged", "retry": {"max_attempts": 3},
                            "rules": [{"when": "outcome.status == 'ok'", "then": {"do": "break"}}]})
    with running_worker({"judged": judged}):
        row = wait_for("step error", state_is(db, task, "a", "error"))
    assert not ran.is_set()
    assert row["attempts"] == 1
    err = row["last_error"]
    assert err["class"] == "deterministic" and err["code"] == "rules_unsupported"
    assert err["reason"] == "not_retryable"
    assert "outcome rules" in err["message"] and "'a'" in err["message"]


def test_a_step_of_a_handler_it_lacks_is_never_taken(db):
    # Routing: the claim passes the names of the worker's handlers, so a step of another handler stays ready for a
    # worker that has it, instead of failing here for want of a handler.
    other = create_task(db, {"name": "a", "handler": "transcode"})
    mine = create_task(db, {"name": "a", "handler": "noop"})
    with running_worker():
        wait_for("step complete", state_is(db, mine, "a", "complete"))
        again = create_task(db, {"name": "a", "handler": "noop"})
        wait_for("step complete", state_is(db, again, "a", "complete"))
    row = db.execute("SELECT state, attempts FROM stepready.steps WHERE task_id = %s", (other,)).fetchone()
    assert row == {"state": "pending", "attempts": 0}


@pytest.mark.parametrize("output, message", [
    (object(), "handler output does not encode as JSON"),
    (float("nan"), "handler output does not encode as JSON"),
    ("x" * 2000, "handler output is 2002 bytes, over the limit of 1000 bytes"),
])
def test_an_output_that_cannot_be_recorded_is_a_contract_failure(db, output, message):
    task = create_task(db, {"name": "a", "handler": "odd", "retry": {"max_attempts": 1}})
    with running_worker({"odd": lambda step: output}, max_output_bytes=1000):
        row = wait_for("step error", state_is(db, task, "a", "error"))
    assert row["last_error"]["class"] == "contract_failure"
    assert message in row["last_error"]["message"]


def test_an_output_the_database_refuses_is_recorded_as_a_contract_failure_at_once(db):
    # jsonb cannot hold the NUL character: complete_steps raises 22P05 and the worker records that at once
    # (instead of leaving the attempt to its lease), with the database's message.
    task = create_task(db, {"name": "a", "handler": "nul", "retry": {"max_attempts": 1}},
                       {"name": "b", "handler": "noop"})
    with running_worker({"nul": lambda step: {"text": "a\x00b"}}):
        row = wait_for("step error", state_is(db, task, "a", "error"))
        wait_for("sibling complete", state_is(db, task, "b", "complete"))
    assert row["last_error"]["class"] == "contract_failure"
    assert row["last_error"]["code"] == "22P05"
    assert "the database refused to record the attempt's outcome" in row["last_error"]["message"]


def test_a_handler_past_its_timeout_is_asked_to_stop_and_fails_timeout(db):
    seen = []

    def slow(step):
        stopped = step.wait(30)
        seen.append((stopped, step.cancel_reason))
        raise RuntimeError("gave up")
    task = create_task(db, {"name": "a", "handler": "slow", "timeout_ms": 300, "retry": {"max_attempts": 1}})
    with running_worker({"slow": slow}):
        row = wait_for("step error", state_is(db, task, "a", "error"))
    assert seen == [(True, "timeout")]
    assert row["last_error"]["class"] == "timeout"


def test_a_cancelled_attempt_is_stopped_and_its_orphaned_lease_ended(db):
    # cancel_task leaves the running attempt's lease on the step (an orphaned lease: it keeps its concurrency
    # slot). The next heartbeat comes back false; the worker stops the handler and reports it, refused, which
    # ends the lease at once instead of when it expires.
    stopped = threading.Event()
    reasons = []

    def long(step):
        step.wait(60)
        reasons.append(step.cancel_reason)
        stopped.set()
        return {"late": True}
    task = create_task(db, {"name": "a", "handler": "long"})
    with running_worker({"long": long}, lease=3.0, reap_interval=None):
        wait_for("step running", state_is(db, task, "a", "in_progress"))
        db.execute("SELECT stepready.cancel_task(%s, 'test')", (task,))
        assert step(db, task, "a")["lease_expires_at"] is not None  # orphaned
        assert stopped.wait(10), "the handler was not asked to stop"
        row = wait_for("lease ended", lambda: (lambda r: r if r["lease_expires_at"] is None else None)(
            step(db, task, "a")), timeout=10)
    assert reasons == ["fenced"]
    assert row["state"] == "cancelled" and row["output"] is None
    assert "lease.expired" not in [e["event"] for e in events(db, task, "a")]


def test_stop_hands_a_running_attempt_back_uncharged(db):
    task = create_task(db, {"name": "a", "handler": "sleep", "input": {"ms": 60000}})
    with running_worker(shutdown_grace=0.0) as w:
        wait_for("step running", state_is(db, task, "a", "in_progress"))
        w.stop()
    row = step(db, task, "a")
    assert row["state"] == "pending" and row["attempts"] == 0 and row["lease_owner"] is None
    released = [e for e in events(db, task, "a") if e["event"] == "step.released"]
    assert len(released) == 1 and released[0]["details"]["uncharged"] is True


def test_stop_lets_an_attempt_finish_within_the_grace(db):
    task = create_task(db, {"name": "a", "handler": "sleep", "input": {"ms": 800}})
    with running_worker(shutdown_grace=20.0) as w:
        wait_for("step running", state_is(db, task, "a", "in_progress"))
        w.stop()
    row = step(db, task, "a")
    assert row["state"] == "complete" and row["attempts"] == 1 and row["output"] == {"slept_ms": 800}


def test_sigterm_stops_the_command_and_releases_uncharged(db):
    task = create_task(db, {"name": "a", "handler": "sleep", "input": {"ms": 60000}})
    env = dict(os.environ, STEPREADY_DATABASE_URL=WORKER_URL, STEPREADY_SHUTDOWN_GRACE="0s",
               STEPREADY_LEASE="2s", STEPREADY_REAP_INTERVAL="500ms")
    proc = subprocess.Popen([sys.executable, "-m", "stepready_worker", "--builtins"], env=env,
                            cwd=Path(__file__).resolve().parent.parent, stderr=subprocess.PIPE, text=True)
    try:
        wait_for("step running", state_is(db, task, "a", "in_progress"))
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr
    assert "SIGTERM received" in stderr
    row = step(db, task, "a")
    assert row["state"] == "pending" and row["attempts"] == 0


def test_sigterm_while_waiting_for_the_database_exits_cleanly():
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, STEPREADY_DATABASE_URL=f"postgres://nobody@127.0.0.1:{port}/none?connect_timeout=2")
    proc = subprocess.Popen([sys.executable, "-m", "stepready_worker", "--builtins"], env=env,
                            cwd=Path(__file__).resolve().parent.parent, stderr=subprocess.PIPE, text=True)
    try:
        stderr = ""
        deadline = time.monotonic() + 20
        while "database unreachable" not in stderr and time.monotonic() < deadline:
            stderr += proc.stderr.readline()
        assert "database unreachable; trying again" in stderr
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr + rest
    assert "stopped while waiting for the database" in rest


def test_a_notification_wakes_the_worker_long_before_its_poll(db):
    with running_worker(poll_interval=60.0):
        time.sleep(0.3)  # let the first poll pass: the next one is a minute away
        created = time.monotonic()
        task = create_task(db, {"name": "a", "handler": "noop"})
        wait_for("step complete", state_is(db, task, "a", "complete"), timeout=10)
        assert time.monotonic() - created < 5


def test_poll_only_works_without_listen(db):
    with running_worker(listen=False, poll_interval=0.2):
        task = create_task(db, {"name": "a", "handler": "noop"})
        wait_for("step complete", state_is(db, task, "a", "complete"))


def test_a_retry_is_claimed_when_its_backoff_ends_not_at_the_next_poll(db):
    task = create_task(db, {"name": "a", "handler": "fail", "input": {"times": 1},
                            "retry": {"backoff": "fixed", "base_delay_ms": 500, "jitter": 0}})
    with running_worker(poll_interval=60.0):
        row = wait_for("step complete", state_is(db, task, "a", "complete"), timeout=15)
    assert row["output"] == {"attempts": 2}
    starts = [e["at"] for e in events(db, task, "a") if e["event"] == "attempt.started"]
    assert starts[1] - starts[0] < dt.timedelta(seconds=5)


def test_the_worker_reaps_expired_leases(db):
    task = create_task(db, {"name": "a", "handler": "noop", "retry": {"backoff": "fixed", "base_delay_ms": 0}})
    # A worker that died right after its claim: its lease (1 ms) expires at once.
    db.execute("SELECT * FROM stepready.claim_and_start_steps(1, 'dead-worker', 1)")
    with running_worker(reap_interval=0.1):
        row = wait_for("step complete", state_is(db, task, "a", "complete"))
    assert row["attempts"] == 2
    kinds = [e["event"] for e in events(db, task, "a")]
    assert "lease.expired" in kinds
    failed = [e for e in events(db, task, "a") if e["event"] == "attempt.failed"][0]
    assert failed["details"]["class"] == "stalled"


def test_heartbeats_keep_a_step_longer_than_its_lease(db):
    task = create_task(db, {"name": "a", "handler": "sleep", "input": {"ms": 2500}})
    with running_worker(lease=0.6, reap_interval=0.1):
        row = wait_for("step complete", state_is(db, task, "a", "complete"))
    assert row["attempts"] == 1
    assert "lease.expired" not in [e["event"] for e in events(db, task, "a")]


def test_the_worker_survives_its_connections_being_terminated(db):
    role = psycopg.conninfo.conninfo_to_dict(WORKER_URL).get("user")
    with running_worker(poll_interval=0.3):
        first = create_task(db, {"name": "a", "handler": "noop"})
        wait_for("first complete", state_is(db, first, "a", "complete"))
        n = db.execute("SELECT count(pg_terminate_backend(pid)) AS n FROM pg_stat_activity WHERE usename = %s "
                       "AND pid <> pg_backend_pid()", (role,)).fetchone()["n"]
        assert n >= 1
        second = create_task(db, {"name": "a", "handler": "noop"})
        wait_for("second complete", state_is(db, second, "a", "complete"))


def test_bad_settings_are_refused_naming_them():
    with pytest.raises(ValueError, match=r"lease must be at least 0.3s, got 0.1s"):
        Worker("postgres://x", lease=0.1)
    with pytest.raises(ValueError, match=r"reap_interval must be more than 0 and shorter than the lease"):
        Worker("postgres://x", lease=1.0, reap_interval=2.0)
    with pytest.raises(ValueError, match=r"concurrency must be 1 or more, got 0"):
        Worker("postgres://x", concurrency=0)


def test_errors_and_repeats_refuse_bad_values():
    with pytest.raises(ValueError, match="retry_after_ms must be an int >= 0"):
        StepError("x", retry_after_ms=-1)
    with pytest.raises(ValueError, match="delay_ms must be an int >= 0"):
        Repeat({}, delay_ms=-5)
    with pytest.raises(ValueError, match="handler 'noop' is already registered"):
        w = Worker("postgres://x")
        w.register("noop", lambda s: None)
        w.register("noop", lambda s: None)


def test_the_readme_example_module_runs(db):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
    import greet

    task = create_task(db,
                       {"name": "hello", "handler": "greet", "input": {"name": "world"}},
                       {"name": "nameless", "handler": "greet", "input": {}, "on_exhausted": "skip"},
                       {"name": "count", "handler": "countdown", "input": {"n": 2}, "collect": "append"},
                       {"name": "api", "handler": "busy_api"})
    w_handlers = {}

    class Collect:
        def register(self, name, fn):
            w_handlers[name] = fn
    greet.register(Collect())
    with running_worker(w_handlers, builtins=False):
        hello = wait_for("hello complete", state_is(db, task, "hello", "complete"))
        nameless = wait_for("nameless skipped", state_is(db, task, "nameless", "skipped"))
        count = wait_for("count complete", state_is(db, task, "count", "complete"))
        api = wait_for("api complete", state_is(db, task, "api", "complete"))
    assert hello["output"] == {"greeting": "hello, world"}
    assert nameless["last_error"]["class"] == "permanent"
    assert count["output"] == [{"n": 2}, {"n": 1}, {"n": 0, "liftoff": True}]
    assert api["output"] == {"attempt": 2}


def test_routing_takes_the_worker_s_queues_only(db):
    # The worker passes its queues (and its handlers' names) to claim_and_start_steps: a step of another queue
    # stays ready; steps of its queues run.
    other = create_task(db, {"name": "a", "handler": "noop", "queue": "media"})
    emails = create_task(db, {"name": "a", "handler": "noop", "queue": "emails"})
    default = create_task(db, {"name": "a", "handler": "noop"})
    with running_worker(queues=["default", "emails"]):
        wait_for("step complete", state_is(db, emails, "a", "complete"))
        wait_for("step complete", state_is(db, default, "a", "complete"))
        again = create_task(db, {"name": "a", "handler": "noop", "queue": "emails"})
        wait_for("step complete", state_is(db, again, "a", "complete"))
    row = db.execute("SELECT state, attempts FROM stepready.steps WHERE task_id = %s", (other,)).fetchone()
    assert row == {"state": "pending", "attempts": 0}


def test_deps_and_the_resolved_input_arrive_with_the_claim(db):
    seen = {}

    def listing(step):
        return {"files": ["a.csv", "b.csv"]}

    def use(step):
        seen.update(input=step.input, deps=step.deps, first=step.dep("list")["files"][0],
                    element=step.element, index=step.element_index)
        try:
            step.dep("nope")
        except Exception as exc:  # noqa: BLE001 - the class is what is checked
            seen["missing"] = exc
        return {}
    task = create_task(db, {"name": "list", "handler": "listing"},
                       {"name": "use", "handler": "use", "depends_on": ["list"],
                        "input": {"first": "${deps.list.files.0}", "where": "${context.region}"}},
                       context={"region": "eu"})
    with running_worker({"listing": listing, "use": use}):
        wait_for("step complete", state_is(db, task, "use", "complete"))
    assert seen["input"] == {"first": "a.csv", "where": "eu"}
    assert seen["deps"] == {"list": {"files": ["a.csv", "b.csv"]}}
    assert seen["first"] == "a.csv"
    assert seen["element"] is None and seen["index"] == -1
    assert type(seen["missing"]).__name__ == "Permanent" and "deps.nope" in str(seen["missing"])
