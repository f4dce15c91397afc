"""The table of the tilted state's steps (``tiltlab/accumulator/state_table.py``): its
reference (Python floats and 50-digit mpmath) and its numba functions, driven through
folds, shift moves, merges and the finish of random losses split into blocks, against the
independent 50-digit risk of ``tests/_contract.py``. (Its C functions are checked through
the CUDA header in ``tests/test_cuda_scalar.py`` and the emulated kernels; that every
generated file is the table's is ``tests/test_loss_table.py``'s check.)"""

from __future__ import annotations

import math
from functools import partial
from types import SimpleNamespace

import mpmath
import numpy as np
import pytest
from _contract import DPS, reference_tilted

from tiltlab.accumulator import _state_formulas as ref
from tiltlab.accumulator.state_table import STATE_TABLE
from tiltlab.losses import _generate as gen

STEPS = ("weight", "fold", "move", "factor", "merge", "finish")
TILTS = [0.0, 1e-300, 1e-8, -1e-3, 0.05, 0.7, -3.0, 40.0, -500.0, math.inf, -math.inf]


def _reference_steps(m):
    return SimpleNamespace(**{k: partial(getattr(ref, k), m=m) for k in STEPS})


def _numba_steps():
    pytest.importorskip("numba")
    from tiltlab._cpu_kernels import _state_steps

    return SimpleNamespace(**{k: getattr(_state_steps, f"state_{k}") for k in STEPS})


def _fold_block(steps, num, block, t):
    """The state of one block, a loss at a time: the shift moved when a loss passes it."""
    st = None
    for loss, p in block:
        if not p > 0:
            continue
        l, p = num(loss), num(p)
        if st is None:
            z = num(0)
            st = dict(c=l, hi=l, lo=l, mass=z, s=z, q=z, lsum=z, keep=True)
        st["hi"], st["lo"] = max(st["hi"], l), min(st["lo"], l)
        to = st["hi"] if t > 0 else st["lo"]
        if to != st["c"]:
            _, st["s"], st["q"], st["lsum"] = steps.move(
                t, st["c"], to, st["mass"], st["s"], st["q"], st["lsum"]
            )
            st["c"] = to
        small = abs(t) * (st["hi"] - st["lo"]) <= 1
        st["keep"] = st["keep"] and small
        e, e1 = steps.weight(t, l, st["c"], small)
        fields = (st["mass"], st["s"], st["q"], st["lsum"])
        st["mass"], st["s"], st["q"], st["lsum"] = steps.fold(p, l, st["c"], e, e1, *fields)
    return st


def _merge(steps, a, b, t):
    c = b["c"] if (b["c"] > a["c"] if t > 0 else b["c"] < a["c"]) else a["c"]
    moved = []
    for st in (a, b):
        fields = (st["mass"], st["s"], st["q"], st["lsum"])
        if st["c"] != c:
            _, s, q, lsum = steps.move(t, st["c"], c, *fields)
            fields = (st["mass"], s, q, lsum)
        moved.append(fields)
    mass, s, q, lsum = steps.merge(*moved[0], *moved[1])
    hi, lo = max(a["hi"], b["hi"]), min(a["lo"], b["lo"])
    keep = a["keep"] and b["keep"] and abs(t) * (hi - lo) <= 1
    return dict(c=c, hi=hi, lo=lo, mass=mass, s=s, q=q, lsum=lsum, keep=keep)


def _risk(steps, num, blocks, t):
    states = [st for st in (_fold_block(steps, num, b, t) for b in blocks) if st is not None]
    while len(states) > 1:  # a tree of merges
        states = [
            _merge(steps, *states[i : i + 2], t) if i + 1 < len(states) else states[i]
            for i in range(0, len(states), 2)
        ]
    st = states[0]
    extreme = math.isinf(t)
    flat = t == 0
    small = st["keep"] and not extreme
    fields = (st["c"], st["hi"], st["lo"], st["mass"], st["s"], st["q"], st["lsum"])
    return steps.finish(num(t) if not extreme else t, *fields, extreme, flat, small)


