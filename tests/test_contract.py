"""Every engine against the executable contract, point by point (harness: ``_contract.py``).

* losses: each registered loss is, per engine, either in the engine's declared table and
  equal to the 50-digit point contract (:mod:`tiltlab.losses.pointwise`) within a
  dtype-derived tolerance at every point (kinks, large predictors, underflow), or refused;
* the objective: each engine's value, gradient and Hessian-vector product, with and
  without a prior, at tilts 0, 1e-12, +-finite, +inf and on a two-level tree, equal to
  the 50-digit recursion over the tilt tree (``reference_objective``) within the
  rounding of the terms they sum, or the problem declined;
* the tilted state: each engine's per-block states, merged its own way, finish to the
  tilted risk (and weights) of all the losses together, for empty blocks, all-equal
  losses, t = 0, +-inf, 1e-300, 1e-12, 1e8 and spreads up to 1e6.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from _contract import (
    CASES,
    OBJECTIVE_D,
    OBJECTIVE_ENGINES,
    OBJECTIVE_N,
    OBJECTIVE_TILTS,
    PARAMS,
    POINT_ENGINES,
    STATE_ENGINES,
    TILTS,
    ObjectiveEngine,
    PointEngine,
    array_api_objective,
    array_api_point,
    available,
    blocks_of,
    objective_errors,
    objective_problem,
    point_errors,
    points,
    reference_objective,
    reference_points,
    reference_state,
    splits,
    state_tolerance,
    term_scales,
    weight_errors,
)
from _matrix import BACKENDS, FULL_MATRIX, covering

from tiltlab.losses import LOSS_NAMES
from tiltlab.losses.pointwise import POINT_LOSSES

DTYPES = [np.float64, np.float32]
LOSS_CASES = [(name, p) for name in LOSS_NAMES for p in PARAMS.get(name, [{}])]


def _ids(case):
    name, params = case
    return name + "".join(f"-{k}={v}" for k, v in params.items())


_REFS: dict = {}


def _reference(name, params, dtype):
    key = (name, tuple(sorted(params.items())), np.dtype(dtype).name)
    if key not in _REFS:
        z, y = points(name, dtype, params)
        _REFS[key] = (z, y, reference_points(name, z, y, params))
    return _REFS[key]


def check_point_engine(engine: PointEngine, name: str, params: dict, dtype) -> None:
    """The engine serves the loss ``name`` as the contract says, or refuses it."""
    z, y, (rv, r1, r2) = _reference(name, params, dtype)
    if name not in engine.supported():
        with pytest.raises(NotImplementedError):
            engine.point(name, z, y, dtype, params)
        return
    v, d1, d2 = engine.point(name, z, y, dtype, params)
    assert np.shape(v) == (z.shape[0],) and np.shape(d1) == z.shape
    sv, s1 = term_scales(name, z, y)
    bad = {
        "value": point_errors(v, rv, dtype, scales=sv),
        "d1": point_errors(d1, r1, dtype, scales=s1),
    }
    if d2 is not None:
        # the multinomial Hessian is formed as a product (diag(s) - s s^T): its diagonal
        # s (1 - s) cancels when one class dominates, an error of eps against 1
        bad["d2"] = point_errors(d2, r2, dtype, absolute=POINT_LOSSES[name].vector)
    bad = {k: b[:5] for k, b in bad.items() if b}
    assert not bad, f"{name} {params} {np.dtype(dtype).name}: (index, got, want) {bad}"


# ---------------------------------------------------------------------------------------
# the losses


def test_every_registered_loss_has_a_point_contract():
    assert set(POINT_LOSSES) == set(LOSS_NAMES)


@pytest.mark.parametrize("engine_name", list(POINT_ENGINES))
def test_declared_tables_name_registered_losses(engine_name):
    engine = POINT_ENGINES[engine_name]
    missing = available(engine.needs)
    if missing:
        pytest.skip(f"{engine_name} needs {missing}")
    assert engine.supported() <= set(LOSS_NAMES)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", LOSS_CASES, ids=_ids)
def test_array_api_losses_follow_the_contract(xp, case, dtype):
    check_point_engine(array_api_point(xp), case[0], case[1], dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", LOSS_CASES, ids=_ids)
@pytest.mark.parametrize("engine_name", list(POINT_ENGINES))
def test_engine_losses_follow_the_contract(engine_name, case, dtype):
    engine = POINT_ENGINES[engine_name]
    missing = available(engine.needs)
    if missing:
        pytest.skip(f"{engine_name} needs {missing}")
    check_point_engine(engine, case[0], case[1], dtype)


def test_the_point_check_can_fail():
    """An engine that serves a loss wrongly, or claims a loss it does not refuse, fails."""
    from tiltlab.losses import get_loss

    def off_by_sign(name, z, y, dtype, params):
        v, d1, d2 = get_loss(name, **params).derivatives(z, y)
        return v, -d1, d2

    wrong = PointEngine(needs=(), supported=lambda: frozenset({"logistic"}), point=off_by_sign)
    with pytest.raises(AssertionError, match="d1"):
        check_point_engine(wrong, "logistic", {}, np.float64)

    def serves_anything(name, z, y, dtype, params):
        return get_loss("squared").derivatives(z, np.zeros_like(z))

    silent = PointEngine(needs=(), supported=lambda: frozenset(), point=serves_anything)
    with pytest.raises(pytest.fail.Exception, match="NotImplementedError"):
        check_point_engine(silent, "squared", {}, np.float64)


def test_a_loss_added_to_a_table_without_its_code_is_caught(monkeypatch):
    """A new name in the compiled kernels' table whose kernel branch is missing falls into
    another loss's code: the point check sees it."""
    pytest.importorskip("numba")
    from tiltlab import _cpu_kernels

    # pretend the table maps "squared" to the absolute loss's code (a wrong branch)
    monkeypatch.setitem(_cpu_kernels.LOSS_CODES, "squared", _cpu_kernels.LOSS_CODES["absolute"])
    with pytest.raises(AssertionError, match="squared"):
        check_point_engine(POINT_ENGINES["numba"], "squared", {}, np.float64)


