"""The paper's robust classification with noisy labels, in miniature.

The paper trains an Inception network on CIFAR-10 whose training labels are partly
replaced by uniform noise (20%, 40%, 80%) and compares TERM (sample level, the tilt
ramped linearly from 0 to -2 over the iterations) with ERM and robust losses. Here the
same protocol runs on data that ship offline, scikit-learn's handwritten digits, with a
small PyTorch network (an MLP by default, ``model="cnn"`` for a small CNN) trained with
Adam on minibatches; ``data_dir`` runs it on the real CIFAR-10 python batches instead.
Training and validation labels are noisy (no clean data is used for any choice); the
test labels are clean.

Methods (per-sample cross-entropy unless said otherwise):

* ``ERM``: the batch mean;
* ``GCE``: generalized cross-entropy, ``q`` chosen from {0.4, 0.8, 1.0} by the (noisy)
  validation accuracy, as in the paper;
* ``SCE``: symmetric cross-entropy (alpha = 0.1, beta = 1, log 0 = -4);
* ``FocalLoss``: gamma = 2;
* ``TERM``: :class:`tiltlab.torch.TiltedLoss` with the paper's schedule
  ``linear_schedule(0, -2, n_steps)`` (a constant t = -2 from the first step can
  collapse the network: see :class:`~tiltlab.torch.TiltedLoss`);
* ``Genie ERM``: ERM on the rows whose labels were not replaced (an oracle);
* ``TERM-ESS`` (on request, not in the default list): the tilt chosen on each batch so
  that the batch's tilted weights keep an effective sample size of ``ess`` times the
  batch (:func:`tiltlab.tilt_for_ess`), the share ramped linearly from 1 to ``ess``.

After training, the TERM network's per-sample losses on its (noisy) training labels are
reported per class and for the replaced against the kept labels
(:func:`tiltlab.diagnostics.group_report` at the final tilt ``(-2, -2)``: the sample-level
tilt seen per group), for the first seed, with the effective sample size of all the
tilted weights.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import _deep
from ._common import Reproduction, check_choices, format_grid, make_row, progress_bar, seed_list
from ._deep_report import training_losses, training_report
from ._figures import plot_accuracy_curves

__all__ = ["ESS_TARGET", "GCE_QS", "METHODS", "NOISE", "PAPER_LABEL_NOISE", "label_noise"]

#: Shares of the training labels replaced by uniform noise.
NOISE = (0.2, 0.4, 0.8)
#: The methods compared by default, in the table's row order.
METHODS = ("ERM", "GCE", "SCE", "FocalLoss", "TERM", "Genie ERM")
#: Every method that can be asked for (``TERM-ESS`` only on request).
ALL_METHODS = (*METHODS, "TERM-ESS")
#: The effective sample size share of each batch that ``TERM-ESS`` keeps by default.
ESS_TARGET = 0.5
#: TERM's final tilt (the end of the paper's ramp).
T_FINAL = -2.0
#: The exponents ``q`` tried for the generalized cross-entropy.
GCE_QS = (0.4, 0.8, 1.0)
#: Training epochs of the full run.
EPOCHS = 80
#: Training epochs with ``quick=True``.
EPOCHS_QUICK = 40

#: The paper's CIFAR-10 table (Inception): (method, setting) -> (mean, se) test accuracy.
PAPER_LABEL_NOISE: dict[tuple[str, str], tuple[float, float]] = {
    (m, f"noise={p:g}"): v
    for m, vals in {
        "ERM": ((0.775, 0.004), (0.719, 0.004), (0.284, 0.004)),
        "GCE": ((0.805, 0.004), (0.750, 0.004), (0.433, 0.005)),
        "TERM": ((0.795, 0.004), (0.768, 0.004), (0.455, 0.005)),
        "Genie ERM": ((0.828, 0.004), (0.820, 0.004), (0.792, 0.004)),
    }.items()
    for p, v in zip(NOISE, vals, strict=True)
}


def _data(seed: int, data_dir: str | None) -> _deep.Split:
    if data_dir is None:
        return _deep.digits_split(seed)
    from ..datasets.cifar import load_cifar10

    d = load_cifar10(data_dir)
    rng = np.random.default_rng(seed)
    order = rng.permutation(d["y_train"].size)
    n_val = max(1, order.size // 10)
    va, tr = order[:n_val], order[n_val:]
    return _deep.Split(
        d["X_train"][tr], d["y_train"][tr], d["X_train"][va], d["y_train"][va],
        d["X_test"], d["y_test"], (3, 32, 32), 10,
    )  # fmt: skip


def _fit(split, y_train, objective, *, model, epochs, seed, device, rows=None, extra=()):
    X = split.X_train if rows is None else split.X_train[rows]
    y = y_train if rows is None else y_train[rows]
    net = _deep.make_model(model, X.shape[1], split.n_classes, split.image_shape, seed=seed)
    return _deep.train(
        net, X, y, objective, epochs=epochs, seed=seed, device=device, extra_parameters=extra
    )


def _objective(method: str, ce: Any, steps: int, ess: float) -> Any:
    """The training objective of one method (GCE apart: it is fitted for several q)."""
    from ..minibatch import linear_schedule
    from ..torch import TiltedLoss

    if method == "SCE":
        return _deep.mean_of(_deep.symmetric_cross_entropy())
    if method == "FocalLoss":
        return _deep.mean_of(_deep.focal_loss(2.0))
    if method == "TERM":
        return TiltedLoss(ce, t=linear_schedule(0.0, T_FINAL, steps))
    if method == "TERM-ESS":
        return _RecordedTilts(TiltedLoss(ce, ess=linear_schedule(1.0, ess, steps)))
    return _deep.mean_of(ce)  # ERM, and Genie ERM on the kept rows


class _RecordedTilts:
    """A :class:`~tiltlab.torch.TiltedLoss` that records the tilt of each training call
    (its ``t`` after the call: with ``ess=`` the tilt solved for that batch), for the
    report's note on TERM-ESS."""

    def __init__(self, loss: Any):
        self.loss = loss
        self.tilts: list[float] = []

    def to(self, device: Any) -> _RecordedTilts:
        self.loss.to(device)
        return self

    def __call__(self, logits: Any, target: Any, groups: Any = None) -> Any:
        value = self.loss(logits, target)
        self.tilts.append(float(self.loss.t))
        return value