def _problem(seed, spread):
    rng = np.random.default_rng(seed)
    n = 37
    losses = (rng.standard_normal(n) * spread + 3.0).tolist()
    prior = (rng.uniform(0.1, 2.0, n) * (rng.uniform(size=n) > 0.25)).tolist()
    prior[0] = 1.0
    sizes = [5, 1, 12, 0, 19]
    blocks, i = [], 0
    for k in sizes:
        blocks.append(list(zip(losses[i : i + k], prior[i : i + k], strict=True)))
        i += k
    return losses, prior, blocks


@pytest.mark.parametrize("t", TILTS)
@pytest.mark.parametrize("spread", [1e-6, 1.0, 30.0])
def test_the_mpmath_reference_is_the_50_digit_risk(t, spread):
    losses, prior, blocks = _problem(1, spread)
    want, _ = reference_tilted(losses, t, prior)
    with mpmath.workdps(DPS):
        got = _risk(_reference_steps(mpmath), mpmath.mpf, blocks, t)
        assert mpmath.almosteq(got, want, rel_eps=mpmath.mpf(10) ** -40, abs_eps=0)


@pytest.mark.parametrize("t", TILTS)
@pytest.mark.parametrize("spread", [1e-6, 1.0, 30.0])
@pytest.mark.parametrize("dialect", ["math", "numba"])
def test_the_float_dialects_are_the_50_digit_risk(t, spread, dialect):
    losses, prior, blocks = _problem(2, spread)
    want, _ = reference_tilted(losses, t, prior)
    steps = _reference_steps(math) if dialect == "math" else _numba_steps()
    got = _risk(steps, float, blocks, t)
    # a few roundings per loss and merge, relative to the largest loss (the risk is a
    # weighted mean of the losses: its condition number is at most max|l| / |risk|)
    scale = max(abs(v) for v in losses)
    assert abs(got - float(want)) <= 64 * len(losses) * 2.0**-53 * scale


def test_the_near_form_keeps_the_digits_the_log_form_loses():
    # near t = 0 the log1p of q keeps full precision where log(s) / t amplifies the
    # rounding of s by 1 / |t|: the table's finish takes q while the spread is small
    losses, prior, blocks = _problem(3, 1.0)
    t = 1e-12
    want = float(reference_tilted(losses, t, prior)[0])
    steps = _reference_steps(math)
    near = _risk(steps, float, blocks, t)
    st = _fold_block(steps, float, [(v, p) for b in blocks for v, p in b], t)
    fields = (st["c"], st["hi"], st["lo"], st["mass"], st["s"], st["q"], st["lsum"])
    far = steps.finish(t, *fields, False, False, False)
    assert abs(near - want) <= 1e-13 * abs(want)
    assert abs(far - want) > 1e-6 * abs(want)


def test_the_shift_move_is_exact_in_50_digits():
    # move(c -> to) then the finish equals the state folded at the new shift directly
    with mpmath.workdps(DPS):
        m = _reference_steps(mpmath)
        t, c, to, mass = mpmath.mpf("0.3"), mpmath.mpf(2), mpmath.mpf(5), mpmath.mpf(3)
        s, q, lsum = mpmath.mpf("2.5"), mpmath.mpf("-0.5"), mpmath.mpf("-1.25")
        r, s2, q2, lsum2 = m.move(t, c, to, mass, s, q, lsum)
        assert mpmath.almosteq(r, mpmath.exp(t * (c - to)), 1e-45)
        assert mpmath.almosteq(s2, s * mpmath.exp(t * (c - to)), 1e-45)
        # q = s - mass at every shift
        assert mpmath.almosteq(q, s - mass, 1e-45) and mpmath.almosteq(q2, s2 - mass, 1e-45)
        assert mpmath.almosteq(lsum2, lsum + mass * (c - to), 1e-45)


def test_every_step_has_every_dialect():
    numba_text = gen.numba_state_module()
    c_text = gen.c_state_functions()
    for f in STATE_TABLE:
        assert callable(getattr(ref, f.name))
        assert f"def state_{f.name}(" in numba_text
        assert f" tl_state_{f.name}(tl_real " in c_text
    for name in gen.TYPED_STEPS:
        assert f"def state_{name}_t(" in numba_text


@pytest.mark.parametrize("text", ["sqrt(q)", "q ** 2", "where(a < b < c, q, s)", "True"])
def test_the_state_vocabulary_is_enforced(text):
    with pytest.raises(ValueError, match="vocabulary"):
        gen.parse(text, gen.STATE_FUNCTIONS)