# ---------------------------------------------------------------------------------------
# the tilted state


def _state_id(value):
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, type):
        return np.dtype(value).name
    return str(value)


#: The state grid: engines x splits x cases x tilts x dtypes is 1760 tests, most of which
#: repeat one another (the split only decides how many merges, of which blocks; the dtype
#: the rounding). Kept: every engine at every case and tilt (the regime of the reduction
#: and its extremes, 220 combinations), every case at every tilt in both dtypes, every
#: engine with every split at every case and in both dtypes, and every pair of values of
#: any two parameters; the rest of the product only repeats these (``_matrix.covering``:
#: 220 tests). ``TILTLAB_FULL_MATRIX=1`` runs the full product.
STATE_GRID = covering(
    {
        "engine_name": list(STATE_ENGINES),
        "split": list(splits(12)),
        "case": list(CASES),
        "t": TILTS,
        "dtype": DTYPES,
    },
    full=[
        ("engine_name", "case", "t"),
        ("case", "t", "dtype"),
        ("engine_name", "split", "case"),
        ("engine_name", "split", "dtype"),
    ],
)


def test_the_state_grid_covers_what_it_claims():
    """Every pair of values of two parameters, and every combination of the groups kept
    in full, is in the reduced grid (checked against the product, not the design code);
    the full product with ``full_matrix``."""
    names = ["engine_name", "split", "case", "t", "dtype"]
    values = [list(STATE_ENGINES), list(splits(12)), list(CASES), TILTS, DTYPES]
    groups = [*itertools.combinations(range(5), 2), (0, 2, 3), (2, 3, 4), (0, 1, 2), (0, 1, 4)]
    for g in groups:
        want = set(itertools.product(*(values[i] for i in g)))
        assert {tuple(row[i] for i in g) for row in STATE_GRID} == want, [names[i] for i in g]
    assert len(STATE_GRID) < len(list(itertools.product(*values))) or FULL_MATRIX
    full = covering(dict(zip(names, values, strict=True)), full_matrix=True)
    assert sorted(map(repr, full)) == sorted(map(repr, itertools.product(*values)))


