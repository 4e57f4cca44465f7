"""An example handler module: `python3 -m stepready_worker --handlers greet` (with examples/ on PYTHONPATH)."""

from stepready_worker import Permanent, Repeat, RetryAfter


def greet(step):
    """Greets input.name; a missing name is a permanent failure (no retry can fix it)."""
    name = step.input.get("name") if isinstance(step.input, dict) else None
    if not name:
        raise Permanent("input.name is required")
    return {"greeting": f"hello, {name}"}


def countdown(step):
    """Repeats with input.n - 1 until n is 0: one iteration per run, each with its own output."""
    n = step.input["n"]
    if n > 0:
        return Repeat({"n": n}, next_input={"n": n - 1}, delay_ms=100)
    return {"n": 0, "liftoff": True}


def busy_api(step):
    """Fails its first attempt as a rate-limited call would, asking to come back in 200 ms."""
    if step.attempt == 1:
        raise RetryAfter("HTTP 429 Too Many Requests", delay_ms=200, http_status=429)
    return {"attempt": step.attempt}


def register(worker):
    worker.register("greet", greet)
    worker.register("countdown", countdown)
    worker.register("busy_api", busy_api)