class _Reports:
    """TERM's per-group reports (first seed) and the effective sample sizes (all seeds)."""

    def __init__(self, first_seed: int):
        self.first_seed = first_seed
        self.reports: dict[str, dict] = {}
        self.ess_all: dict[float, list[float]] = {}
        self.ess_tilts: dict[float, list[list[float]]] = {}

    def add(self, seed: int, p: float, losses: np.ndarray, y: np.ndarray, replaced: np.ndarray):
        tilts = (T_FINAL, T_FINAL)
        by_class = training_report(losses, y, tilts)
        self.ess_all.setdefault(p, []).append(by_class["ess_all"])
        if seed != self.first_seed:
            return
        where = f"TERM at t = {T_FINAL:g}, noise={p:g}, seed {seed}"
        self.reports[f"{where}: per class (training labels)"] = by_class
        kind = np.where(replaced, "replaced", "kept")
        self.reports[f"{where}: replaced and kept labels"] = training_report(losses, kind, tilts)

    def notes(self, ess: float) -> str:
        out = ""
        if self.ess_all:
            shares = ", ".join(f"{p:g}: {np.mean(v):.2f}" for p, v in self.ess_all.items())
            out += (
                f"At the end of training, TERM's weights at t = {T_FINAL:g} keep an effective "
                f"sample size of (by noise level, mean over seeds) {shares} of the data.\n"
            )
        if self.ess_tilts:
            ts = ", ".join(
                f"{p:g}: {np.mean([np.mean(v) for v in runs]):.2f}"
                for p, runs in self.ess_tilts.items()
            )
            out += (
                f"TERM-ESS keeps {ess:g} of each batch; its tilt over the second half of "
                f"training averaged (by noise level) {ts}.\n"
            )
        return out