@pytest.mark.parametrize(("engine_name", "split", "case", "t", "dtype"), STATE_GRID, ids=_state_id)
def test_state_engines_follow_the_contract(engine_name, split, case, t, dtype, request):
    engine = STATE_ENGINES[engine_name]
    missing = available(engine.needs)
    if missing:
        pytest.skip(f"{engine_name} needs {missing}")
    losses = CASES[case]
    blocks = blocks_of(losses, splits(len(losses))[split], dtype)
    reason = engine.defect(blocks, t, dtype)
    if reason is not None:
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason))
    try:
        risk, weights = engine.merged(blocks, t, dtype)
    except NotImplementedError as exc:
        pytest.skip(f"{engine_name} refuses this case: {exc}")
    cast = [float(v) for b in blocks for v in b.tolist()]
    ref_risk, ref_w = reference_state(cast, t)
    tol = state_tolerance(blocks, t, dtype)
    assert math.isfinite(risk)
    assert abs(risk - float(ref_risk)) <= tol, (risk, float(ref_risk), tol)
    if weights is not None:
        bad = weight_errors(weights, cast, t, ref_w, dtype)
        assert not bad, f"(index, got, want): {bad[:5]}"


def test_running_estimators_refuse_an_empty_batch():
    """An empty batch is refused by name (the state is left as it was); an empty part of a
    batch is the group-level case below."""
    from tiltlab.minibatch import MinibatchTilt

    tilt = MinibatchTilt(1.0)
    with pytest.raises(ValueError, match="losses"):
        tilt.weights(np.zeros(0))
    assert tilt.step == 0 and tilt.state_dict() == {"step": 0, "estimator": "running"}
    torch = pytest.importorskip("torch")
    from tiltlab.torch import TiltedLoss

    with pytest.raises(ValueError, match="losses"):
        TiltedLoss(t=1.0)(torch.zeros(0))


@pytest.mark.parametrize("t", TILTS, ids=repr)
@pytest.mark.parametrize("case", list(CASES))
def test_running_estimators_at_full_batch_give_tilted_weights(case, t):
    """One batch holding all the data: MinibatchTilt and TiltedLoss give tilted_weights and
    tilted_risk (the same numbers to rounding; the 50-digit check is the harness's)."""
    import tiltlab
    from tiltlab.minibatch import MinibatchTilt

    losses = np.asarray(CASES[case])
    want_w, want_r = tiltlab.tilted_weights(losses, t), tiltlab.tilted_risk(losses, t)
    tol = 64 * np.finfo(np.float64).eps
    tilt = MinibatchTilt(t)
    np.testing.assert_allclose(tilt.weights(losses), want_w, rtol=tol, atol=1e-300)
    assert abs(float(tilt.state_dict()["risk"][0]) - float(want_r)) <= tol * np.abs(losses).max()
    torch = pytest.importorskip("torch")
    from tiltlab.torch import TiltedLoss

    l = torch.tensor(losses, requires_grad=True)
    out = TiltedLoss(t=t).double()(l)
    out.backward()
    np.testing.assert_allclose(l.grad.numpy(), want_w, rtol=tol, atol=1e-300)


@pytest.mark.parametrize("t", [0.0, 1e-12, 2.5, -3.0, 1e8, math.inf])
def test_group_running_state_keeps_an_absent_group(t):
    """A batch without samples of a group is the empty state for that group: its running
    risk stays as it was (bit for bit), the present group's merges as the contract says."""
    from tiltlab.minibatch import MinibatchTilt

    first, g1 = np.array([0.5, 2.0, 3.0, 1.0]), np.array([0, 0, 1, 1])
    second, g2 = np.array([4.0, 0.25]), np.array([0, 0])
    tilt = MinibatchTilt(tilts=(0.0, t), n_groups=2, lam=0.5)
    tilt.weights(first, groups=g1)
    before = np.array(tilt.state_dict()["risk"])
    tilt.weights(second, groups=g2)
    after = np.array(tilt.state_dict()["risk"])
    assert after[1] == before[1]
    if math.isinf(t):
        return  # the running update at +-inf keeps the batch (see the harness's defect)
    # lam = 1/2 and two samples of group 0 in each batch: the merge of two equal masses
    want = float(reference_state([0.5, 2.0, 4.0, 0.25], t)[0])
    assert abs(after[0] - want) <= 64 * np.finfo(np.float64).eps * 4.0


