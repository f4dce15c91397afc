"""Dense and matrix-free linear algebra on any backend for the diagnostics (internal)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._compat import (
    device,
    to_numpy,
)
from ..objective import TiltedObjective
from ._checks import _n_params


def _has_linalg(xp: Any, name: str) -> bool:
    return hasattr(xp, "linalg") and hasattr(xp.linalg, name)


def _eigvalsh(H: Any, xp: Any) -> Any:
    """Ascending eigenvalues of a symmetric matrix, in ``H``'s namespace.

    Uses ``xp.linalg.eigvalsh`` where the namespace has it (NumPy, CuPy, PyTorch,
    array-api-strict); otherwise (Dask) a host copy goes through NumPy.
    """
    H = 0.5 * (H + H.T)
    if _has_linalg(xp, "eigvalsh"):
        return xp.linalg.eigvalsh(H)
    ev = np.linalg.eigvalsh(to_numpy(H).astype(np.float64))
    return xp.asarray(ev, dtype=H.dtype, device=device(H))


def _solve(H: Any, b: Any, xp: Any) -> Any:
    """Solve ``H x = b`` for a vector ``b`` (host NumPy when ``xp`` has no linalg)."""
    if _has_linalg(xp, "solve"):
        return xp.linalg.solve(H, b[:, None])[:, 0]
    x = np.linalg.solve(to_numpy(H).astype(np.float64), to_numpy(b).astype(np.float64))
    return xp.asarray(x, dtype=b.dtype, device=device(b))  # pragma: no cover


def _hvp_operator(objective: TiltedObjective, th: Any):
    """A SciPy LinearOperator (float64, host) applying the objective's Hessian."""
    from scipy.sparse.linalg import LinearOperator

    xp = objective.xp
    p = _n_params(th)
    dev = device(th)

    def matvec(v: np.ndarray) -> np.ndarray:
        vv = xp.asarray(np.ascontiguousarray(v, dtype=np.float64).reshape(-1), device=dev)
        vv = xp.reshape(xp.astype(vv, th.dtype), tuple(th.shape))
        out = objective.hvp(th, vv)
        return to_numpy(xp.reshape(out, (p,))).astype(np.float64)

    return LinearOperator((p, p), matvec=matvec, rmatvec=matvec, dtype=np.float64)
