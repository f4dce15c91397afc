"""The strong Wolfe line search on the test functions of Moré and Thuente (1994)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import line_search

from tiltlab.solvers._linesearch import strong_wolfe


def _f1(a, b=2.0):
    return -a / (a * a + b), (a * a - b) / (a * a + b) ** 2


def _f2(a, b=0.004):
    return (a + b) ** 5 - 2 * (a + b) ** 4, 5 * (a + b) ** 4 - 8 * (a + b) ** 3


def _f3(a, ell=39, b=0.01):
    w = ell * math.pi / 2
    base, dbase = 2 * (1 - b) / (ell * math.pi) * math.sin(w * a), (1 - b) * math.cos(w * a)
    if a <= 1 - b:
        return base + 1 - a, dbase - 1
    if a >= 1 + b:
        return base + a - 1, dbase + 1
    return base + (a - 1) ** 2 / (2 * b) + b / 2, dbase + (a - 1) / b


def _yanai(b1, b2):
    def g(b):
        return math.sqrt(1 + b * b) - b

    def f(a):
        r1, r2 = math.sqrt((1 - a) ** 2 + b2 * b2), math.sqrt(a * a + b1 * b1)
        return g(b1) * r1 + g(b2) * r2, g(b1) * (a - 1) / r1 + g(b2) * a / r2

    return f


# (function, ftol, gtol) as in the paper's tables 1-6
FUNCS = {
    "f1": (_f1, 1e-3, 0.1),
    "f2": (_f2, 0.1, 0.1),
    "f3": (_f3, 0.1, 0.1),
    "f4": (_yanai(0.001, 0.001), 1e-3, 1e-3),
    "f5": (_yanai(0.01, 0.001), 1e-3, 1e-3),
    "f6": (_yanai(0.001, 0.01), 1e-3, 1e-3),
}
STARTS = [1e-3, 1e-1, 1e1, 1e3]

# the paper's tables 1-3: final step (to the digits printed) and number of evaluations
PAPER = {
    "f1": [(1.4, 6), (1.4, 3), (10.0, 1), (37.0, 4)],
    "f2": [(1.6, 12), (1.6, 8), (1.6, 8), (1.6, 11)],
    "f3": [(1.0, 12), (1.0, 12), (1.0, 10), (1.0, 13)],
}


def _wolfe(fn, a, ftol, gtol):
    f0, d0 = fn(0.0)
    f, d = fn(a)
    return f <= f0 + ftol * a * d0 and abs(d) <= gtol * abs(d0)


@pytest.mark.parametrize("name", list(FUNCS))
@pytest.mark.parametrize("a0", STARTS)
def test_strong_wolfe_conditions_hold(name, a0):
    fn, ftol, gtol = FUNCS[name]
    f0, d0 = fn(0.0)
    res = strong_wolfe(fn, f0, d0, a0, ftol=ftol, gtol=gtol, max_evals=50)
    assert res.converged, res
    assert _wolfe(fn, res.step, ftol, gtol)
    assert (res.value, res.slope) == fn(res.step)
    assert res.n_evals <= 13


@pytest.mark.parametrize("name", list(PAPER))
def test_paper_tables(name):
    fn, ftol, gtol = FUNCS[name]
    f0, d0 = fn(0.0)
    for a0, (step, evals) in zip(STARTS, PAPER[name], strict=True):
        res = strong_wolfe(fn, f0, d0, a0, ftol=ftol, gtol=gtol, max_evals=50)
        assert round(res.step, 0 if step >= 10 else 1) == step
        assert res.n_evals == evals


@pytest.mark.parametrize("name", list(FUNCS))
@pytest.mark.parametrize("a0", STARTS)
def test_same_steps_as_scipy_minpack_search(name, a0):
    # SciPy's port of MINPACK-2's dcsrch (private module): the same algorithm
    try:
        from scipy.optimize._dcsrch import DCSRCH
    except ImportError:  # pragma: no cover - a SciPy without it
        pytest.skip("scipy.optimize._dcsrch not available")
    fn, ftol, gtol = FUNCS[name]
    f0, d0 = fn(0.0)
    calls = []

    def phi(a):
        calls.append(a)
        return fn(a)[0]

    search = DCSRCH(phi, lambda a: fn(a)[1], ftol, gtol, 1e-14, 0.0, 1e10)
    stp, *_ = search(a0, f0, d0, maxiter=100)
    res = strong_wolfe(fn, f0, d0, a0, ftol=ftol, gtol=gtol, max_evals=100)
    assert res.step == pytest.approx(stp, rel=1e-12)
    assert res.n_evals == len(calls)


@pytest.mark.parametrize("name", list(FUNCS))
def test_against_scipy_line_search(name):
    # SciPy's public line_search (a different strong Wolfe algorithm, Nocedal and
    # Wright's zoom): both satisfy the conditions; ours needs no more evaluations
    # than it plus two on these functions (with the quasi-Newton constants: SciPy's
    # line_search requires ftol < gtol)
    fn = FUNCS[name][0]
    ftol, gtol = 1e-4, 0.9
    f0, d0 = fn(0.0)
    n = [0]

    def f(x):
        n[0] += 1
        return fn(float(x[0]))[0]

    def fprime(x):
        return np.array([fn(float(x[0]))[1]])

    out = line_search(f, fprime, np.zeros(1), np.ones(1), c1=ftol, c2=gtol, maxiter=100)
    assert out[0] is not None and _wolfe(fn, out[0], ftol, gtol)
    res = strong_wolfe(fn, f0, d0, 1.0, ftol=ftol, gtol=gtol, max_evals=100)
    assert res.converged and _wolfe(fn, res.step, ftol, gtol)
    assert res.n_evals <= n[0] + 2


def test_nonfinite_trials_shrink_the_step():
    # phi is finite only below a = 2; a first trial of 10 must come back into range
    def fn(a):
        if a >= 2.0:
            return math.inf, math.nan
        return (a - 1.0) ** 2, 2.0 * (a - 1.0)

    res = strong_wolfe(fn, 1.0, -2.0, 10.0)
    assert res.converged and 0 < res.step < 2.0
    assert _wolfe(fn, res.step, 1e-4, 0.9)


def test_accept_hook_and_errors():
    res = strong_wolfe(_f1, *_f1(0.0), 1e-3, ftol=1e-3, gtol=0.1, accept=lambda f, d, a: True)
    assert res.converged and res.n_evals == 1 and res.reason == "accepted"
    with pytest.raises(ValueError, match="`d0`"):
        strong_wolfe(_f1, 0.0, 1.0)
    flat = strong_wolfe(lambda a: (-a, -1.0), 0.0, -1.0, 1.0, stpmax=4.0, max_evals=10)
    assert not flat.converged and flat.reason == "stpmax" and flat.step == 4.0