def label_noise(
    seeds: int | Sequence[int] = 5,
    *,
    quick: bool = False,
    progress: bool = False,
    noise: Sequence[float] = NOISE,
    methods: Sequence[str] = METHODS,
    model: str = "mlp",
    device: str = "cpu",
    data_dir: str | None = None,
    epochs: int | None = None,
    ess: float = ESS_TARGET,
) -> Reproduction:
    """Clean test accuracy of ERM, GCE, SCE, focal loss, TERM and Genie ERM under label noise.

    Parameters
    ----------
    seeds : int or sequence of int, default 5
        Number of seeds (``0 .. seeds-1``: split, noise and initialisation), or the seeds.
    quick : bool, default False
        Fewer epochs (40 instead of 80).
    progress : bool, default False
        Show a progress bar.
    noise : sequence of float, default (0.2, 0.4, 0.8)
        Shares of training (and validation) labels replaced at random.
    methods : sequence of str, default all of :data:`~tiltlab.reproduce.label_noise.METHODS`
        The methods to train and compare (``"TERM-ESS"`` too, on request).
    model : {"mlp", "cnn"}, default "mlp"
    device : str, default "cpu"
        ``"cuda"`` to train on a GPU.
    data_dir : str, optional
        A folder with the CIFAR-10 python batches (:func:`tiltlab.datasets.load_cifar10`);
        default: the handwritten digits shipped with scikit-learn.
    epochs : int, optional
        Override the number of epochs.
    ess : float, default :data:`ESS_TARGET`
        ``TERM-ESS``'s effective sample size share of each batch, in ``(0, 1]``.

    Returns
    -------
    Reproduction
        Rows ``(method, "noise=p", "accuracy", "test")``, the paper's CIFAR-10 numbers
        beside where it has them, and the per-group reports of TERM (``group_reports``).

    See Also
    --------
    tiltlab.reproduce.run : Runs an experiment by its command name.
    :func:`~tiltlab.reproduce.noisy_annotators` : Deep learning with unreliable annotators.
    :func:`~tiltlab.reproduce.class_imbalance` : Deep learning with a rare class.

    Examples
    --------
    >>> from tiltlab.reproduce import label_noise
    >>> rep = label_noise(seeds=1, noise=[0.8], methods=["ERM", "TERM"], epochs=2)
    >>> [(r["method"], r["setting"], r["paper_mean"]) for r in rep.rows]
    [('ERM', 'noise=0.8', 0.284), ('TERM', 'noise=0.8', 0.455)]
    """
    import torch

    device = _deep.check_device(device)
    methods = check_choices(methods, ALL_METHODS, "methods")
    if not 0.0 < ess <= 1.0:
        raise ValueError(f"`ess` must be a share in (0, 1], got {ess!r}")
    levels = [float(p) for p in noise]
    if not levels or any(not 0.0 <= p < 1.0 for p in levels):
        raise ValueError(f"`noise` must be shares in [0, 1), got {noise!r}")
    seeds_ = seed_list(seeds)
    n_epochs = int(epochs) if epochs is not None else (EPOCHS_QUICK if quick else EPOCHS)
    started = time.perf_counter()
    acc: dict[tuple[str, float], list[float]] = {}
    chosen_q: dict[float, list[float]] = {}
    n_fits = sum(len(GCE_QS) if m == "GCE" else 1 for m in methods)
    bar = progress_bar(progress, len(seeds_) * len(levels) * n_fits, "label-noise")
    ce = torch.nn.CrossEntropyLoss(reduction="none")
    reports = _Reports(first_seed=seeds_[0])
    for seed in seeds_:
        split = _data(seed, data_dir)
        for p in levels:
            rng = np.random.default_rng([seed, int(round(1000 * p))])
            y_tr, replaced = _deep.uniform_label_noise(split.y_train, p, split.n_classes, rng)
            y_va, _ = _deep.uniform_label_noise(split.y_val, p, split.n_classes, rng)
            steps = n_epochs * -(-y_tr.size // 64)
            fit_args = {"model": model, "epochs": n_epochs, "seed": seed, "device": device}
            for m in methods:
                bar.set_postfix_str(f"seed={seed} noise={p:g} {m}")
                if m == "GCE":
                    best = None
                    for q in GCE_QS:
                        obj = _deep.mean_of(_deep.generalized_cross_entropy(q))
                        net = _fit(split, y_tr, obj, **fit_args)
                        val = _deep.accuracy(net, split.X_val, y_va, device)
                        if best is None or val > best[0]:
                            best = (val, q, net)
                        bar.update(1)
                    assert best is not None
                    chosen_q.setdefault(p, []).append(best[1])
                    net = best[2]
                else:
                    obj = _objective(m, ce, steps, ess)
                    rows = np.flatnonzero(~replaced) if m == "Genie ERM" else None
                    net = _fit(split, y_tr, obj, rows=rows, **fit_args)
                    bar.update(1)
                    if m == "TERM":
                        losses = training_losses(net, split.X_train, y_tr, device=device)
                        reports.add(seed, p, losses, y_tr, replaced)
                    elif m == "TERM-ESS":
                        reports.ess_tilts.setdefault(p, []).append(obj.tilts[-(steps // 2) :])
                acc.setdefault((m, p), []).append(
                    _deep.accuracy(net, split.X_test, split.y_test, device)
                )
    bar.close()
    rows_out = [
        make_row(
            m, f"noise={p:g}", "accuracy", "test", acc[(m, p)],
            paper=PAPER_LABEL_NOISE.get((m, f"noise={p:g}")),
        )
        for m in methods
        for p in levels
    ]  # fmt: skip
    data_name = "CIFAR-10 (local batches)" if data_dir else "handwritten digits (scikit-learn)"
    qs = ", ".join(f"{p:g}: {sorted(set(v))}" for p, v in chosen_q.items())
    notes = (
        "Paper: CIFAR-10 with an Inception network (its numbers in brackets, for the direction "
        "of the effect);\nhere: "
        f"{data_name}, a small {model.upper()} trained with Adam (batch 64, {n_epochs} epochs), "
        "noisy training and validation labels, clean test labels.\n"
        "TERM ramps t linearly from 0 to -2 over the iterations (the paper's recipe). "
        "SCE and focal loss are not in the paper's table.\n"
        + (f"GCE's q chosen on the noisy validation split, by noise level: {qs}.\n" if qs else "")
        + reports.notes(ess)
        + f"{len(seeds_)} seed(s), {time.perf_counter() - started:.1f} s."
    )
    return Reproduction(
        experiment="label-noise",
        rows=rows_out,
        title=(
            f"tiltlab reproduce label-noise: {len(methods)} methods x {len(levels)} noise "
            f"levels, {len(seeds_)} seed(s), clean test accuracy"
        ),
        table=format_grid(rows_out, row_of=lambda r: r["method"], col_of=lambda r: r["setting"]),
        notes=notes,
        curves={"accuracy": acc, "noise": levels},
        plotter=_plot,
        group_reports=reports.reports,
    )


def _plot(rep: Reproduction, directory: str) -> list[str]:
    return plot_accuracy_curves(
        rep,
        rep.curves["noise"],
        directory,
        xlabel="labels replaced at random (%)",
        title="label noise",
        filename="label_noise.png",
    )
