"""Reproductions of the TERM paper's experiments on the shipped data.

One module per experiment, each also a ``tiltlab reproduce NAME`` command:

* :mod:`~tiltlab.reproduce.robust_regression` - Table 1, robust regression on Drug Discovery;
* :mod:`~tiltlab.reproduce.hiv1_fairness` - class-level TERM on HIV-1 (fairness and
  generalisation);
* :mod:`~tiltlab.reproduce.hierarchical` - hierarchical TERM on HIV-1 with label noise and
  class imbalance, including the annotator variant;
* :mod:`~tiltlab.reproduce.abalone` - the appendix's feature-and-target noise on abalone;
* :mod:`~tiltlab.reproduce.toys` - the toy panels of the paper's first figure and the
  average- vs max/min-loss trade-off figure;
* :mod:`~tiltlab.reproduce.convergence` - convergence with ``t`` and the correctness of the
  stochastic solver;
* :mod:`~tiltlab.reproduce.fair_pca` - the fair-PCA figure (TERM-PCA against standard PCA
  and the min-max SDP);
* :mod:`~tiltlab.reproduce.fair_federated` - fair federated learning (TERM across devices
  against FedAvg, q-FFL and AFL).

Every experiment returns a :class:`Reproduction` whose rows follow one schema (see
:mod:`tiltlab.reproduce._common`); :func:`run` runs one by its command name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ._common import (
    ROW_KEYS,
    Reproduction,
    make_row,
    mean_se,
    seed_list,
    single_blas_thread,
    write_json,
)
from .abalone import PAPER_ABALONE, abalone
from .convergence import convergence
from .fair_federated import PAPER_FAIR_FL, fair_federated
from .fair_pca import fair_pca
from .hierarchical import PAPER_HIERARCHICAL, hierarchical
from .hiv1_fairness import PAPER_HIV1_FAIRNESS, hiv1_fairness
from .robust_regression import (
    CRR_K,
    PAPER_TABLE1,
    ROBUST_METHODS,
    fit_term_regression,
    format_robust_table,
    robust_regression,
    robust_regression_report,
)
from .toys import toys

__all__ = [
    "CRR_K",
    "EXPERIMENTS",
    "PAPER_ABALONE",
    "PAPER_FAIR_FL",
    "PAPER_HIERARCHICAL",
    "PAPER_HIV1_FAIRNESS",
    "PAPER_TABLE1",
    "ROBUST_METHODS",
    "ROW_KEYS",
    "Reproduction",
    "abalone",
    "convergence",
    "fair_federated",
    "fair_pca",
    "fit_term_regression",
    "format_robust_table",
    "hierarchical",
    "hiv1_fairness",
    "make_row",
    "mean_se",
    "robust_regression",
    "robust_regression_report",
    "run",
    "seed_list",
    "toys",
    "write_json",
]

#: Command name -> function returning a :class:`Reproduction`.
EXPERIMENTS: dict[str, Callable[..., Reproduction]] = {
    "robust-regression": robust_regression_report,
    "hiv1-fairness": hiv1_fairness,
    "hierarchical": hierarchical,
    "abalone": abalone,
    "toys": toys,
    "convergence": convergence,
    "fair-pca": fair_pca,
    "fair-federated": fair_federated,
}


def run(
    name: str,
    seeds: int | Sequence[int] = 5,
    *,
    quick: bool = False,
    progress: bool = False,
    **options: Any,
) -> Reproduction:
    """Run the experiment ``name`` (a key of :data:`EXPERIMENTS`), as the command does.

    It runs with one BLAS thread per process (see
    :func:`tiltlab.reproduce._common.single_blas_thread`); the numbers do not depend on it.

    Examples
    --------
    >>> from tiltlab.reproduce import run
    >>> rep = run("abalone", seeds=1, quick=True)
    >>> rep.to_dict()["experiment"]
    'abalone'
    """
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment `name` {name!r}; choose from {list(EXPERIMENTS)}")
    with single_blas_thread():
        return EXPERIMENTS[name](seeds, quick=quick, progress=progress, **options)
