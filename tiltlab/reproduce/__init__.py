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
* :mod:`~tiltlab.reproduce.label_noise`, :mod:`~tiltlab.reproduce.noisy_annotators` and
  :mod:`~tiltlab.reproduce.class_imbalance` - the deep-learning experiments in miniature
  (small PyTorch networks on the handwritten digits; they need PyTorch and scikit-learn).
* :mod:`~tiltlab.reproduce.fair_pca` - the fair-PCA figure (TERM-PCA against standard PCA
  and the min-max SDP);
* :mod:`~tiltlab.reproduce.fair_federated` - fair federated learning (TERM across devices
  against FedAvg, q-FFL and AFL);
* :mod:`~tiltlab.reproduce.lm_noisy_targets` - a small causal language model on partly
  corrupted target sequences (ERM, DFT, token- and sequence-level TERM; needs PyTorch).

Every experiment returns a :class:`Reproduction` whose rows follow one schema (the keys
:data:`ROW_KEYS`); :func:`run` runs one by its command name.
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
from .class_imbalance import class_imbalance
from .convergence import convergence
from .fair_federated import PAPER_FAIR_FL, fair_federated
from .fair_pca import fair_pca
from .hierarchical import PAPER_HIERARCHICAL, hierarchical
from .hiv1_fairness import PAPER_HIV1_FAIRNESS, hiv1_fairness
from .label_noise import PAPER_LABEL_NOISE, label_noise
from .lm_noisy_targets import lm_noisy_targets
from .noisy_annotators import noisy_annotators
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
    "PAPER_LABEL_NOISE",
    "PAPER_TABLE1",
    "ROBUST_METHODS",
    "ROW_KEYS",
    "Reproduction",
    "abalone",
    "class_imbalance",
    "convergence",
    "fair_federated",
    "fair_pca",
    "fit_term_regression",
    "format_robust_table",
    "hierarchical",
    "hiv1_fairness",
    "label_noise",
    "lm_noisy_targets",
    "make_row",
    "mean_se",
    "noisy_annotators",
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
    "label-noise": label_noise,
    "noisy-annotators": noisy_annotators,
    "class-imbalance": class_imbalance,
    "fair-pca": fair_pca,
    "fair-federated": fair_federated,
    "lm-noisy-targets": lm_noisy_targets,
}


def run(
    name: str,
    seeds: int | Sequence[int] = 5,
    *,
    quick: bool = False,
    progress: bool = False,
    **options: Any,
) -> Reproduction:
    """Run the experiment ``name`` (a key of :data:`~tiltlab.reproduce.EXPERIMENTS`).

    It runs with one BLAS thread per process (as the command does); the numbers do not
    depend on it.

    Parameters
    ----------
    name : str
        The experiment: ``"robust-regression"``, ``"hiv1-fairness"``, ``"hierarchical"``,
        ``"abalone"``, ``"toys"``, ``"convergence"``, ``"label-noise"``,
        ``"noisy-annotators"``, ``"class-imbalance"``, ``"fair-pca"``,
        ``"fair-federated"`` or ``"lm-noisy-targets"`` (the keys of
        :data:`~tiltlab.reproduce.EXPERIMENTS`).
    seeds : int or sequence of int, default 5
        The number of seeds (seeds ``0, ..., seeds - 1``) or the seeds themselves; each
        table entry is the mean and standard error over them.
    quick : bool, default False
        Reduced grids, for a quick look (the command's ``--quick``).
    progress : bool, default False
        Show a progress bar on standard error.
    **options
        Passed to the experiment's function (for instance ``noise`` or ``jobs`` of
        :func:`robust_regression_report`).

    Returns
    -------
    Reproduction
        The rows of the table (ours beside the paper's), the notes on where they differ,
        and the curves of its figures.

    Raises
    ------
    ValueError
        If `name` is not an experiment.

    See Also
    --------
    Reproduction.report : The printed table.
    Reproduction.to_dict : The JSON form that ``--json`` writes.

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