def test_torch_running_state_keeps_float64_losses_in_float64():
    torch = pytest.importorskip("torch")
    from tiltlab.torch import TiltedLoss

    blocks = [np.array([0.1, 0.7, 0.3]), np.array([0.9, 0.2])]
    t = 0.1
    loss_fn = TiltedLoss(t=t, lam=1.0)
    seen = 0
    for b in blocks:
        seen += len(b)
        loss_fn.lam = len(b) / seen
        loss_fn(torch.tensor(b))
    got = float(loss_fn.risk[0])
    want = float(reference_state(np.concatenate(blocks).tolist(), t)[0])
    assert abs(got - want) <= 64 * np.finfo(np.float64).eps


# ---------------------------------------------------------------------------------------
# the objective: value, gradient, Hessian-vector product, prior weights, hierarchies

OBJECTIVE_LOSSES = list(POINT_LOSSES)


def _objective_rows() -> list:
    """(loss, tilts, dtype, prior) rows: every loss in both dtypes, every tilt setting
    with and without a prior in both dtypes (28 rows; the loss's formulas meet the tilt
    only through the weights, which every row checks)."""
    tilts = list(OBJECTIVE_TILTS)
    rows = []
    for k in range(max(2 * len(OBJECTIVE_LOSSES), 4 * len(tilts))):
        rows.append(
            (OBJECTIVE_LOSSES[k % len(OBJECTIVE_LOSSES)], tilts[(k // 4) % len(tilts)],
             DTYPES[k % 2], bool((k // 2) % 2))
        )  # fmt: skip
    return rows


OBJECTIVE_ROWS = _objective_rows()
_OBJ_REFS: dict = {}


def _objective_reference(name, setting, dtype, prior):
    key = (name, setting, np.dtype(dtype).name, prior)
    if key not in _OBJ_REFS:
        pb = objective_problem(name, dtype, prior, OBJECTIVE_TILTS[setting])
        ref = reference_objective(
            name, pb["X"], pb["y"], pb["theta"], list(pb["tilts"]), pb["groups"],
            pb["prior"], pb["l2"], v=pb["v"],
        )  # fmt: skip
        _OBJ_REFS[key] = pb, ref
    return _OBJ_REFS[key]


def check_objective_engine(engine: ObjectiveEngine, name, setting, dtype, prior) -> None:
    """The engine's value, gradient and product equal the reference, in the dtype of the
    data, or the engine declines the problem (skip)."""
    pb, ref = _objective_reference(name, setting, dtype, prior)
    try:
        got = engine.evaluate(name, pb, dtype, {})
    except NotImplementedError as exc:
        pytest.skip(str(exc))
    assert got["dtypes"] == {np.dtype(dtype).name} or all(
        d.endswith(np.dtype(dtype).name) for d in got["dtypes"]
    ), got["dtypes"]
    assert np.shape(got["grad"]) == pb["theta"].shape
    bad = objective_errors(got, ref, dtype, OBJECTIVE_N, OBJECTIVE_D)
    assert not bad, f"{name} {setting} prior={prior} {np.dtype(dtype).name}: {bad}"
    if all(math.isfinite(t) for t in pb["tilts"]) and got.get("hvp") is None:
        assert not engine_has_hvp(engine), "a product was expected"


def engine_has_hvp(engine: ObjectiveEngine) -> bool:
    return engine is not OBJECTIVE_ENGINES.get("fused CUDA (emulated)")


def _obj_id(value):
    return np.dtype(value).name if isinstance(value, type) else str(value)


def _latin(rows: list, j: int, per_setting: int = 1) -> list:
    """Of the rows ``k = 4 a + b`` (tilt setting ``a``, dtype and prior ``b``), those with
    ``b = (a + j + 2 i) mod 4``, ``i < per_setting``: every tilt setting ``per_setting``
    times; over ``j = 0..3`` every (tilt setting, dtype, prior) exactly ``per_setting``
    times."""
    return [r for k, r in enumerate(rows)
            if any(k % 4 == (k // 4 + j + 2 * i) % 4 for i in range(per_setting))]  # fmt: skip


#: the generic engine: every row on NumPy; on each other backend every tilt setting once,
#: in a Latin square over the dtypes and priors (each combination on some backend; the
#: losses themselves are checked on every backend point by point above)
OBJECTIVE_XP_ROWS = [("numpy", *r) for r in OBJECTIVE_ROWS] + [
    (b, *r) for j, b in enumerate(BACKENDS[1:]) for r in _latin(OBJECTIVE_ROWS, j)
]


@pytest.mark.parametrize(
    ("xp", "name", "setting", "dtype", "prior"), OBJECTIVE_XP_ROWS, ids=_obj_id, indirect=["xp"]
)
def test_array_api_objective_follows_the_contract(xp, name, setting, dtype, prior):
    check_objective_engine(array_api_objective(xp), name, setting, dtype, prior)


#: the rows of the emulated CUDA kernels in the push tier (a host C++ build per loss,
#: dtype and width: these two are those ``test_cuda_emulated.py`` builds in that tier)
CUDA_PUSH = {("logistic", np.float64), ("squared", np.float32)}


def _engine_rows():
    """Every engine at every row (Dask's at half of them); the emulated CUDA kernels at one
    row of each (loss, dtype) of ``CUDA_PUSH`` in the push tier, at every row they serve in
    the full tier."""
    out = []
    served = set()
    for engine_name in OBJECTIVE_ENGINES:
        # Dask: a graph per call; every tilt setting in two of its dtype-prior cases
        rows = _latin(OBJECTIVE_ROWS, 0, 2) if engine_name == "dask" else OBJECTIVE_ROWS
        for row in rows:
            marks = ()
            if engine_name == "fused CUDA (emulated)":
                tilts = OBJECTIVE_TILTS[row[1]]
                flat = len(tilts) == 1 and math.isfinite(tilts[0])
                if not flat or row[3]:
                    continue  # declined: a prior, a tree or t = +-inf
                push = (row[0], row[2]) in CUDA_PUSH and (row[0], row[2]) not in served
                served.add((row[0], row[2]))
                marks = () if push else (pytest.mark.slow,)
            out.append(pytest.param(engine_name, *row, marks=marks))
    return out


@pytest.mark.parametrize(("engine_name", "name", "setting", "dtype", "prior"), _engine_rows(),
                         ids=_obj_id)  # fmt: skip
def test_objective_engines_follow_the_contract(engine_name, name, setting, dtype, prior):
    engine = OBJECTIVE_ENGINES[engine_name]
    missing = available(engine.needs)
    if missing:
        pytest.skip(f"{engine_name} needs {missing}")
    check_objective_engine(engine, name, setting, dtype, prior)


def test_the_objective_rows_cover_every_loss_tilt_prior_and_dtype():
    others = [r[1:] for r in OBJECTIVE_XP_ROWS if r[0] != "numpy"]
    assert sorted(others) == sorted(OBJECTIVE_ROWS) and len(set(others)) == len(others)
    for b in BACKENDS[1:]:
        assert {r[2] for r in OBJECTIVE_XP_ROWS if r[0] == b} == set(OBJECTIVE_TILTS)
    rows = set(OBJECTIVE_ROWS)
    assert {(r[0], r[2]) for r in rows} == {(n, d) for n in OBJECTIVE_LOSSES for d in DTYPES}
    assert {(r[1], r[2], r[3]) for r in rows} == set(
        itertools.product(OBJECTIVE_TILTS, DTYPES, (False, True))
    )


def test_the_objective_check_can_fail():
    """An engine whose gradient, product or prior handling is off fails the check."""
    base = OBJECTIVE_ENGINES["one-pass"]

    def wrong(key, scale):
        def evaluate(name, pb, dtype, params):
            out = base.evaluate(name, pb, dtype, params)
            out[key] = np.asarray(out[key]) * scale
            return out

        return ObjectiveEngine(needs=(), evaluate=evaluate)

    for key in ("value", "grad", "hvp"):
        with pytest.raises(AssertionError, match=key):
            check_objective_engine(wrong(key, 1 + 1e-9), "logistic", "t=-2", np.float64, True)

    def ignores_prior(name, pb, dtype, params):
        return base.evaluate(name, {**pb, "prior": None}, dtype, params)

    with pytest.raises(AssertionError, match="value"):
        check_objective_engine(
            ObjectiveEngine(needs=(), evaluate=ignores_prior), "squared", "t=8", np.float64, True
        )
