"""Early stopping on a validation objective, as a wrapper around any solver."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, NamedTuple

from .._compat import to_numpy
from ._base import Solver
from ._result import SolverState, Status
from ._stop import Progress, StopRule

__all__ = ["BestSoFar"]


class _Best(NamedTuple):
    """The wrapped solver's memo, the last validation value and the best iterate."""

    inner: Any
    last: float
    value: float
    state: SolverState


@dataclass(frozen=True)
class BestSoFar(Solver):
    """Run ``inner`` and return the iterate with the lowest ``validation`` value.

    The validation objective is evaluated at every iterate (the start included); with
    ``patience`` the run stops after that many iterations without a new best. The
    result describes the best iterate: its ``x``, ``fun``, ``jac`` and ``nit``, with
    status ``EARLY_STOPPED`` when it is not the last one.
    """

    inner: Solver
    validation: Any
    patience: int | None = None

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.inner.name

    def _value(self, x: Any) -> float:
        return float(to_numpy(self.validation.value(x)))

    def _wrap(self, inner: SolverState, best: _Best | None) -> SolverState:
        v = self._value(inner.x)
        if best is None or v < best.value:
            best = _Best(inner.memo, v, v, inner)
        else:
            best = best._replace(inner=inner.memo, last=v)
        return dataclasses.replace(inner, memo=best)

    @staticmethod
    def _unwrap(state: SolverState) -> SolverState:
        return dataclasses.replace(state, memo=state.memo.inner)

    def init(self, objective: Any, x0: Any, *, max_iter: int, warm: Any = None) -> SolverState:
        state = self.inner.init(objective, x0, max_iter=max_iter, warm=warm)
        return state if state.failed is not None else self._wrap(state, None)

    def step(self, objective: Any, state: SolverState) -> SolverState:
        new = self.inner.step(objective, self._unwrap(state))
        if new.failed is not None:
            return dataclasses.replace(new, memo=state.memo._replace(inner=new.memo))
        return self._wrap(new, state.memo)

    def terminate(
        self, state: SolverState, rule: StopRule, progress: Progress
    ) -> tuple[Status | None, str]:
        best = state.memo.state
        if self.patience is not None and state.nit - best.nit >= self.patience:
            return Status.EARLY_STOPPED, ""
        return self.inner.terminate(self._unwrap(state), rule, progress)

    def failure(
        self, previous: SolverState, new: SolverState, rule: StopRule
    ) -> tuple[SolverState, Status, str]:
        last, status, detail = self.inner.failure(self._unwrap(previous), self._unwrap(new), rule)
        return dataclasses.replace(last, memo=previous.memo), status, detail

    def finish(
        self, objective: Any, state: SolverState, status: Status, detail: str
    ) -> tuple[SolverState, Status, str]:
        if state.memo is None:  # the start failed
            return self.inner.finish(objective, state, status, detail)
        best = state.memo.state
        last, status, detail = self.inner.finish(objective, self._unwrap(state), status, detail)
        if best.nit == last.nit:
            return last, status, detail
        if status is not Status.NONFINITE:
            if status is Status.EARLY_STOPPED:  # stopped by patience
                why = f"no validation improvement in `patience`={self.patience} iterations"
            else:
                why = status.describe(last.nit, detail)
            status = Status.EARLY_STOPPED
            detail = f"the run made {last.nit} iterations and stopped with: {why}"
        final, _, _ = self.inner.finish(objective, self.inner.refresh(objective, best), status, "")
        return final, status, detail

    def record(self, state: SolverState) -> dict[str, float]:
        return {"validation": state.memo.last}

    def export_pairs(self, state: SolverState) -> Any:
        return self.inner.export_pairs(state)
