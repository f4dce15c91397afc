"""The appendix's feature-and-target noise table on abalone.

After Yu et al. (2012), as the paper's appendix describes: 100 training rows of the UCI
abalone data (z-scored features plus an intercept), of which 5% are corrupted by
multiplying their features by 100 and their targets by 10,000
(:func:`tiltlab.datasets.load_abalone` with ``corruption="scale"``); the validation split
is corrupted the same way and the test split is clean. The methods are those of the
robust-regression table (:mod:`tiltlab.reproduce.robust_regression`): ERM, L1, Huber
(``delta = 1``), STIR, CRR (``k = 5``, the number of corrupted rows), TERM (``t = -2``,
L-BFGS from zero and from the median intercept, keeping the lower tilted objective) and the
oracle Genie ERM.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from ._common import Reproduction, format_grid, make_row, progress_bar, seed_list

__all__ = ["ABALONE_METHODS", "PAPER_ABALONE", "abalone"]

#: The methods of the abalone table, in its row order.
ABALONE_METHODS = ("ERM", "L1", "Huber", "STIR", "CRR", "TERM", "Genie ERM")

#: The paper's appendix table, abalone columns: (method, setting) -> (mean, se) test RMSE.
PAPER_ABALONE: dict[tuple[str, str], tuple[float, float]] = {
    ("ERM", "clean"): (2.444, 0.105),
    ("ERM", "noisy"): (1013.0, 72.0),
    ("L1", "clean"): (2.435, 0.021),
    ("L1", "noisy"): (1008.0, 117.0),
    ("Huber", "clean"): (2.449, 0.018),
    ("Huber", "noisy"): (922.0, 45.0),
    ("CRR", "clean"): (2.444, 0.021),
    ("CRR", "noisy"): (986.0, 146.0),
    ("TERM", "clean"): (2.477, 0.041),
    ("TERM", "noisy"): (2.449, 0.028),
    ("Genie ERM", "clean"): (2.444, 0.105),
    ("Genie ERM", "noisy"): (2.450, 0.109),
}

#: Training rows drawn for each seed.
N_TRAIN = 100
#: Share of the training rows whose features and target are corrupted.
NOISE = 0.05


def _fit_term(d, t: float = -2.0) -> np.ndarray:
    """TERM from two starts (zero, and the median as intercept); the lower objective wins.

    For ``t < 0`` the tilted objective is not convex, and on these targets (ring counts,
    squared losses of order 100 at zero) ``t = -2`` is a sharp soft minimum with local
    minima: a second start is what a careful user does.
    """
    from ..objective import TiltedObjective
    from ..solvers import minimize

    obj = TiltedObjective("squared", d.X_train, d.y_train, t=t)
    start = np.zeros(d.X_train.shape[1])
    start[-1] = np.median(d.y_train)  # the last column is the intercept
    fits = [minimize(obj, method="lbfgs"), minimize(obj, start, method="lbfgs")]
    return np.asarray(min(fits, key=lambda r: float(r.fun)).x)


def abalone(
    seeds: int | Sequence[int] = 5,
    *,
    quick: bool = False,
    progress: bool = False,
) -> Reproduction:
    """Reproduce the appendix's abalone columns (feature and target noise).

    Parameters
    ----------
    seeds : int or sequence of int, default 5
        Number of random splits (``0 .. seeds-1``), or the seeds.
    quick : bool, default False
        Accepted for a uniform interface (every fit takes milliseconds).
    progress : bool, default False
        Show a progress bar.

    Returns
    -------
    Reproduction
        ``test_rmse`` per method for the ``clean`` and ``noisy`` settings.

    See Also
    --------
    tiltlab.reproduce.run : Runs an experiment by its command name.
    robust_regression_report : The robust-regression table on Drug Discovery.

    Examples
    --------
    >>> from tiltlab.reproduce import abalone
    >>> rep = abalone(seeds=1)
    >>> by = {(r["method"], r["setting"]): r["mean"] for r in rep.rows}
    >>> by[("TERM", "noisy")] < 5 < by[("ERM", "noisy")]
    True
    """
    from .. import baselines as bl
    from ..datasets import load_abalone

    del quick
    seeds_ = seed_list(seeds)
    k = int(NOISE * N_TRAIN)
    fitters = {
        "ERM": lambda d: bl.fit_least_squares(d.X_train, d.y_train),
        "L1": lambda d: bl.fit_l1(d.X_train, d.y_train),
        "Huber": lambda d: bl.fit_huber(d.X_train, d.y_train, delta=1.0),
        "STIR": lambda d: bl.fit_stir(d.X_train, d.y_train),
        "CRR": lambda d: bl.fit_crr(d.X_train, d.y_train, k=k),
        "TERM": _fit_term,
    }
    values: dict[tuple[str, str], list[float]] = {}
    settings = {"clean": 0.0, "noisy": NOISE}
    bar = progress_bar(progress, len(seeds_) * 2 * len(ABALONE_METHODS), "abalone")
    started = time.perf_counter()
    for s in seeds_:
        for setting, noise in settings.items():
            kw = {"seed": s, "noise": noise, "corruption": "scale", "n_train": N_TRAIN}
            d = load_abalone(**kw)
            for m in ABALONE_METHODS:
                bar.set_postfix_str(f"seed={s} {setting} {m}")
                if m == "Genie ERM":
                    g = load_abalone(**kw, genie=True)
                    w = bl.fit_genie(g.X_train, g.y_train)
                else:
                    w = fitters[m](d)
                values.setdefault((m, setting), []).append(bl.rmse(d.X_test, d.y_test, w))
                bar.update(1)
    bar.close()
    rows = [
        make_row(m, setting, "test_rmse", "test", values[(m, setting)],
                 PAPER_ABALONE.get((m, setting)))
        for m in ABALONE_METHODS
        for setting in settings
    ]  # fmt: skip
    seconds = time.perf_counter() - started
    table = format_grid(rows, row_of=lambda r: r["method"], col_of=lambda r: r["setting"])
    notes = (
        "Noisy: 5 of the 100 training rows (and 5% of the validation rows) have features x100 "
        "and targets x10,000; the test split is clean.\nCRR is given k = 5, the true number "
        "of corrupted rows, and still fails, as the paper's does: rows with features x100\n"
        "have such leverage that the fit passes close to them, so their residuals are not "
        "the largest. STIR is not in the paper's table.\nDifferences from the paper: its "
        "noisy ERM, L1, Huber and CRR numbers are of the order of 1000, ours of 2000; any "
        "fit\nthat follows the corrupted rows lands there, so only the order of magnitude "
        "compares. TERM (t = -2) is not convex here\nand has local minima (squared losses "
        "of order 100 at the start): it is fitted from zero and from the median intercept,\n"
        "keeping the lower objective (from zero alone it ends at RMSE 3-11 on some seeds); "
        "the paper does not say how it\nstarted, and our TERM is about 0.2 above its "
        "2.45-2.48. The cal-housing columns are not reproduced (not shipped).\n"
        f"{len(seeds_)} seed(s), {seconds:.1f} s."
    )
    return Reproduction(
        experiment="abalone",
        rows=rows,
        title=(
            f"tiltlab reproduce abalone: 100 training rows, 5% feature-and-target noise, "
            f"{len(seeds_)} seed(s)\nclean test RMSE, mean (se) [paper]"
        ),
        table=table,
        notes=notes,
    )
