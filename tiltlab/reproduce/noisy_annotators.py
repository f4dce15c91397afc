"""The paper's low-quality annotators, in miniature.

The paper simulates 100 annotators on CIFAR-10: 20 always give the right label
("hammers"), 80 label uniformly at random ("spammers"); each training image is labelled
by one annotator. TERM tilts at the annotator level (t = -2; samples within an annotator
are averaged), which down-weights the annotators whose aggregate loss is high, and reaches
the accuracy of Genie ERM, the oracle that trains on the hammers' rows alone. Here the
same protocol runs on scikit-learn's handwritten digits with a small PyTorch network
trained on minibatches; the share of spammers is swept as well.

Methods:

* ``ERM``: the batch mean of the cross-entropy over every row;
* ``TERM``: :class:`tiltlab.torch.TiltedLoss` with ``tilts=(-2, 0)`` and the annotator
  of each row as its group (the paper's Algorithm 2: running annotator risks, weights
  of the annotators from them); the annotator-level tilt is ramped from 0 to -2 over the
  first half of training, as the paper's deep experiments ramp theirs;
* ``Genie ERM``: ERM on the rows of the reliable annotators only.

After training, the TERM network's per-sample losses on its training rows are reported
per annotator (:func:`tiltlab.diagnostics.group_report` at the final tilts ``(t, 0)``)
for the first seed, with the share of the annotator weights that the spammers keep.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from . import _deep
from ._common import Reproduction, check_choices, format_grid, make_row, progress_bar, seed_list
from ._deep_report import training_losses, training_report
from ._figures import plot_accuracy_curves

__all__ = [
    "METHODS",
    "N_ANNOTATORS",
    "PAPER_NOISY_ANNOTATORS",
    "SPAMMER_SHARES",
    "annotate",
    "noisy_annotators",
]

#: Number of annotators.
N_ANNOTATORS = 100
#: Shares of the annotators that are spammers, one setting each.
SPAMMER_SHARES = (0.8, 0.5, 0.2)
#: The methods compared, in the table's row order.
METHODS = ("ERM", "TERM", "Genie ERM")
#: Training epochs of the full run.
EPOCHS = 40
#: Training epochs with ``quick=True``.
EPOCHS_QUICK = 25

#: The paper reports TERM's accuracy in this setting (CIFAR-10, ResNet-20, 80 spammers).
PAPER_NOISY_ANNOTATORS = {("TERM", "spammers=80%"): (0.825, None)}


def annotate(
    y: np.ndarray, n_annotators: int, n_spammers: int, n_classes: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Labels given by ``n_annotators`` annotators, the first ``n_spammers`` of them random.

    Each row goes to one annotator drawn uniformly; a spammer's label is uniform over the
    classes (so it is right ``1 / n_classes`` of the time), a reliable annotator's label is
    the true one.

    Parameters
    ----------
    y : numpy.ndarray of int, shape (n,)
        The true labels.
    n_annotators : int
        Number of annotators.
    n_spammers : int
        Number of spammers among them (the first ones).
    n_classes : int
        Number of classes.
    rng : numpy.random.Generator
        The random generator.

    Returns
    -------
    labels, annotator, spammer_row
        The given labels, the annotator of each row and whether it is a spammer's.

    See Also
    --------
    :func:`~tiltlab.reproduce.noisy_annotators` : The experiment that uses them.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.reproduce.noisy_annotators import annotate
    >>> y = np.arange(10) % 3
    >>> labels, who, bad = annotate(y, 4, 0, 3, np.random.default_rng(0))
    >>> bool((labels == y).all()), int(bad.sum())
    (True, 0)
    """
    who = rng.integers(0, n_annotators, size=y.size)
    bad = who < n_spammers
    labels = y.copy()
    labels[bad] = rng.integers(0, n_classes, size=int(bad.sum()))
    return labels, who, bad


