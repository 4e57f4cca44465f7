"""stepready_worker: a stepready worker in Python on psycopg 3 (docs/workers.md is the protocol it speaks).

    from stepready_worker import Worker, Permanent, RetryAfter, Repeat

    worker = Worker("postgres://scheduler@db/app", concurrency=8)

    @worker.handler("resize")
    def resize(step):
        if "url" not in step.input:
            raise Permanent("input.url is required")
        return {"width": 640}

    worker.run()   # until SIGTERM or SIGINT; running attempts are finished or handed back uncharged
"""

from .outcomes import Permanent, Repeat, RetryAfter, StepError
from .worker import REAPER_LOCK_KEY, Step, Worker

__all__ = ["Worker", "Step", "StepError", "Permanent", "RetryAfter", "Repeat", "REAPER_LOCK_KEY"]
__version__ = "0.1.0"
