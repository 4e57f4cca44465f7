"""What a handler returns or raises, and how each is recorded (docs/workers.md, "Reporting the outcome").

A handler returns its output (anything ``json.dumps`` encodes) to complete the step, returns :class:`Repeat` to
run the step again (``continue_step``: polling, pagination), or raises. A :class:`StepError` (or one of its
subclasses) chooses the failure class and what ``fail_step`` does next; any other exception is a ``transient``
failure.
"""

from __future__ import annotations

from typing import Any, Optional

# The failure classes seeded in stepready.failure_classes (SPEC §2). A handler may use another name: it is
# recorded as given and treated as transient.
TRANSIENT = "transient"
TIMEOUT = "timeout"
RATE_LIMITED = "rate_limited"
CONTRACT_FAILURE = "contract_failure"
DETERMINISTIC = "deterministic"
PERMANENT = "permanent"
CANCELED = "canceled"


class StepError(Exception):
    """A failed attempt with its class and the fields of fail_step's error document.

    ``class_`` is the failure class (default ``transient``); ``retryable=False`` ends the step whatever its
    policy says; ``retry_after_ms`` (an int >= 0) is the exact delay before the next attempt, with no jitter and
    no cap; ``code`` and ``http_status`` are recorded for people and outcome rules.
    """

    def __init__(self, message: str, *, class_: str = TRANSIENT, code: Optional[str] = None,
                 retryable: Optional[bool] = None, retry_after_ms: Optional[int] = None,
                 http_status: Optional[int] = None):
        super().__init__(message)
        if not isinstance(class_, str) or not class_:
            raise ValueError(f"StepError: class_ must be a non-empty string, got {class_!r}")
        if retry_after_ms is not None and (isinstance(retry_after_ms, bool) or not isinstance(retry_after_ms, int)
                                           or retry_after_ms < 0):
            raise ValueError(f"StepError: retry_after_ms must be an int >= 0, got {retry_after_ms!r}")
        self.message = message
        self.class_ = class_
        self.code = code
        self.retryable = retryable
        self.retry_after_ms = retry_after_ms
        self.http_status = http_status

    def document(self) -> dict[str, Any]:
        """The p_error document of fail_step for this failure."""
        doc: dict[str, Any] = {"class": self.class_, "message": self.message}
        if self.code is not None:
            doc["code"] = self.code
        if self.retryable is not None:
            doc["retryable"] = self.retryable
        if self.retry_after_ms is not None:
            doc["retry_after_ms"] = self.retry_after_ms
        if self.http_status is not None:
            doc["http_status"] = self.http_status
        return doc


class Permanent(StepError):
    """A failure that no retry can fix (bad input, a 4xx, a missing object): class ``permanent``, never retried."""

    def __init__(self, message: str, *, code: Optional[str] = None, http_status: Optional[int] = None):
        super().__init__(message, class_=PERMANENT, code=code, http_status=http_status)


class RetryAfter(StepError):
    """A failure whose next attempt must wait exactly ``delay_ms`` milliseconds (a server's Retry-After).

    The class defaults to ``rate_limited``. The step's retry budget still applies: when it has no attempts left,
    the step ends (``retries_exhausted``).
    """

    def __init__(self, message: str, *, delay_ms: int, class_: str = RATE_LIMITED, code: Optional[str] = None,
                 http_status: Optional[int] = None):
        super().__init__(message, class_=class_, code=code, retry_after_ms=delay_ms, http_status=http_status)


class Repeat:
    """Returned by a handler: this iteration succeeded with ``output``; run the step again after ``delay_ms``.

    ``next_input`` replaces the step's input for the next iteration (None keeps it). The outputs of the
    iterations are collected per the step's ``collect`` (replace, append, merge); the step completes instead once
    it reaches ``max_iterations``. Repetition never consumes attempts: each iteration has its own retry budget.
    """

    def __init__(self, output: Any = None, *, next_input: Any = None, delay_ms: int = 0):
        if isinstance(delay_ms, bool) or not isinstance(delay_ms, int) or delay_ms < 0:
            raise ValueError(f"Repeat: delay_ms must be an int >= 0, got {delay_ms!r}")
        self.output = output
        self.next_input = next_input
        self.delay_ms = delay_ms
