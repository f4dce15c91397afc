"""The generic array-API engine for predictor losses (``z = X @ theta``), any tilt tree.

For a hierarchy with levels ``0`` (samples) ... ``L`` (root) and tilts ``t_1 .. t_L``
applied at levels ``1 .. L``, the Hessian-vector product is

    H v = X^T (w * l'' * Xv) + sum_k t_k X^T (w * l' * (s_{k-1} - s_k)) + l2 v,

where ``a = l' * Xv`` (the directional derivative of each loss) and ``s_k`` is, for each
sample, the ``w``-weighted mean of ``a`` over its node at level ``k`` (``s_0 = a``,
``s_L = g . v``). With no groups this is the tilted Hessian lemma
``H = sum w_i H_i + t sum w_i (g_i - g)(g_i - g)^T``; every level adds the covariance of
its children's gradients, scaled by its tilt. Two passes over ``X`` per product.
"""

from __future__ import annotations

import math
from typing import Any

from ..._compat import device, is_lazy, is_numpy_namespace
from ...accumulator import NonFiniteLosses
from ...risk import (
    broadcast_groups,
    hierarchy_eval,
    risk_and_weights,
    risk_weights_scalar,
    segment_sum,
)
from ..linearization import Linearization
from .base import Context, Engine

__all__ = [
    "GENERIC",
    "GenericEngine",
    "aggregate",
    "penalty",
    "tilt_term_coef",
]


def aggregate(
    problem: Any, ell: Any, theta: Any = None, *, weights: bool = True
) -> tuple[Any, Any]:
    """Risk and per-sample weights of the losses ``ell`` under the problem's tilts
    (``weights=False``: the weights may be None, where that saves work).

    Non-finite losses give IEEE results (inf for an overflowing trial step), unless they
    come from a non-finite ``theta``: that raises a ``ValueError`` naming it. At a finite
    non-zero tilt the reduction reads the losses' extremes and rejects non-finite ones by
    itself; at ``t = 0`` and ``t = +-inf`` (the mean, the extremes) a non-finite risk sends
    ``theta`` to the same check, on eager backends in host memory (on a device the
    result is not read back: NaN there).
    """
    xp = problem.xp
    tilts = problem.tilts
    if problem.tree is None:
        if not is_lazy(xp):
            try:
                out = risk_weights_scalar(ell, problem.prior, tilts[0], xp, weights=weights)
            except NonFiniteLosses:
                if theta is not None:
                    problem.check_finite_theta(theta)
            else:
                if theta is not None and not _reads_extremes(problem):
                    _check_finite_result(problem, out[0], theta)
                return out
        tt = xp.asarray(tilts[0], dtype=ell.dtype, device=device(ell))
        return risk_and_weights(ell, problem.prior, tt, xp)
    if is_numpy_namespace(xp) and problem.finite_tilts:
        # every level at a finite tilt reads its losses' extremes and rejects NaN and
        # infinity there: the check of theta waits for that (no separate pass)
        try:
            return hierarchy_eval(ell, problem.prior, problem.tree, tilts, xp, weights=weights)
        except NonFiniteLosses:
            if theta is not None:
                problem.check_finite_theta(theta)
            raise
    if theta is not None and not is_lazy(xp) and not bool(xp.all(xp.isfinite(ell))):
        problem.check_finite_theta(theta)
    return hierarchy_eval(ell, problem.prior, problem.tree, list(tilts), xp, weights=weights)


def _reads_extremes(problem: Any) -> bool:
    """Whether the problem's tilted reduction reads the extremes of its losses, and so
    rejects non-finite losses by itself: a hierarchy, or a finite non-zero sample tilt
    (not the mean at ``t = 0``, nor the maximum or minimum at ``t = +-inf``)."""
    t = problem.tilts[0]
    return problem.tree is not None or (t != 0 and math.isfinite(t))


def _on_cpu(x: Any) -> bool:
    """Whether the array ``x`` lives in host memory (NumPy, array-api-strict, PyTorch on
    the CPU), where reading a 0-d result costs no device synchronisation."""
    dev = device(x)
    return "cpu" in str(getattr(dev, "type", dev)).lower()


def _check_finite_result(problem: Any, value: Any, theta: Any) -> None:
    """Raise the ``ValueError`` naming ``theta`` when ``value`` (a 0-d array, read on the
    host) is not finite because ``theta`` is not; nothing on lazy backends, nor on a
    device, whose evaluations keep their budget of host reads (a NaN ``theta`` gives a
    NaN result there)."""
    if is_lazy(problem.xp) or not _on_cpu(value):
        return
    v = float(value)
    if not math.isfinite(v):
        problem.check_finite_theta(theta)