def noisy_annotators(
    seeds: int | Sequence[int] = 5,
    *,
    quick: bool = False,
    progress: bool = False,
    spammer_shares: Sequence[float] = SPAMMER_SHARES,
    methods: Sequence[str] = METHODS,
    n_annotators: int = N_ANNOTATORS,
    t: float = -2.0,
    model: str = "mlp",
    device: str = "cpu",
    epochs: int | None = None,
) -> Reproduction:
    """Clean test accuracy of ERM, annotator-level TERM and Genie ERM with spammers.

    Parameters
    ----------
    seeds : int or sequence of int, default 5
        Number of seeds (split, annotators, initialisation), or the seeds.
    quick : bool, default False
        Fewer epochs (25 instead of 40).
    progress : bool, default False
        Show a progress bar.
    spammer_shares : sequence of float, default (0.8, 0.5, 0.2)
        Shares of the annotators who label at random (the paper's setting is 0.8).
    methods : sequence of str, default all of :data:`~tiltlab.reproduce.noisy_annotators.METHODS`
        The methods to train and compare.
    n_annotators : int, default 100
        Number of annotators; each row is labelled by one drawn at random.
    t : float, default -2
        TERM's annotator-level tilt.
    model : {"mlp", "cnn"}, default "mlp"
    device : str, default "cpu"
        ``"cuda"`` to train on a GPU.
    epochs : int, optional
        Override the number of epochs.

    Returns
    -------
    Reproduction
        Rows ``(method, "spammers=s%", "accuracy", "test")``.

    See Also
    --------
    tiltlab.reproduce.run : Runs an experiment by its command name.
    :func:`~tiltlab.reproduce.label_noise` : Deep learning with noisy labels.
    :func:`~tiltlab.reproduce.class_imbalance` : Deep learning with a rare class.

    Examples
    --------
    >>> from tiltlab.reproduce import noisy_annotators
    >>> rep = noisy_annotators(1, spammer_shares=[0.8], methods=["ERM", "TERM"], epochs=2)
    >>> [(r["method"], r["setting"]) for r in rep.rows]
    [('ERM', 'spammers=80%'), ('TERM', 'spammers=80%')]
    """
    import torch

    from ..minibatch import linear_schedule
    from ..torch import TiltedLoss

    device = _deep.check_device(device)
    methods = check_choices(methods, METHODS, "methods")
    shares = [float(s) for s in spammer_shares]
    if not shares or any(not 0.0 <= s < 1.0 for s in shares):
        raise ValueError(f"`spammer_shares` must be shares in [0, 1), got {spammer_shares!r}")
    if isinstance(n_annotators, bool) or not isinstance(n_annotators, int) or n_annotators < 2:
        raise ValueError(f"`n_annotators` must be an integer >= 2, got {n_annotators!r}")
    seeds_ = seed_list(seeds)
    n_epochs = int(epochs) if epochs is not None else (EPOCHS_QUICK if quick else EPOCHS)
    started = time.perf_counter()
    acc: dict[tuple[str, float], list[float]] = {}
    bar = progress_bar(progress, len(seeds_) * len(shares) * len(methods), "noisy-annotators")
    ce = torch.nn.CrossEntropyLoss(reduction="none")
    reports: dict[str, dict] = {}
    spam_weight: dict[float, list[float]] = {}
    for seed in seeds_:
        split = _deep.digits_split(seed)
        for share in shares:
            rng = np.random.default_rng([seed, int(round(1000 * share))])
            n_spam = int(round(share * n_annotators))
            labels, who, bad = annotate(split.y_train, n_annotators, n_spam, split.n_classes, rng)
            steps = n_epochs * -(-labels.size // 64)
            for m in methods:
                bar.set_postfix_str(f"seed={seed} spammers={share:.0%} {m}")
                X, y, groups = split.X_train, labels, None
                if m == "TERM":
                    obj = TiltedLoss(
                        ce, tilts=(linear_schedule(0.0, t, steps // 2), 0.0),
                        n_groups=n_annotators,
                    )  # fmt: skip
                    groups = who
                else:
                    obj = _deep.mean_of(ce)
                    if m == "Genie ERM":
                        X, y = X[~bad], y[~bad]
                net = _deep.make_model(
                    model, X.shape[1], split.n_classes, split.image_shape, seed=seed
                )
                net = _deep.train(
                    net, X, y, obj, epochs=n_epochs, seed=seed, groups=groups, device=device
                )
                acc.setdefault((m, share), []).append(
                    _deep.accuracy(net, split.X_test, split.y_test, device)
                )
                if m == "TERM":
                    losses = training_losses(net, X, y, device=device)
                    rep = training_report(losses, who, (t, 0.0))
                    spammer = np.asarray(rep["group"]) < n_spam
                    spam_weight.setdefault(share, []).append(
                        float(np.sum(np.asarray(rep["weight"])[spammer]))
                    )
                    if seed == seeds_[0]:
                        caption = (
                            f"TERM at tilts ({t:g}, 0), spammers={share:.0%}, seed {seed}: per "
                            f"annotator ({_spammers(n_spam)})"
                        )
                        reports[caption] = rep
                bar.update(1)
    bar.close()
    rows = [
        make_row(
            m, f"spammers={share:.0%}", "accuracy", "test", acc[(m, share)],
            paper=PAPER_NOISY_ANNOTATORS.get((m, f"spammers={share:.0%}")),
        )
        for m in methods
        for share in shares
    ]  # fmt: skip
    notes = (
        "Paper: CIFAR-10, ResNet-20, 100 annotators of whom 80 label at random; it reports "
        "TERM at 0.825 and shows TERM\nreaching Genie ERM. Here: handwritten digits "
        f"(scikit-learn), a small {model.upper()} with Adam (batch 64, {n_epochs} epochs), "
        f"{n_annotators} annotators,\neach training row labelled by one of them; the test "
        f"labels are clean. TERM: annotator-level t = {t:g} (ramped from 0 over the first "
        "half of training),\nno sample-level tilt. "
        + _weight_note(spam_weight)
        + f"{len(seeds_)} seed(s), {time.perf_counter() - started:.1f} s."
    )
    return Reproduction(
        experiment="noisy-annotators",
        rows=rows,
        title=(
            f"tiltlab reproduce noisy-annotators: {len(methods)} methods, {n_annotators} "
            f"annotators, {len(seeds_)} seed(s), clean test accuracy"
        ),
        table=format_grid(rows, row_of=lambda r: r["method"], col_of=lambda r: r["setting"]),
        notes=notes,
        curves={"accuracy": acc, "shares": shares},
        plotter=_plot,
        group_reports=reports,
    )


def _spammers(n_spam: int) -> str:
    if n_spam == 0:
        return "no spammers"
    return (
        "annotator 0 labels at random"
        if n_spam == 1
        else (f"annotators 0-{n_spam - 1} label at random")
    )


def _weight_note(spam_weight: dict[float, list[float]]) -> str:
    if not spam_weight:
        return ""
    shares = ", ".join(f"{s:.0%}: {np.mean(v):.3f}" for s, v in spam_weight.items())
    return (
        "At the end of training the spammers hold this share of TERM's annotator weights "
        f"(by share of spammers, mean over seeds): {shares}.\n"
    )


def _plot(rep: Reproduction, directory: str) -> list[str]:
    return plot_accuracy_curves(
        rep,
        rep.curves["shares"],
        directory,
        xlabel="annotators labelling at random (%)",
        title="low-quality annotators",
        filename="noisy_annotators.png",
    )
