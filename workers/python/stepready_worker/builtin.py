"""The handlers ``noop``, ``sleep`` and ``fail`` with the inputs and outputs of ``scheduler run``'s built-in
handlers of the same names (SPEC §11). They are the handler set of the conformance suite
(tests/conformance/README.md): every conforming worker offers them, so the same cases run against any worker.
"""

from __future__ import annotations

from typing import Any

from .outcomes import Permanent, StepError, TRANSIENT
from .worker import Step, Worker

_SLEEP_MAX_MS = 9223372036854  # the longest sleep the Go handler takes (a time.Duration in ms)


def _object_input(step: Step, allowed: tuple[str, ...]) -> dict[str, Any]:
    """The step's input as an object with only the allowed fields; anything else is a permanent error."""
    data = step.input if step.input is not None else {}
    if not isinstance(data, dict):
        raise Permanent(f"step {step.name!r}: input: must be a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise Permanent(f"step {step.name!r}: input: unknown field {unknown[0]!r} (allowed: {', '.join(allowed)})")
    return data


def _int_field(step: Step, data: dict[str, Any], field: str, minimum: int, maximum: int) -> int:
    value = data[field]
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise Permanent(f"step {step.name!r}: input: field {field!r}: must be an integer between {minimum} and "
                        f"{maximum}, got {value!r}")
    return value


def noop(step: Step) -> Any:
    """Completes at once with its input as output ({} when it has none)."""
    return step.input if step.input is not None else {}


def sleep(step: Step) -> Any:
    """Waits ``input.ms`` milliseconds (required, >= 0), or until asked to stop; output ``{"slept_ms": ms}``."""
    data = _object_input(step, ("ms",))
    if "ms" not in data:
        raise Permanent(f"step {step.name!r}: input: field 'ms': required (milliseconds to sleep, >= 0)")
    ms = _int_field(step, data, "ms", 0, _SLEEP_MAX_MS)
    if step.wait(ms / 1000.0):
        # A plain error, as the Go handler's: transient, or timeout when the step's timeout ended it.
        raise RuntimeError(f"sleep handler: interrupted before {ms} ms ({step.cancel_reason})")
    return {"slept_ms": ms}


def fail(step: Step) -> Any:
    """Fails the first ``input.times`` attempts (default 0) with ``input.class`` (default transient),
    ``input.message`` and, when set, ``input.retry_after_ms``; then succeeds with ``{"attempts": N}``."""
    data = _object_input(step, ("times", "class", "message", "retry_after_ms"))
    times = _int_field(step, data, "times", 0, 2**31 - 1) if "times" in data else 0
    if step.attempt > times:
        return {"attempts": step.attempt}
    class_ = data.get("class") or TRANSIENT
    message = data.get("message") or f"fail handler: attempt {step.attempt} of {times} fails"
    if not isinstance(class_, str) or not isinstance(message, str):
        raise Permanent(f"step {step.name!r}: input: fields 'class' and 'message' must be strings")
    retry_after = None
    if data.get("retry_after_ms") is not None:
        retry_after = _int_field(step, data, "retry_after_ms", 0, _SLEEP_MAX_MS)
    raise StepError(message, class_=class_, retry_after_ms=retry_after)


def register(worker: Worker) -> None:
    """Registers noop, sleep and fail on worker."""
    worker.register("noop", noop)
    worker.register("sleep", sleep)
    worker.register("fail", fail)