def penalty(problem: Any, th: Any) -> Any:
    """The ridge term ``l2/2 ||theta||^2``."""
    return 0.5 * problem.l2 * problem.xp.sum(th * th)


def _level_means(problem: Any, wa: Any, w: Any) -> list[Any]:
    """Per-sample w-weighted means of ``a`` over each level's nodes (s_1 .. s_L)."""
    xp = problem.xp
    out = []
    if problem.tree is not None:
        for lay in problem.tree.sample_layouts:
            num = segment_sum(wa, lay, xp)
            den = segment_sum(w, lay, xp)
            safe = xp.where(den > 0, den, xp.ones_like(den))
            mean = xp.where(den > 0, num / safe, xp.zeros_like(num))
            out.append(broadcast_groups(mean, lay, xp))
    out.append(xp.sum(wa) + xp.zeros_like(wa))  # the root: g . v
    return out


def tilt_term_coef(problem: Any, a: Any, w: Any) -> Any:
    """Per-sample coefficient c with  tilt part of H v = sum_i c_i grad f_i."""
    xp = problem.xp
    means = [a] + _level_means(problem, w * a, w)
    tilts = problem.tilts[::-1]  # innermost (samples) first
    coef = xp.zeros_like(a)
    for k, tk in enumerate(tilts):
        if tk == 0:
            continue
        if not math.isfinite(tk):
            raise ValueError("the Hessian is not defined at an infinite tilt")
        coef = coef + tk * (means[k] - means[k + 1])
    return w * coef


def _node_outer(wd1X: Any, w: Any, layout: Any, xp: Any) -> Any:
    """sum over nodes of W_n G_n G_n^T with G_n = sum_{x in n} w_x d1_x x_x / W_n."""
    S = segment_sum(xp.permute_dims(wd1X, (1, 0)), layout, xp)  # (d, G): W_n G_n, one pass
    W = segment_sum(w, layout, xp)
    safe = xp.where(W > 0, W, xp.ones_like(W))
    return S @ xp.permute_dims(S / safe[None, :], (1, 0))


