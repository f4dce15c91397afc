"""Per-path data shared by the checks (:class:`_PathData`) and the host-side helpers
(per-sample gradient norms, tilted risks, weights and entropies in float64)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._compat import to_numpy
from .records import _EPS

__all__: list[str] = []


def _host(x: Any) -> np.ndarray:
    return np.asarray(to_numpy(x), dtype=np.float64)


class _PathData:
    """Host-side quantities of a path, computed once (solutions sorted by tilt)."""

    def __init__(self, path: Any, rtol: float | None, fd_step: float):
        for attr in ("ts", "x", "objective"):
            if not hasattr(path, attr):
                raise TypeError(f"`path` must be a TiltPath (from tiltlab.tilt_path); no `{attr}`")
        obj = path.objective
        if getattr(obj, "is_hierarchical", False):
            raise NotImplementedError("check_path checks sample-level tilt paths")
        ts = np.asarray(path.ts, dtype=np.float64)
        if ts.ndim != 1 or ts.size < 2:
            raise ValueError("`path` needs at least two tilts")
        if not np.all(np.isfinite(ts)):
            raise ValueError("`path` tilts must be finite")
        order = np.argsort(ts, kind="stable")
        keep = np.concatenate([[True], np.diff(ts[order]) > 0])  # drop repeated tilts
        self.index = order[keep]
        self.ts = ts[self.index]
        self.obj = obj
        self.xp = obj.xp
        self.fd_step = fd_step
        self.l2 = float(getattr(obj, "l2", 0.0))
        results = list(getattr(path, "results", None) or [None] * ts.size)
        self.x_native = [path.x[int(k), ...] for k in self.index]
        # the objective's values and gradients carry the rounding of its own dtype (the
        # host float64 work adds nothing larger): the unit of the rounding allowances
        self.eps = max(_EPS, float(self.xp.finfo(self.x_native[0].dtype).eps))
        self.rtol = max(1e-10, 100.0 * self.eps) if rtol is None else rtol
        self.theta = np.stack([_host(x).reshape(-1) for x in self.x_native])
        self.shape = tuple(self.x_native[0].shape)
        T = self.ts.size
        self.L = np.stack([_host(obj.losses(x)) for x in self.x_native])  # (T, N)
        n = self.L.shape[1]
        prior = obj.prior() if hasattr(obj, "prior") else None
        self.p = np.full(n, 1.0 / n) if prior is None else _host(prior)
        self.uniform = prior is None or bool(np.allclose(self.p, 1.0 / n, rtol=0, atol=1e-15))
        self.pen = 0.5 * self.l2 * np.sum(self.theta**2, axis=1)
        self.theta_norm = np.linalg.norm(self.theta, axis=1)
        self.g_now = np.empty(T)
        self.g_rep = np.empty(T)
        self.mu = np.empty(T)
        self.G = np.empty(T)
        self.H: list[np.ndarray] = []
        for k, x in enumerate(self.x_native):
            o = obj.with_tilt(float(self.ts[k]))
            self.g_now[k] = float(np.linalg.norm(_host(o.gradient(x))))
            res = results[int(self.index[k])]
            jac = getattr(res, "jac", None)
            self.g_rep[k] = self.g_now[k] if jac is None else float(np.linalg.norm(_host(jac)))
            try:
                H = _host(o.hessian(x))
            except (NotImplementedError, ValueError, TypeError) as exc:
                raise TypeError(
                    "check_path needs an objective with Hessians (a linear-predictor loss, or "
                    f"a CallableLoss with `hess`): {exc}"
                ) from None
            H = 0.5 * (H + H.T)
            self.H.append(H)
            self.mu[k] = float(np.linalg.eigvalsh(H)[0])
            self.G[k] = float(np.max(_sample_grad_norms(o, x)))
        # solution error estimate (floored so that a singular Hessian gives a large error)
        hscale = np.array([max(np.abs(H).max(), 1e-300) for H in self.H])
        self.dtheta = self.g_rep / np.maximum(self.mu, 1e-8 * hscale)
        self._derivs: list[np.ndarray] | None = None
        self._resolved: dict[float, np.ndarray] = {}
        self._resolved_err: dict[float, float] = {}

    # -- helpers -------------------------------------------------------------------------

    def native(self, theta_host: np.ndarray) -> Any:
        xp, obj = self.xp, self.obj
        arr = xp.asarray(theta_host.reshape(self.shape), dtype=obj.dtype, device=obj.device)
        return arr

    def err(self, k: int, S: Any = 1.0, penalised: bool = False) -> Any:
        """First-order change of a loss statistic with ||dq/dl||_1 = S from solution error."""
        e = np.asarray(S) * self.G[k] * self.dtheta[k]
        if penalised:
            e = e + self.l2 * self.theta_norm[k] * self.dtheta[k]
        return e

    def derivs(self) -> list[np.ndarray]:
        """d theta / dt at each path point (general formula)."""
        if self._derivs is None:
            from ..diagnostics import solution_derivative

            self._derivs = [
                _host(solution_derivative(self.obj.with_tilt(float(t)), x)).reshape(-1)
                for t, x in zip(self.ts, self.x_native, strict=True)
            ]
        return self._derivs

    def resolve(self, t: float, start: np.ndarray) -> tuple[np.ndarray, float]:
        """A tight solve at tilt ``t`` warm-started at ``start``: (solution, error bound)."""
        key = float(t)
        if key not in self._resolved:
            from ..solvers import minimize

            o = self.obj.with_tilt(key)
            # Newton to about machine precision of the gradient (scale: per-sample gradients)
            atol = 100 * self.eps * float(np.max(self.G) + self.l2 * np.max(self.theta_norm) + 1.0)
            res = minimize(
                o, self.native(start), method="newton", tol=1e-12, atol=atol, max_iter=50
            )
            x = _host(res.x).reshape(-1)
            g = float(np.linalg.norm(_host(o.gradient(res.x))))
            H = _host(o.hessian(res.x))
            mu = float(np.linalg.eigvalsh(0.5 * (H + H.T))[0])
            self._resolved[key] = x
            self._resolved_err[key] = g / max(mu, 1e-8 * max(np.abs(H).max(), 1e-300))
        return self._resolved[key], self._resolved_err[key]

    def vjp(self, k_or_theta: Any, t: float, coef: np.ndarray) -> np.ndarray:
        """sum_i coef_i grad l_i(theta) (ridge not included)."""
        x = self.x_native[k_or_theta] if isinstance(k_or_theta, int) else k_or_theta
        return _host(_sample_vjp(self.obj.with_tilt(float(t)), x, coef)).reshape(-1)


def _sample_grad_norms(obj: Any, x: Any) -> np.ndarray:
    """||grad l_i(theta)|| for every sample."""
    xp = obj.xp
    if obj.loss.is_linear:
        th = xp.reshape(x, obj.shape)
        z = obj.X @ th
        _, d1, _ = obj.loss.derivatives(z, obj.y, validate=False, xp=xp)
        xn = np.linalg.norm(_host(obj.X), axis=1)
        d1h = _host(d1)
        dn = np.abs(d1h) if d1h.ndim == 1 else np.linalg.norm(d1h, axis=1)
        return dn * xn
    _, J = obj.loss.value_and_grad(x, obj.X, obj.y, xp=xp)
    Jh = _host(J)
    return np.linalg.norm(Jh.reshape(Jh.shape[0], -1), axis=1)


def _sample_vjp(obj: Any, x: Any, coef: np.ndarray) -> Any:
    xp = obj.xp
    c = xp.asarray(coef, dtype=obj.dtype, device=obj.device)
    if obj.loss.is_linear:
        th = xp.reshape(x, obj.shape)
        z = obj.X @ th
        _, d1, _ = obj.loss.derivatives(z, obj.y, validate=False, xp=xp)
        cd = c[:, None] * d1 if d1.ndim == 2 else c * d1
        return obj.X.T @ cd
    _, J = obj.loss.value_and_grad(x, obj.X, obj.y, xp=xp)
    return c @ J


def _tilted_risks(L: np.ndarray, p: np.ndarray, taus: np.ndarray) -> np.ndarray:
    """R(tau; l_k) for every tau (rows) and path point k (columns)."""
    from ..risk import tilted_risk

    return np.asarray(tilted_risk(L, taus, weights=p))  # (n_tau, T)


def _tilted_weights(l: np.ndarray, p: np.ndarray, tau: float) -> np.ndarray:
    from ..risk import tilted_weights

    return np.asarray(tilted_weights(l, float(tau), weights=p))


def _entropy(w: np.ndarray) -> float:
    nz = w[w > 0]
    return float(-(nz * np.log(nz)).sum())
