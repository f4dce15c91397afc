"""A counter of Dask scheduler runs, shared by the tests that count graphs per call."""

from __future__ import annotations

from dask.callbacks import Callback


class SchedulerRuns(Callback):
    """Counts scheduler runs (one per ``compute``/``persist``) of the local schedulers
    while active (``with SchedulerRuns() as runs: ...; runs.n``)."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def _start(self, dsk):
        self.n += 1
