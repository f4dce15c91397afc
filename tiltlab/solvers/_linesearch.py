"""A line search for the strong Wolfe conditions with safeguarded cubic interpolation.

This is the algorithm of Moré and Thuente ("Line search algorithms with guaranteed
sufficient decrease", ACM TOMS 20, 1994), the one behind MINPACK-2's ``dcsrch`` and
SciPy's ``scalar_search_wolfe1``. A trial step ``stp`` is accepted when

* ``phi(stp) <= phi(0) + ftol * stp * phi'(0)`` (sufficient decrease), and
* ``|phi'(stp)| <= gtol * |phi'(0)|`` (strong curvature condition).

Otherwise the next trial comes from a cubic or quadratic model through the best point
so far (``stx``) and the trial (:func:`_next_step`), kept inside a shrinking interval of
uncertainty ``[stmin, stmax]`` that, once a minimiser is bracketed, halves at least every
two trials. While no point has met the sufficient-decrease test but one has a
non-negative slope, the search works on the modified function
``psi(a) = phi(a) - phi(0) - ftol * a * phi'(0)`` (the paper's first stage).

The search is written on host floats: the caller's ``phi`` returns ``(value, slope)``
and keeps whatever arrays it needs, so that an array-API solver makes one
device-to-host transfer per trial.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

__all__ = ["LineSearchResult", "strong_wolfe"]

_XTRAPL, _XTRAPU = 1.1, 4.0  # extrapolation bounds before a minimiser is bracketed


class LineSearchResult(NamedTuple):
    """Outcome of :func:`strong_wolfe` (an immutable named tuple: cheap to build once
    per iteration).

    ``step`` is the last step evaluated and ``value``/``slope`` its ``phi`` and
    ``phi'``; ``converged`` says whether it meets both Wolfe conditions. Otherwise
    ``reason`` names the test that stopped the search (``"rounding"``: the interval of
    uncertainty shrank to rounding level; ``"xtol"``; ``"stpmax"``/``"stpmin"``: the
    step hit a bound; ``"maxiter"``; ``"nonfinite"``).
    """

    step: float
    value: float
    slope: float
    n_evals: int
    converged: bool
    reason: str = ""


def _cubic_min(a: float, fa: float, da: float, b: float, fb: float, db: float, sign: float):
    """``theta`` and ``gamma`` of the cubic interpolating ``(a, fa, da)``, ``(b, fb, db)``.

    Its minimiser lies a fraction ``p/q`` (built from these by each case) of the way
    between the two points; the square root is scaled by ``s`` against overflow and
    ``sign`` orients it.
    """
    theta = 3.0 * (fa - fb) / (b - a) + da + db
    s = max(abs(theta), abs(da), abs(db))
    disc = (theta / s) ** 2 - (da / s) * (db / s)
    gamma = s * math.sqrt(max(disc, 0.0)) * sign
    return theta, gamma


def _next_step(
    stx: float,
    fx: float,
    dx: float,
    sty: float,
    fy: float,
    dy: float,
    stp: float,
    fp: float,
    dp: float,
    brackt: bool,
    stpmin: float,
    stpmax: float,
):
    """One safeguarded step of the interval update (the paper's four cases).

    Returns ``(stx, fx, dx, sty, fy, dy, stp_next, brackt)``.
    """
    sgnd = dp * math.copysign(1.0, dx)
    if fp > fx:
        # case 1: higher value; the minimiser is bracketed. Cubic step, or halfway to the
        # quadratic one when the cubic step is the farther from stx
        theta, gamma = _cubic_min(stx, fx, dx, stp, fp, dp, -1.0 if stp < stx else 1.0)
        p = (gamma - dx) + theta
        q = ((gamma - dx) + gamma) + dp
        stpc = stx + (p / q) * (stp - stx)
        stpq = stx + ((dx / ((fx - fp) / (stp - stx) + dx)) / 2.0) * (stp - stx)
        stpf = stpc if abs(stpc - stx) < abs(stpq - stx) else stpc + (stpq - stpc) / 2.0
        brackt = True
    elif sgnd < 0:
        # case 2: lower value, slopes of opposite sign; bracketed. The step (cubic or
        # secant) farther from stp
        theta, gamma = _cubic_min(stx, fx, dx, stp, fp, dp, -1.0 if stp > stx else 1.0)
        p = (gamma - dp) + theta
        q = ((gamma - dp) + gamma) + dx
        stpc = stp + (p / q) * (stx - stp)
        stpq = stp + (dp / (dp - dx)) * (stx - stp)
        stpf = stpc if abs(stpc - stp) > abs(stpq - stp) else stpq
        brackt = True
    elif abs(dp) < abs(dx):
        # case 3: lower value, same sign, the slope decreases in magnitude. The cubic
        # step only when it lies beyond stp (the cubic tends to infinity that way)
        theta, gamma = _cubic_min(stx, fx, dx, stp, fp, dp, -1.0 if stp > stx else 1.0)
        p = (gamma - dp) + theta
        q = (gamma + (dx - dp)) + gamma
        r = p / q
        if r < 0 and gamma != 0:
            stpc = stp + r * (stx - stp)
        else:
            stpc = stpmax if stp > stx else stpmin
        stpq = stp + (dp / (dp - dx)) * (stx - stp)
        if brackt:
            stpf = stpc if abs(stpc - stp) < abs(stpq - stp) else stpq
            bound = stp + 0.66 * (sty - stp)
            stpf = min(bound, stpf) if stp > stx else max(bound, stpf)
        else:
            stpf = stpc if abs(stpc - stp) > abs(stpq - stp) else stpq
            stpf = max(stpmin, min(stpmax, stpf))
    else:
        # case 4: lower value, same sign, the slope does not decrease: cubic through
        # stp and sty when bracketed, else the bound in the direction of descent
        if brackt:
            theta, gamma = _cubic_min(sty, fy, dy, stp, fp, dp, -1.0 if stp > sty else 1.0)
            p = (gamma - dp) + theta
            q = ((gamma - dp) + gamma) + dy
            stpf = stp + (p / q) * (sty - stp)
        else:
            stpf = stpmax if stp > stx else stpmin
    # the new interval: stx keeps the lowest value seen, [stx, sty] brackets when brackt
    if fp > fx:
        sty, fy, dy = stp, fp, dp
    else:
        if sgnd < 0:
            sty, fy, dy = stx, fx, dx
        stx, fx, dx = stp, fp, dp
    return stx, fx, dx, sty, fy, dy, stpf, brackt


def strong_wolfe(
    phi: Callable[[float], tuple[float, float]],
    f0: float,
    d0: float,
    step: float = 1.0,
    *,
    ftol: float = 1e-4,
    gtol: float = 0.9,
    xtol: float = 1e-14,
    stpmin: float = 0.0,
    stpmax: float = 1e10,
    max_evals: int = 30,
    accept: Callable[[float, float, float], bool] | None = None,
) -> LineSearchResult:
    """Find a step meeting the strong Wolfe conditions along a descent direction.

    Parameters
    ----------
    phi : callable
        ``phi(a) -> (value, slope)``: the objective and its directional derivative at
        step ``a``.
    f0, d0 : float
        ``phi(0)`` and ``phi'(0)`` (``d0 < 0``).
    step : float, default 1.0
        First trial step.
    ftol, gtol : float
        Sufficient-decrease and curvature constants, ``0 < ftol < gtol < 1`` for a
        guaranteed result (SciPy's L-BFGS-B uses ``1e-3`` and ``0.9``).
    xtol : float, default 1e-14
        Relative width of the interval of uncertainty at which the search stops.
    stpmin, stpmax : float
        Bounds on the step.
    max_evals : int, default 30
    accept : callable, optional
        ``accept(value, slope, step) -> bool``: an extra acceptance test tried on a trial
        that fails the Wolfe tests (e.g. the approximate Wolfe test near a minimiser,
        where the decrease is below the rounding error of the values).

    Returns
    -------
    LineSearchResult

    Examples
    --------
    >>> from tiltlab.solvers._linesearch import strong_wolfe
    >>> res = strong_wolfe(lambda a: ((a - 2.0) ** 2, 2.0 * (a - 2.0)), 4.0, -4.0)
    >>> res.converged, 0.0 < res.step
    (True, True)
    """
    if not d0 < 0:
        raise ValueError(f"`d0` must be negative (a descent direction), got {d0!r}")
    f0, d0, step = float(f0), float(d0), float(step)  # host floats, never array scalars
    stp = min(max(step, stpmin), stpmax)
    gtest = ftol * d0
    width = stpmax - stpmin
    width1 = 2.0 * width
    brackt = False
    stage1 = True
    stx, fx, dx = 0.0, f0, d0
    sty, fy, dy = 0.0, f0, d0
    stmin, stmax = 0.0, stp + _XTRAPU * stp
    f, g = f0, d0
    for k in range(1, max_evals + 1):
        f, g = phi(stp)
        if not (math.isfinite(f) and math.isfinite(g)):
            if k == max_evals:
                return LineSearchResult(stp, f, g, k, False, "nonfinite")
            # no model through a non-finite value: the step becomes an upper bound, and
            # the next trial lies halfway back to the best point
            stpmax = stp
            stp = stx + 0.5 * (stp - stx)
            stmax = min(stmax, stpmax)
            continue
        ftest = f0 + stp * gtest
        if stage1 and f <= ftest and g >= 0:
            stage1 = False
        if f <= ftest and abs(g) <= gtol * -d0:
            return LineSearchResult(stp, f, g, k, True)
        if accept is not None and accept(f, g, stp):
            return LineSearchResult(stp, f, g, k, True, "accepted")
        if brackt and (stp <= stmin or stp >= stmax):
            return LineSearchResult(stp, f, g, k, False, "rounding")
        if brackt and stmax - stmin <= xtol * stmax:
            return LineSearchResult(stp, f, g, k, False, "xtol")
        if stp == stpmax and f <= ftest and g <= gtest:
            return LineSearchResult(stp, f, g, k, False, "stpmax")
        if stp == stpmin and (f > ftest or g >= gtest):
            return LineSearchResult(stp, f, g, k, False, "stpmin")
        if k == max_evals:
            break
        if stage1 and f <= fx and f > ftest:
            # first stage: interpolate the modified function psi, whose values at the
            # trial points are those of phi minus the sufficient-decrease line
            stx, fxm, dxm, sty, fym, dym, stp, brackt = _next_step(
                stx, fx - stx * gtest, dx - gtest, sty, fy - sty * gtest, dy - gtest,
                stp, f - stp * gtest, g - gtest, brackt, stmin, stmax,
            )  # fmt: skip
            fx, dx = fxm + stx * gtest, dxm + gtest
            fy, dy = fym + sty * gtest, dym + gtest
        else:
            stx, fx, dx, sty, fy, dy, stp, brackt = _next_step(
                stx, fx, dx, sty, fy, dy, stp, f, g, brackt, stmin, stmax
            )
        if brackt:
            # force a sufficient shrink of the interval: bisect when two steps did not
            # reduce it by a third
            if abs(sty - stx) >= 0.66 * width1:
                stp = stx + 0.5 * (sty - stx)
            width1 = width
            width = abs(sty - stx)
            stmin, stmax = min(stx, sty), max(stx, sty)
        else:
            stmin = stp + _XTRAPL * (stp - stx)
            stmax = stp + _XTRAPU * (stp - stx)
        stp = min(max(stp, stpmin), stpmax)
        if brackt and (stp <= stmin or stp >= stmax or stmax - stmin <= xtol * stmax):
            stp = stx  # no progress possible: the best point so far is the last trial
    return LineSearchResult(stp, f, g, max_evals, False, "maxiter")
