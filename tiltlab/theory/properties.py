"""The paper's property checks along a path: stationarity, objective and risk
monotonicity, the sign theorem, the trade-offs, variance, cosine similarity and weight
entropy, with the corrected local forms (``*_local``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .path_data import (
    _entropy,
    _host,
    _PathData,
    _sample_grad_norms,
    _tilted_risks,
    _tilted_weights,
)
from .records import _NOT_A_THEOREM, _SAFETY, PropertyCheck, _Violations

__all__: list[str] = []


def _check_stationarity(d: _PathData) -> PropertyCheck:
    v = _Violations()
    scale = d.G + d.l2 * d.theta_norm
    tol = np.maximum(_SAFETY * d.g_rep, 1e3 * d.eps * np.maximum(scale, 1.0))
    v.add(d.g_now, tol)
    hscale = np.array([np.abs(H).max() for H in d.H])
    v.add(-d.mu, 0.0)  # the smallest Hessian eigenvalue must be positive
    bad_mu = np.sum(d.mu <= 1e-14 * hscale)
    desc = (
        "Each path point is a strict local minimum of its objective: the recomputed gradient "
        "norm is within 10x the solver's reported one, and the Hessian is positive definite. "
        f"Largest recomputed gradient norm {d.g_now.max():.2e} (reported {d.g_rep.max():.2e}); "
        f"smallest Hessian eigenvalue {d.mu.min():.3e}."
    )
    if bad_mu:
        desc += f" {bad_mu} point(s) without a positive definite Hessian."
    return v.record(
        "stationarity",
        desc,
        "Assumption 'strict saddle' and Lemma 'grad Lambda(t; theta(t)) = 0' (app. GLM solutions)",
    )


def _check_objective_monotone(d: _PathData) -> PropertyCheck:
    v = _Violations()
    R = _tilted_risks(d.L, d.p, d.ts)  # (tau, k)
    for k in range(d.ts.size):
        vals = R[:, k]
        excess = vals[:-1] - vals[1:]
        v.add(excess, d.rtol * (np.abs(vals[:-1]) + np.abs(vals[1:])) + 1e-300)
    return v.record(
        "objective_monotone_in_t",
        "R(t; theta) is non-decreasing in t at every fixed path solution theta, over all path "
        "tilts (holds for any losses: power-mean inequality).",
        "Theorem 'Tilted objective is increasing with t' (thm: obj-increasing)",
    )


def _check_optimal_objective(d: _PathData) -> PropertyCheck:
    v = _Violations()
    R = _tilted_risks(d.L, d.p, d.ts)
    F = np.diag(R) + d.pen
    for k in range(d.ts.size - 1):
        # the value error at a near-stationary point is about ||g|| * dtheta
        tol = _SAFETY * (d.g_rep[k] * d.dtheta[k] + d.g_rep[k + 1] * d.dtheta[k + 1])
        tol += d.rtol * (abs(F[k]) + abs(F[k + 1]))
        v.add(F[k] - F[k + 1], tol)
    return v.record(
        "optimal_objective_monotone",
        "The optimal objective F(t) = min_theta R(t; theta) (+ ridge) is non-decreasing in t "
        "along the path (holds for any losses).",
        "Theorem 'Optimal tilted objective is increasing with t' (thm: opt-obj-increasing)",
    )


def _pen_label(d: _PathData) -> str:
    return " (+ ridge penalty)" if d.l2 else ""


def _check_risk_sign(d: _PathData) -> PropertyCheck:
    v = _Violations()
    R = _tilted_risks(d.L, d.p, d.ts) + d.pen[None, :]
    for j, tau in enumerate(d.ts):
        vals = R[j]
        for k in range(d.ts.size - 1):
            diff = vals[k + 1] - vals[k]
            tol = _SAFETY * (d.err(k, 1.0, True) + d.err(k + 1, 1.0, True))
            tol += d.rtol * (abs(vals[k]) + abs(vals[k + 1]))
            if d.ts[k + 1] <= tau:
                v.add(diff, tol)  # must not increase before tau
            elif d.ts[k] >= tau:
                v.add(-diff, tol)  # must not decrease after tau
    return v.record(
        "risk_sign",
        "For every path tilt tau, t -> R(tau; theta(t))"
        + _pen_label(d)
        + " is non-increasing for t <= tau and non-decreasing for t >= tau (differences "
        "between consecutive path solutions)." + _NOT_A_THEOREM + " The local form holds "
        "(risk_sign_local).",
        "Theorem 'd/dt R(tau; theta(t)) < 0 iff t < tau, = 0 iff t = tau' (thm:Lambda)",
    )


def _check_risk_sign_local(d: _PathData) -> PropertyCheck:
    v = _Violations()
    h = d.fd_step
    for k, tau in enumerate(d.ts):
        o = d.obj.with_tilt(float(tau))
        f0 = float(_host(o.value(d.x_native[k])))
        for s in (-1.0, 1.0):
            th, e = d.resolve(tau + s * h, d.theta[k])
            f1 = float(_host(o.value(d.native(th))))
            # F_tau(theta(tau +- h)) >= F_tau(theta(tau)): a stationary minimum at t = tau
            g1 = float(np.linalg.norm(_host(o.gradient(d.native(th)))))
            tol = _SAFETY * (d.g_rep[k] * d.dtheta[k] + g1 * e) + d.rtol * (abs(f0) + abs(f1))
            v.add(f0 - f1, tol)
    return v.record(
        "risk_sign_local",
        f"Corrected sign theorem: for every path tilt tau, t -> R(tau; theta(t)){_pen_label(d)} "
        f"has a minimum at t = tau, checked against tight re-solves at tau +- {h:g} "
        "(its derivative vanishes at tau and has the sign of t - tau nearby).",
        "Theorem thm:Lambda, local form (the proof's quadratic form is sign-definite as t -> tau)",
    )


def _monotone(v: _Violations, d: _PathData, ks: Sequence[int], q: np.ndarray, S, increasing, pen):
    for a, b in zip(ks[:-1], ks[1:], strict=True):
        diff = q[b] - q[a]
        tol = _SAFETY * (d.err(a, S[a], pen) + d.err(b, S[b], pen))
        tol += d.rtol * (abs(q[a]) + abs(q[b]))
        v.add(-diff if increasing else diff, tol)


def _parts_tuple(parts: dict[str, _Violations]) -> tuple:
    return tuple((label, part.worst == 0.0, part.worst) for label, part in parts.items())


def _parts_note(parts: dict[str, _Violations]) -> str:
    out = []
    for label, part in parts.items():
        state = "holds" if part.worst == 0.0 else f"fails by up to {part.worst:.3g}"
        out.append(f"{label} part {state}")
    return " (" + "; ".join(out) + ")."


def _two_parts(d, ks, first, second) -> tuple[_Violations, dict[str, _Violations]]:
    """Check two monotonicity statements; (combined, per part)."""
    ones = np.ones(d.ts.size)
    parts = {}
    for label, q, increasing in (first, second):
        part = _Violations()
        _monotone(part, d, ks, q, ones, increasing, True)
        parts[label] = part
    both = _Violations()
    for part in parts.values():
        both.add(part.worst, part.worst_tol)
    return both, parts


def _check_max_mean(d: _PathData) -> PropertyCheck:
    ks = [k for k in range(d.ts.size) if d.ts[k] >= 0]
    v, parts = _two_parts(
        d, ks, ("max", d.L.max(axis=1) + d.pen, False), ("mean", d.L @ d.p + d.pen, True)
    )
    desc = (
        f"For t >= 0: the max-loss{_pen_label(d)} is non-increasing and the mean loss"
        f"{_pen_label(d)} non-decreasing along the path ({len(ks)} tilts)"
        + _parts_note(parts)
        + _NOT_A_THEOREM
        + " It has no local form at t = 0: the max-loss is the risk at tau = +inf, far "
        "from t, and d/dt max-loss can be positive already at t = 0+ on valid data."
    )
    if len(ks) < 2:
        desc += " Skipped: fewer than two tilts >= 0."
    return v.record(
        "max_mean_tradeoff",
        desc,
        "Theorem 'Average- vs. max-loss tradeoff' (thm:tradeoff)",
        _parts_tuple(parts),
    )


def _check_min_mean(d: _PathData) -> PropertyCheck:
    ks = [k for k in range(d.ts.size) if d.ts[k] <= 0]
    v, parts = _two_parts(
        d, ks, ("min", d.L.min(axis=1) + d.pen, True), ("mean", d.L @ d.p + d.pen, False)
    )
    desc = (
        f"For t <= 0: the min-loss{_pen_label(d)} is non-decreasing and the mean loss"
        f"{_pen_label(d)} non-increasing along the path ({len(ks)} tilts), as the theorem "
        "is printed; its proof also swaps max for min, R^+ for R^-, and keeps '>' through a "
        "limit" + _parts_note(parts) + _NOT_A_THEOREM
    )
    if len(ks) < 2:
        desc += " Skipped: fewer than two tilts <= 0."
    return v.record(
        "min_mean_tradeoff",
        desc,
        "Theorem 'Average- vs. min-loss tradeoff' (thm:tradeoff-2)",
        _parts_tuple(parts),
    )


def _variance_parts(l: np.ndarray, p: np.ndarray) -> tuple[float, float, np.ndarray]:
    m = float(p @ l)
    var = float(p @ (l - m) ** 2)
    return m, var, 2.0 * p * (l - m)  # d var / d l


def _check_variance(d: _PathData) -> PropertyCheck:
    v = _Violations()
    var = np.empty(d.ts.size)
    S = np.empty(d.ts.size)
    for k in range(d.ts.size):
        _, var[k], dv = _variance_parts(d.L[k], d.p)
        S[k] = np.abs(dv).sum()
    _monotone(v, d, list(range(d.ts.size)), var, S, False, False)
    return v.record(
        "variance_decreasing",
        "The (prior-weighted) variance of the losses is non-increasing along the whole path, "
        "as the theorem states (for every t)." + _NOT_A_THEOREM + " Corrected: variance_local.",
        "Theorem 'Variance reduction' (thm: variance-reduction)",
    )


def _zero_point(d: _PathData) -> tuple[Any, np.ndarray, np.ndarray, str]:
    """(native theta, host theta, d theta/dt) at t = 0 (re-solved if 0 is not on the path)."""
    from ..diagnostics import solution_derivative

    hits = np.flatnonzero(d.ts == 0.0)
    if hits.size:
        k = int(hits[0])
        return d.x_native[k], d.theta[k], d.derivs()[k], "the path point t = 0"
    k = int(np.argmin(np.abs(d.ts)))
    th, _ = d.resolve(0.0, d.theta[k])
    x = d.native(th)
    dth = _host(solution_derivative(d.obj.with_tilt(0.0), x)).reshape(-1)
    return x, th, dth, "t = 0 (re-solved: 0 is not on the path)"


def _local_tol(
    d: _PathData,
    t: float,
    x: Any,
    grad_q: np.ndarray,
    dq_abs: np.ndarray,
    dth: np.ndarray,
    c_abs: np.ndarray,
) -> float:
    """Tolerance of a local rate ``grad_q . dth`` that scales with its rounding error.

    ``grad_q = sum_i dq_i grad l_i`` and ``dth = -H^-1 c`` (``c = sum_i c_i grad l_i``)
    are sums with cancellation (a rate of 1e-78 can be built from terms of 1e-70), so
    the rounding error is bounded through the sums of absolute values ``dq_abs`` and
    ``c_abs`` (each coefficient's magnitude before cancellation) times the per-sample
    gradient norms, with ``||H^-1|| = 1 / mu``.
    """
    o = d.obj.with_tilt(float(t))
    G = _sample_grad_norms(o, x)
    H = _host(o.hessian(x))
    ev = np.linalg.eigvalsh(0.5 * (H + H.T))
    mu = max(float(ev[0]), 1e-12 * max(float(np.abs(ev).max()), 1e-300))
    gq, nd = float(np.linalg.norm(grad_q)), float(np.linalg.norm(dth))
    A = float(dq_abs @ G)
    B = float(c_abs @ G) / mu
    return 1e-8 * (gq * nd + A * nd + gq * B) + 1e-300


def _check_variance_local(d: _PathData) -> PropertyCheck:
    v = _Violations()
    x0, th0, dth, where = _zero_point(d)
    l = _host(d.obj.losses(x0))
    _, _, dv = _variance_parts(l, d.p)
    grad_var = d.vjp(x0, 0.0, dv)  # = 2 c_0
    rate = float(grad_var @ dth)
    m = float(d.p @ l)
    c_abs = d.p * (np.abs(l) + abs(m))
    tol = _local_tol(d, 0.0, x0, grad_var, 2 * c_abs, dth, c_abs)
    v.add(rate, tol)
    return v.record(
        "variance_local",
        f"Corrected variance reduction: d/dt Var(l(theta(t))) at {where} equals "
        f"-2 c0' H^-1 c0 <= 0 (computed: {rate:.4g}).",
        "Theorem thm: variance-reduction, local form at t = 0 (where V(t) = V_0)",
    )


def _cosine_parts(l: np.ndarray, p: np.ndarray) -> tuple[float, np.ndarray]:
    m = float(p @ l)
    q = math.sqrt(float(p @ (l * l)))
    s = m / q
    ds = p / q - m * p * l / q**3
    return s, ds


_COSINE_REF = (
    "Theorem 'Cosine similarity of the loss vector and the all-ones vector increases "
    "with t' (thm: cosine-similarity)"
)


def _check_cosine(d: _PathData) -> PropertyCheck:
    v = _Violations()
    # the cosine E l / sqrt(E l^2) is defined for losses of any sign (not for all-zero ones)
    ks = [k for k in range(d.ts.size) if np.any(d.L[k] != 0)]
    s = np.zeros(d.ts.size)
    S = np.zeros(d.ts.size)
    for k in ks:
        s[k], ds = _cosine_parts(d.L[k], d.p)
        S[k] = np.abs(ds).sum()
    _monotone(v, d, ks, s, S, True, False)
    desc = (
        "The cosine similarity of the loss vector with the all-ones vector (prior-weighted: "
        "E l / sqrt(E l^2)) is non-decreasing along the whole path." + _NOT_A_THEOREM
    )
    if np.any(d.L < 0):
        desc += (
            " The losses take negative values here; the cosine is still defined, and the "
            "local form (cosine_local) needs a non-negative mean loss."
        )
    if len(ks) < d.ts.size:
        desc += f" {d.ts.size - len(ks)} point(s) with all-zero losses left out."
    return v.record("cosine_increasing", desc, _COSINE_REF)


def _check_cosine_local(d: _PathData) -> PropertyCheck:
    v = _Violations()
    x0, _, dth, where = _zero_point(d)
    l = _host(d.obj.losses(x0))
    ref = "Theorem thm: cosine-similarity, local form at t = 0"
    if np.all(l == 0):
        return PropertyCheck(
            "cosine_local", True, 0.0, "Skipped: all losses are zero at t = 0 (no cosine).", ref
        )
    _, ds = _cosine_parts(l, d.p)
    grad_s = d.vjp(x0, 0.0, ds)
    rate = float(grad_s @ dth)
    m = float(d.p @ l)
    q = math.sqrt(float(d.p @ (l * l)))
    ds_abs = d.p / q + abs(m) * d.p * np.abs(l) / q**3
    tol = _local_tol(d, 0.0, x0, grad_s, ds_abs, dth, d.p * (np.abs(l) + abs(m)))
    v.add(-rate, tol)
    cond = m >= 0 and d.l2 == 0
    desc = (
        f"Corrected cosine statement: d/dt s(l(theta(t)), 1) at {where} equals "
        "(m c0' H^-1 c0 + lambda Var theta' H^-1 c0) / q^3 (m the mean and q the root mean "
        "square loss, lambda the ridge), which is >= 0 when m >= 0 and lambda = 0 (the "
        f"theorem's real condition; the paper states none). Here m = {m:.4g}, "
        f"lambda = {d.l2:g}; computed rate {rate:.4g}."
    )
    if not cond:
        desc += " The condition does not hold here, so the sign is not guaranteed" + (
            ": with m < 0 the cosine decreases through t = 0, as the formula predicts."
            if m < 0
            else "."
        )
    return v.record("cosine_local", desc, ref)


def _entropy_parts(l: np.ndarray, p: np.ndarray, tau: float) -> tuple[float, np.ndarray]:
    w = _tilted_weights(l, p, tau)
    H = _entropy(w)
    logw = np.log(np.where(w > 0, w, 1.0))
    dH = -tau * w * (logw + H)  # d H / d l (uniform prior)
    return H, dH


def _uniform_only(name: str, ref: str) -> PropertyCheck:
    return PropertyCheck(
        name,
        True,
        0.0,
        "Not applicable: the weight-entropy statements assume uniform prior weights.",
        ref,
    )


_ENTROPY_REF = (
    "Theorem 'Gradient weights become more uniform by increasing t' (thm: uniform_gradient_weights)"
)


def _check_entropy(d: _PathData) -> PropertyCheck:
    if not d.uniform:
        return _uniform_only("entropy_increasing", _ENTROPY_REF)
    v = _Violations()
    taus = [float(t) for t in d.ts if t != 0]
    for tau in taus:
        Hs = np.empty(d.ts.size)
        S = np.empty(d.ts.size)
        for k in range(d.ts.size):
            Hs[k], dH = _entropy_parts(d.L[k], d.p, tau)
            S[k] = np.abs(dH).sum()
        _monotone(v, d, list(range(d.ts.size)), Hs, S, True, False)
    return v.record(
        "entropy_increasing",
        "For every non-zero path tilt tau, the entropy H(w(tau; theta(t))) of the tau-tilted "
        "weights at the path solution theta(t) is non-decreasing in t (the theorem's "
        "statement; at tau = 0 the weights are uniform and H = log N for every t, so its "
        "strict '> 0' fails there; tau = 0 is left out)." + _NOT_A_THEOREM,
        _ENTROPY_REF,
    )


def _check_entropy_local(d: _PathData) -> PropertyCheck:
    if not d.uniform:
        return _uniform_only("entropy_local", _ENTROPY_REF + ", local form")
    v = _Violations()
    worst_rate = np.inf
    for k, tau in enumerate(d.ts):
        if tau == 0:
            continue
        _, dH = _entropy_parts(d.L[k], d.p, float(tau))
        grad_H = d.vjp(k, float(tau), dH)  # = -tau^2 c_tau
        rate = float(grad_H @ d.derivs()[k])
        worst_rate = min(worst_rate, rate)
        w = _tilted_weights(d.L[k], d.p, float(tau))
        logw = np.log(np.where(w > 0, w, 1.0))
        Hw = _entropy(w)
        dH_abs = abs(tau) * w * (np.abs(logw) + Hw)  # before cancellation in log w + H
        lbar = float(w @ d.L[k])
        c_abs = w * (np.abs(d.L[k]) + abs(lbar))
        tol = _local_tol(d, float(tau), d.x_native[k], grad_H, dH_abs, d.derivs()[k], c_abs)
        v.add(-rate, tol)
    return v.record(
        "entropy_local",
        "Corrected weight-uniformity statement: for every non-zero path tilt tau, "
        "d/dt H(w(tau; theta(t))) at t = tau equals tau^2 c' H^-1 c >= 0 "
        f"(smallest computed rate {worst_rate:.4g}).",
        _ENTROPY_REF + ", local form at t = tau",
    )
