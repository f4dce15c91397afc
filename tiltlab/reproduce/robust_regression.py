"""Reproductions of the TERM paper's tables on the shipped data.

``robust_regression`` reproduces Table 1 (robust linear regression on the Drug Discovery
data with a fraction of the training and validation targets replaced by N(5, 5) draws):
ERM, L1, Huber, STIR, CRR, TERM (t = -2) and the oracle Genie ERM, mean and standard
error of the clean test RMSE over seeds.

TERM is solved with tiltlab's recommended configuration: L-BFGS from zero
with early stopping on the (equally noisy) validation split's tilted objective. The
design matrix is binary and rank deficient, so minimising the training objective to
machine precision fits noise in the null directions and generalises worse; the paper's
protocol has a validation split, and early stopping on it is the honest regulariser.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from ._common import Reproduction, check_choices, make_row, progress_bar, single_blas_thread
from ._common import seed_list as _seed_list

__all__ = [
    "PAPER_TABLE1",
    "ROBUST_METHODS",
    "robust_regression",
    "format_robust_table",
    "fit_term_regression",
    "robust_regression_report",
]

#: The paper's Table 1: test RMSE mean (standard error) on Drug Discovery.
PAPER_TABLE1: dict[tuple[str, float], tuple[float, float]] = {
    ("ERM", 0.2): (1.87, 0.05),
    ("ERM", 0.4): (2.83, 0.06),
    ("ERM", 0.8): (4.74, 0.06),
    ("L1", 0.2): (1.15, 0.07),
    ("L1", 0.4): (1.70, 0.12),
    ("L1", 0.8): (4.78, 0.08),
    ("Huber", 0.2): (1.16, 0.07),
    ("Huber", 0.4): (1.78, 0.11),
    ("Huber", 0.8): (4.74, 0.07),
    ("STIR", 0.2): (1.16, 0.07),
    ("STIR", 0.4): (1.75, 0.12),
    ("STIR", 0.8): (4.74, 0.06),
    ("CRR", 0.2): (1.10, 0.07),
    ("CRR", 0.4): (1.51, 0.08),
    ("CRR", 0.8): (4.07, 0.06),
    ("TERM", 0.2): (1.08, 0.05),
    ("TERM", 0.4): (1.10, 0.04),
    ("TERM", 0.8): (1.68, 0.03),
    ("Genie ERM", 0.2): (1.02, 0.04),
    ("Genie ERM", 0.4): (1.07, 0.04),
    ("Genie ERM", 0.8): (1.04, 0.03),
}

#: The methods of the robust-regression table, in its row order.
ROBUST_METHODS = ("ERM", "L1", "Huber", "STIR", "CRR", "TERM", "Genie ERM")

#: CRR's corruption budget k per noise level, as in the paper's appendix.
CRR_K = {0.2: 500, 0.4: 1000, 0.8: 3000}


def fit_term_regression(
    data: Any,
    *,
    t: float = -2.0,
    method: str = "lbfgs",
    patience: int = 30,
    max_iter: int = 2000,
    **options: Any,
):
    """TERM for squared-loss linear regression with validation early stopping.

    Parameters
    ----------
    data : tiltlab.datasets.DatasetSplit
        The split to fit: trained on ``X_train, y_train``, stopped early on the tilted
        loss of ``X_val, y_val``.
    t : float, default -2.0
        The tilt (negative: robust to outlying targets).
    method : str, default "lbfgs"
        The solver, as in :func:`tiltlab.minimize`.
    patience : int, default 30
        Iterations without a better validation loss before stopping.
    max_iter : int, default 2000
        Maximum number of iterations.
    **options
        Further options of :func:`tiltlab.minimize`.

    Returns
    -------
    tiltlab.OptimizeResult
        The fit; its ``x`` is the coefficient vector.

    See Also
    --------
    :func:`~tiltlab.reproduce.robust_regression` : The table this fit is one row of.
    tiltlab.baselines.fit_least_squares : The ERM row.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.datasets import load_abalone
    >>> from tiltlab.reproduce import fit_term_regression
    >>> data = load_abalone(noise=0.2, seed=0)
    >>> res = fit_term_regression(data, max_iter=50)
    >>> res.x.shape == (data.n_features,)
    True
    """
    from ..objective import TiltedObjective
    from ..solvers import minimize

    train = TiltedObjective("squared", data.X_train, data.y_train, t=t)
    val = TiltedObjective("squared", data.X_val, data.y_val, t=t)
    return minimize(
        train, method=method, validation=val, patience=patience, max_iter=max_iter, **options
    )


def _fitters(noise: float) -> dict[str, Callable[[Any], np.ndarray]]:
    from .. import baselines as bl

    k = CRR_K.get(round(noise, 3), None)
    return {
        "ERM": lambda d: bl.fit_least_squares(d.X_train, d.y_train),
        "L1": lambda d: bl.fit_l1(d.X_train, d.y_train),
        "Huber": lambda d: bl.fit_huber(d.X_train, d.y_train, delta=1.0),
        "STIR": lambda d: bl.fit_stir(d.X_train, d.y_train),
        "CRR": lambda d: bl.fit_crr(d.X_train, d.y_train, k=k, corruption_fraction=noise),
        "TERM": lambda d: np.asarray(fit_term_regression(d).x),
    }


def _fit_split(p: float, s: int, methods: Sequence[str]) -> dict[str, tuple[float, float]]:
    """Fit every method on one (noise, seed) split: method -> (test RMSE, seconds)."""
    from ..baselines import fit_genie, rmse
    from ..datasets import load_drug_discovery

    fitters = _fitters(p)
    data = load_drug_discovery(seed=s, noise=p)
    out = {}
    for m in methods:
        t0 = time.perf_counter()
        if m == "Genie ERM":
            clean = load_drug_discovery(seed=s, noise=p, genie=True)
            w = fit_genie(clean.X_train, clean.y_train)
        else:
            w = fitters[m](data)
        out[m] = (rmse(data.X_test, data.y_test, w), time.perf_counter() - t0)
    return out


def _check_jobs(jobs: int | None, tasks: int) -> int:
    if jobs is None:
        jobs = os.cpu_count() or 1
    if isinstance(jobs, bool) or not isinstance(jobs, (int, np.integer)) or jobs < 1:
        raise ValueError(f"`jobs` must be a positive integer or None, got {jobs!r}")
    return int(min(jobs, tasks))


def robust_regression(
    seeds: int | Sequence[int] = 5,
    noise: Iterable[float] = (0.2, 0.4, 0.8),
    *,
    methods: Iterable[str] = ROBUST_METHODS,
    progress: bool = False,
    jobs: int | None = 1,
) -> list[dict]:
    """Reproduce the paper's robust-regression table (Table 1).

    Parameters
    ----------
    seeds : int or sequence of int, default 5
        Number of seeds (``0 .. seeds-1``) or the seeds themselves; each seed shuffles,
        splits 80/10/10 and draws the noisy targets.
    noise : iterable of float, default (0.2, 0.4, 0.8)
        Fractions of corrupted training and validation targets.
    methods : iterable of str
        Any of ``ROBUST_METHODS``.
    progress : bool, default False
        Show a tqdm progress bar over the (noise, seed) splits.
    jobs : int or None, default 1
        Worker processes for the (noise, seed) splits (``None``: one per CPU), each with
        one BLAS thread. Every fit is deterministic, so the numbers do not depend on it.

    Returns
    -------
    list of dict
        One row per (method, noise): ``method, noise, test_rmse_mean, test_rmse_se``
        (standard error over seeds), ``seconds`` (mean fit time), ``test_rmse`` (per seed),
        ``paper_mean, paper_se``.

    Raises
    ------
    ValueError
        If a `noise` level is outside ``[0, 1)``, a method is unknown, or `seeds` or
        `jobs` is invalid.

    See Also
    --------
    robust_regression_report : The same as a :class:`~tiltlab.reproduce.Reproduction`.
    fit_term_regression : The TERM row's fit.

    Examples
    --------
    >>> from tiltlab.reproduce import robust_regression
    >>> rows = robust_regression(seeds=1, noise=[0.2], methods=["ERM"])
    >>> rows[0]["method"], round(rows[0]["test_rmse_mean"], 1) > 1.0
    ('ERM', True)
    """
    seed_list = _seed_list(seeds)
    noise = [float(v) for v in noise]
    for v in noise:
        if not 0 <= v < 1:
            raise ValueError(f"`noise` levels must lie in [0, 1), got {v}")
    methods = list(methods)
    methods = check_choices(methods, ROBUST_METHODS, "methods")
    tasks = [(p, s) for p in noise for s in seed_list]
    jobs = _check_jobs(jobs, len(tasks))
    bar = progress_bar(progress, len(tasks), "robust-regression")
    done: dict[tuple[float, int], dict[str, tuple[float, float]]] = {}
    if jobs == 1:
        for p, s in tasks:
            bar.set_postfix_str(f"noise={p} seed={s}")
            done[(p, s)] = _fit_split(p, s, methods)
            bar.update(1)
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        # "spawn": fresh interpreters, safe whatever threads this process runs (fork is not)
        context = multiprocessing.get_context("spawn")
        with single_blas_thread(), ProcessPoolExecutor(jobs, mp_context=context) as pool:
            futures = {pool.submit(_fit_split, p, s, methods): (p, s) for p, s in tasks}
            for future in as_completed(futures):
                done[futures[future]] = future.result()
                bar.set_postfix_str("noise={} seed={}".format(*futures[future]))
                bar.update(1)
    bar.close()
    rows = []
    for p in noise:
        for m in methods:
            e = np.asarray([done[(p, s)][m][0] for s in seed_list])
            secs = [done[(p, s)][m][1] for s in seed_list]
            se = float(e.std(ddof=1) / math.sqrt(e.size)) if e.size > 1 else float("nan")
            paper = PAPER_TABLE1.get((m, round(p, 3)), (float("nan"), float("nan")))
            rows.append(
                {
                    "method": m,
                    "noise": p,
                    "test_rmse_mean": float(e.mean()),
                    "test_rmse_se": se,
                    "seconds": float(np.mean(secs)),
                    "test_rmse": e.tolist(),
                    "paper_mean": paper[0],
                    "paper_se": paper[1],
                }
            )
    return rows


def format_robust_table(rows: list[dict]) -> str:
    """The table as text: ours ``mean (se)`` beside the paper's, one column per noise.

    Parameters
    ----------
    rows : list of dict
        The rows returned by :func:`robust_regression`.

    Returns
    -------
    str
        One line per method: test RMSE ``mean (se)`` and the paper's for every noise
        level, and the mean seconds per fit.

    See Also
    --------
    :func:`~tiltlab.reproduce.robust_regression` : Computes the rows.
    robust_regression_report : The same table inside a
        :class:`~tiltlab.reproduce.Reproduction`.

    Examples
    --------
    >>> from tiltlab.reproduce import format_robust_table
    >>> row = {"method": "ERM", "noise": 0.2, "test_rmse_mean": 2.5, "test_rmse_se": 0.1,
    ...        "seconds": 0.01, "paper_mean": 2.3, "paper_se": 0.05}
    >>> print(format_robust_table([row]))  # doctest: +NORMALIZE_WHITESPACE
    method     | 20% noise: tiltlab        paper | s/fit
    -------------------------------------------------------
    ERM        |           2.50 (0.10)  2.30 (0.05) | 0.01
    """
    noises = sorted({r["noise"] for r in rows})
    methods = [m for m in ROBUST_METHODS if any(r["method"] == m for r in rows)]
    by = {(r["method"], r["noise"]): r for r in rows}

    def cell(mean: float, se: float) -> str:
        if math.isnan(mean):
            return "-"
        return f"{mean:.2f} ({se:.2f})" if not math.isnan(se) else f"{mean:.2f}"

    head = (
        f"{'method':<10}"
        + "".join(f" | {f'{p:.0%} noise: tiltlab':>21} {'paper':>12}" for p in noises)
        + " | s/fit"
    )
    lines = [head, "-" * len(head)]
    for m in methods:
        line = f"{m:<10}"
        sec = []
        for p in noises:
            r = by.get((m, p))
            if r is None:
                line += f" | {'':>21} {'':>12}"
                continue
            line += (
                f" | {cell(r['test_rmse_mean'], r['test_rmse_se']):>21} "
                f"{cell(r['paper_mean'], r['paper_se']):>12}"
            )
            sec.append(r["seconds"])
        lines.append(line + f" | {np.mean(sec):.2f}")
    return "\n".join(lines)


ROBUST_NOTES = (
    "TERM: squared loss, t = -2, L-BFGS with early stopping on the noisy validation split.\n"
    "Genie ERM is the oracle least-squares fit on the clean rows only.\n"
    "Differences from the paper: at 80% noise our TERM (1.5) beats the paper's (1.68), and\n"
    "our Genie ERM is worse (1.8 against 1.04): with 654 clean rows and 411 binary features\n"
    "plain least squares nearly interpolates, and the paper does not say how its Genie fit\n"
    "was regularised. Our CRR follows Bhatia et al. with the paper's k and runs to its\n"
    "fixed point; at 40% and 80% noise it is worse than the paper's CRR (1.76 against 1.51,\n"
    "4.7 against 4.07), whose stopping rule is not given. The L1 and Huber minimisers are not\n"
    "unique on this binary, rank-deficient design (fingerprint bits seen only in noisy rows):\n"
    "minimisers with the same objective differ by up to 0.04 in test RMSE on one seed, so the\n"
    "second decimal of those rows depends on the solver (L1: HiGHS on the dual LP; Huber:\n"
    "L-BFGS-B run to convergence)."
)


def robust_regression_report(
    seeds: int | Sequence[int] = 5,
    *,
    noise: Iterable[float] = (0.2, 0.4, 0.8),
    methods: Iterable[str] = ROBUST_METHODS,
    quick: bool = False,
    progress: bool = False,
    jobs: int | None = 1,
) -> Reproduction:
    """:func:`robust_regression` as a :class:`~tiltlab.reproduce.Reproduction`.

    Rows have ``metric="test_rmse"``, ``split="test"`` and ``setting`` naming the noise
    (``"noise=0.2"``); ``quick`` is accepted for a uniform interface (one seed of the full
    table takes a few seconds); ``jobs`` as in :func:`robust_regression`.

    Parameters
    ----------
    seeds : int or sequence of int, default 5
        Number of seeds or the seeds themselves.
    noise : iterable of float, default (0.2, 0.4, 0.8)
        Fractions of corrupted training and validation targets.
    methods : iterable of str
        Any of :data:`~tiltlab.reproduce.ROBUST_METHODS`.
    quick : bool, default False
        Ignored (the full table is already quick).
    progress : bool, default False
        Show a progress bar.
    jobs : int or None, default 1
        Worker processes (``None``: one per CPU).

    Returns
    -------
    Reproduction
        The schema rows, the text table (:func:`format_robust_table`) and notes.

    Raises
    ------
    ValueError
        If a `noise` level is outside ``[0, 1)`` or a method is unknown.

    See Also
    --------
    :func:`~tiltlab.reproduce.robust_regression` : The rows in their own format.
    tiltlab.reproduce.run : Runs it by its command name, ``"robust-regression"``.

    Examples
    --------
    >>> from tiltlab.reproduce import robust_regression_report
    >>> rep = robust_regression_report(seeds=1, noise=[0.2], methods=["ERM"])
    >>> rep.to_dict()["rows"][0]["setting"], rep.to_dict()["rows"][0]["se"] is None
    ('noise=0.2', True)
    """
    del quick
    old = robust_regression(seeds, noise, methods=methods, progress=progress, jobs=jobs)
    rows = [
        make_row(
            r["method"],
            f"noise={r['noise']:g}",
            "test_rmse",
            "test",
            r["test_rmse"],
            (r["paper_mean"], r["paper_se"]),
        )  # fmt: skip
        for r in old
    ]
    n = len(old[0]["test_rmse"]) if old else 0
    noises = sorted({r["noise"] for r in old})
    return Reproduction(
        experiment="robust-regression",
        rows=rows,
        title=(
            f"tiltlab reproduce robust-regression: Drug Discovery (4085 x 411), {n} seed(s), "
            f"noise {', '.join(f'{p:.0%}' for p in noises)}\nclean test RMSE, mean "
            "(standard error over seeds); the paper's Table 1 beside it"
        ),
        table=format_robust_table(old),
        notes=ROBUST_NOTES,
        curves={"raw": old},
    )
