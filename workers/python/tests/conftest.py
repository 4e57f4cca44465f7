"""Fixtures of the Python worker's tests. They need a migrated stepready database: `go test ./workers/python/`
(part of `make test`) starts one and sets STEPREADY_TEST_DATABASE_URL (its owner) and STEPREADY_TEST_WORKER_URL
(a login role in stepready_worker only). Each test starts from empty tables."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import psycopg
import pytest
from psycopg.rows import dict_row

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from stepready_worker import Worker, builtin  # noqa: E402

OWNER_URL = os.environ.get("STEPREADY_TEST_DATABASE_URL")
WORKER_URL = os.environ.get("STEPREADY_TEST_WORKER_URL") or OWNER_URL


def pytest_collection_modifyitems(config, items):
    if OWNER_URL:
        return
    skip = pytest.mark.skip(reason="no database: run these tests with `go test ./workers/python/` (make test), "
                                   "or set STEPREADY_TEST_DATABASE_URL to a migrated stepready database")
    for item in items:
        if "db" in getattr(item, "fixturenames", ()):
            item.add_marker(skip)


@pytest.fixture
def db() -> Iterator[psycopg.Connection]:
    """The database's owner, on empty tables."""
    with psycopg.connect(OWNER_URL, autocommit=True, row_factory=dict_row) as conn:
        conn.execute("TRUNCATE stepready.tasks, stepready.step_events, stepready.flow_state CASCADE")
        yield conn


def create_task(db: psycopg.Connection, *steps: dict[str, Any], **task: Any) -> int:
    definition = {"name": task.pop("name", "t"), "steps": list(steps), **task}
    return db.execute("SELECT stepready.create_task(%s::jsonb) AS id", (json.dumps(definition),)).fetchone()["id"]


def step(db: psycopg.Connection, task_id: int, name: str) -> dict[str, Any]:
    return db.execute("SELECT * FROM stepready.steps WHERE task_id = %s AND name = %s", (task_id, name)).fetchone()


def events(db: psycopg.Connection, task_id: int, name: str) -> list[dict[str, Any]]:
    return db.execute("""SELECT e.* FROM stepready.step_events e JOIN stepready.steps s ON s.id = e.step_id
                          WHERE s.task_id = %s AND s.name = %s ORDER BY e.id""", (task_id, name)).fetchall()


def wait_for(what: str, cond: Callable[[], Any], timeout: float = 20.0) -> Any:
    """Polls cond until it returns something true; fails after timeout naming what."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout}s")
        time.sleep(0.02)


def state_is(db: psycopg.Connection, task_id: int, name: str, *states: str) -> Callable[[], Any]:
    def check():
        row = step(db, task_id, name)
        return row if row["state"] in states else None
    return check


@contextlib.contextmanager
def running_worker(handlers: dict[str, Callable] | None = None, builtins: bool = True,
                   **options: Any) -> Iterator[Worker]:
    """A worker on WORKER_URL running in a thread; stopped (and its thread joined) when the block ends."""
    options.setdefault("lease", 2.0)
    options.setdefault("reap_interval", 0.2)
    options.setdefault("poll_interval", 0.5)
    options.setdefault("shutdown_grace", 0.0)
    options.setdefault("abandon_grace", 2.0)
    w = Worker(WORKER_URL, **options)
    if builtins:
        builtin.register(w)
    for name, fn in (handlers or {}).items():
        w.register(name, fn)
    failure: list[BaseException] = []

    def run():
        try:
            w.run(install_signal_handlers=False)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            failure.append(e)

    t = threading.Thread(target=run, name="worker-under-test", daemon=True)
    t.start()
    assert w.started.wait(20), "worker did not start"
    try:
        yield w
    finally:
        w.stop()
        t.join(30)
        assert not t.is_alive(), "worker did not stop within 30 s"
        if failure:
            raise failure[0]
