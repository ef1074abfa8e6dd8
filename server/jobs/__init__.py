"""Remote jobs: a durable SQLite job store, a runner per device, checkpoints and artifacts.

Importing this package is cheap (stdlib only); the ML stack loads when a job runs.
"""

from ._service import JobContext, JobRefused, JobService
from ._spec import KINDS, SpecError, validate
from ._store import STATES, TERMINAL, JobStore, StoreError

__all__ = [
    "KINDS",
    "STATES",
    "TERMINAL",
    "JobContext",
    "JobRefused",
    "JobService",
    "JobStore",
    "SpecError",
    "StoreError",
    "validate",
]