class GenericEngine(Engine):
    """Plain array-API evaluations: a product with ``X``, the losses, the reduction, a
    product with ``X^T``. Serves every predictor-loss problem on every backend."""

    name = "generic"
    checks_theta = True  # every evaluation goes through ``aggregate``

    def applies(self, problem: Any) -> bool:
        return problem.is_linear

    def losses(self, problem: Any, th: Any, ctx: Context) -> Any:
        """The per-sample losses at ``th`` (one product with ``X``)."""
        z = problem.X @ problem.xp.reshape(th, problem.shape)
        ctx.count(1)
        return problem.loss.value(z, problem.y, validate=False, xp=problem.xp)

    def _parts(self, problem: Any, th: Any, ctx: Context) -> tuple:
        xp = problem.xp
        z = problem.X @ xp.reshape(th, problem.shape)
        ctx.count(1)
        return (z,) + tuple(problem.loss.derivatives(z, problem.y, validate=False, xp=xp))

    def value(self, problem: Any, theta: Any, ctx: Context) -> Any:
        r, _ = aggregate(problem, self.losses(problem, theta, ctx), theta, weights=False)
        return r + penalty(problem, theta) if problem.l2 else r

    def value_and_gradient(self, problem: Any, theta: Any, ctx: Context) -> Any:
        xp = problem.xp
        z = problem.X @ xp.reshape(theta, problem.shape)
        ctx.count(1)
        # the value and first derivative only: the second is not needed here
        ell, d1 = problem.loss.value_and_d1(z, problem.y, validate=False, xp=xp)
        r, w = aggregate(problem, ell, theta)
        coef = w[:, None] * d1 if d1.ndim == 2 else w * d1
        g = problem.X.T @ coef
        ctx.count(1)
        if problem.l2:
            return r + penalty(problem, theta), g + problem.l2 * theta
        return r, g

    def hvp(self, problem: Any, theta: Any, v: Any, ctx: Context) -> Any:
        xp = problem.xp
        X = problem.X
        # one pass over X for both the predictor and the direction
        if len(problem.shape) == 1:
            zu = X @ xp.stack([theta, v], axis=1)
            z, u = zu[:, 0], zu[:, 1]
        else:
            k = problem.shape[1]
            zu = X @ xp.concat([theta, v], axis=1)
            z, u = zu[:, :k], zu[:, k:]
        ctx.count(1)
        ell, d1, d2 = problem.loss.derivatives(z, problem.y, validate=False, xp=xp)
        _, w = aggregate(problem, ell, theta)
        out = X.T @ _product_coefficients(problem, z, u, w, d1, d2)
        ctx.count(1)
        return out + problem.l2 * v if problem.l2 else out

    def hessian(self, problem: Any, theta: Any, ctx: Context) -> Any:
        if len(problem.shape) != 1:
            return None  # columns of Hessian-vector products
        xp = problem.xp
        _, ell, d1, d2 = self._parts(problem, theta, ctx)
        _, w = aggregate(problem, ell, theta)
        X = problem.X
        tilts = problem.tilts[::-1]  # innermost first
        # level 0: samples; sum_i w_i (d2 + t_1 d1^2) x_i x_i^T
        diag = w * d2 + tilts[0] * w * d1 * d1 if tilts[0] else w * d2
        H = X.T @ (diag[:, None] * X)
        ctx.count(1)
        # node gradients per level: G_n = sum_{x in n} w_x d1_x x_x / W_n
        wd1X = (w * d1)[:, None] * X
        layouts = list(problem.tree.sample_layouts) if problem.tree is not None else []
        for k, tk in enumerate(tilts):
            if tk == 0:
                continue
            # + t_k * sum_{nodes of level k-1} W G G^T  - t_k * sum_{nodes of level k} ...
            if k > 0:
                H = H + tk * _node_outer(wd1X, w, layouts[k - 1], xp)
            if k < len(layouts):
                H = H - tk * _node_outer(wd1X, w, layouts[k], xp)
            else:
                g = xp.sum(wd1X, axis=0)
                H = H - tk * (g[:, None] * g[None, :])
        if problem.l2:
            H = H + problem.l2 * xp.eye(H.shape[0], dtype=H.dtype, device=device(H))
        return H

    def minibatch(self, problem: Any, theta: Any, idx: Any, ctx: Context) -> tuple:
        """Losses of the rows ``idx`` and ``c -> sum_i c_i grad f_i`` over them (the ridge
        term apart); passes are counted in proportion to the batch."""
        xp = problem.xp
        XB = xp.take(problem.X, idx, axis=0)
        yB = xp.take(problem.y, idx, axis=0)
        z = XB @ xp.reshape(theta, problem.shape)
        ell, d1, _ = problem.loss.derivatives(z, yB, validate=False, xp=xp)
        frac = idx.shape[0] / problem.n_samples

        def vjp(c: Any) -> Any:
            ctx.count(frac)
            coef = c[:, None] * d1 if d1.ndim == 2 else c * d1
            return xp.reshape(XB.T @ coef, theta.shape)

        ctx.count(frac)
        return ell, vjp

    def linearize(self, problem: Any, theta: Any, ctx: Context) -> Linearization:
        z, ell, d1, d2 = self._parts(problem, theta, ctx)
        r, w = aggregate(problem, ell, theta)
        coef = w[:, None] * d1 if d1.ndim == 2 else w * d1
        g = problem.X.T @ coef
        ctx.count(1)
        hvp = _LinearProducts(problem, z, w, d1, d2, ctx)
        if problem.l2:
            r, g = r + penalty(problem, theta), g + problem.l2 * theta
        return Linearization(theta, r, g, ell, w, hvp)


def _product_coefficients(problem: Any, z: Any, u: Any, w: Any, d1: Any, d2: Any) -> Any:
    """Per-sample coefficients ``R`` with ``H v = X^T R`` (ridge term apart)."""
    xp = problem.xp
    if d1.ndim == 2:  # multinomial: per-sample K x K Hessians in z
        hz = problem.loss.hvp_z(z, problem.y, u, validate=False, xp=xp)
        a = xp.sum(d1 * u, axis=1)
        c = tilt_term_coef(problem, a, w)
        return w[:, None] * hz + c[:, None] * d1
    a = d1 * u
    c = tilt_term_coef(problem, a, w)
    return w * d2 * u + c * d1


class _LinearProducts:
    """Hessian-vector products at a fixed point from its stored predictor, weights and
    derivatives: a product with ``X`` and one with ``X^T``, no loss or weight again."""

    def __init__(self, problem: Any, z: Any, w: Any, d1: Any, d2: Any, ctx: Context):
        self.problem, self.z, self.w, self.d1, self.d2, self.ctx = problem, z, w, d1, d2, ctx

    def __call__(self, v: Any) -> Any:
        p = self.problem
        u = p.X @ v
        self.ctx.count(1)
        out = p.X.T @ _product_coefficients(p, self.z, u, self.w, self.d1, self.d2)
        self.ctx.count(1)
        return out + p.l2 * v if p.l2 else out


#: The generic array-API engine, one instance shared by every objective.
GENERIC = GenericEngine()
