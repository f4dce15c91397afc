"""The paper's fair federated-learning table: TERM across devices against FedAvg and q-FFL.

Simulated federated training (:mod:`tiltlab.reproduce.federated`) of a multinomial
logistic model on the q-FFL "synthetic (1, 1)" data (100 devices, 60 features, 10
classes, generated locally by :func:`tiltlab.datasets.synthetic_federated`) and its iid
variant; per device, the test accuracy of the final model. Reported over devices: the
average, the mean of the worst and of the best 10%, the standard deviation and the
variance; mean and standard error over seeds (each seed draws the data and the device
sampling).

* ``FedAvg``: 10 devices per round, 20 local SGD steps of 10 samples, step 0.1;
* ``q-FFL``: q-FedAvg with the same local work, ``q = 1`` (the q-FFL paper's value for its
  synthetic data; ``q = 5`` on Vehicle, as in the TERM paper's table);
* ``AFL``: agnostic federated learning (every device, full gradients, mixture step 0.01),
  not in the TERM paper's table;
* ``TERM``: the server tilts the sampled devices' mean losses at ``t = 0.1``, the paper's
  value; without ``quick``, an extra block on the synthetic (1, 1) data sweeps ``t``
  (0.3, 1) and runs the authors' summed device loss at ``t = 0.1``.

The paper's table is on the Vehicle sensor data (23 devices, an L2-regularised linear SVM),
which tiltlab does not ship; a local copy in the LEAF JSON layout is read with
``data_dir`` and run with the same protocol, and its rows carry the paper's numbers.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

import numpy as np

from ._common import Reproduction, check_choices, format_grid, make_row, progress_bar, seed_list

__all__ = ["FAIR_FL_METHODS", "PAPER_FAIR_FL", "device_summary", "fair_federated"]

#: The federated servers compared, in the table's row order.
FAIR_FL_METHODS = ("FedAvg", "q-FFL", "AFL", "TERM")
_METRICS = ("accuracy_average", "accuracy_worst10", "accuracy_best10", "accuracy_std",
            "accuracy_variance")  # fmt: skip

#: The paper's Vehicle table: (method, metric) -> (mean, parenthesised value). The
#: parenthesised value under "average" repeats the standard deviation across devices.
PAPER_FAIR_FL: dict[tuple[str, str], tuple[float, float | None]] = {
    ("FedAvg", "accuracy_average"): (0.853, None),
    ("FedAvg", "accuracy_worst10"): (0.421, 0.016),
    ("FedAvg", "accuracy_best10"): (0.951, 0.008),
    ("FedAvg", "accuracy_std"): (0.173, 0.003),
    ("q-FFL", "accuracy_average"): (0.862, None),
    ("q-FFL", "accuracy_worst10"): (0.704, 0.033),
    ("q-FFL", "accuracy_best10"): (0.929, 0.006),
    ("q-FFL", "accuracy_std"): (0.064, 0.011),
    ("TERM", "accuracy_average"): (0.853, None),
    ("TERM", "accuracy_worst10"): (0.707, 0.021),
    ("TERM", "accuracy_best10"): (0.926, 0.006),
    ("TERM", "accuracy_std"): (0.061, 0.006),
}


def device_summary(accuracies) -> dict[str, float]:
    """Average, worst-10%, best-10%, standard deviation and variance of device accuracies.

    The worst (best) 10% is the mean over the ``max(1, round(K / 10))`` lowest (highest)
    of the ``K`` accuracies; the spread is the population standard deviation.

    Parameters
    ----------
    accuracies : array_like, shape (K,)
        The test accuracy of each device.

    Returns
    -------
    dict
        ``accuracy_average``, ``accuracy_worst10``, ``accuracy_best10``, ``accuracy_std``
        and ``accuracy_variance``.

    See Also
    --------
    :func:`~tiltlab.reproduce.fair_federated` : The table these numbers fill.

    Examples
    --------
    >>> from tiltlab.reproduce.fair_federated import device_summary
    >>> s = device_summary([0.1 * k for k in range(1, 11)])
    >>> round(s["accuracy_worst10"], 3), round(s["accuracy_best10"], 3)
    (0.1, 1.0)
    """
    a = np.sort(np.asarray(accuracies, dtype=np.float64))
    k = max(1, int(round(a.size / 10)))
    return {
        "accuracy_average": float(a.mean()),
        "accuracy_worst10": float(a[:k].mean()),
        "accuracy_best10": float(a[-k:].mean()),
        "accuracy_std": float(a.std()),
        "accuracy_variance": float(a.var()),
    }


def _servers(q: float):
    from .federated import AFL, QFFL, FedAvg, TermFL

    return {
        "FedAvg": FedAvg(lr=0.1),
        "q-FFL": QFFL(lr=0.1, q=q),
        "AFL": AFL(lr=0.1, lr_lambda=0.01),
        "TERM": TermFL(lr=0.1, t=0.1),
    }


#: The extra block on the synthetic (1, 1) data: label -> (t, device loss).
TERM_SWEEP = {
    "TERM t=0.3": (0.3, "mean"),
    "TERM t=1": (1.0, "mean"),
    "TERM summed, t=0.1": (0.1, "sum"),
}
_SWEEP_SETTING = "synthetic (1, 1), TERM sweep"


def fair_federated(
    seeds: int | Sequence[int] = 3,
    *,
    quick: bool = False,
    progress: bool = False,
    data_dir: str | None = None,
    rounds: int = 600,
    methods: Sequence[str] = FAIR_FL_METHODS,
) -> Reproduction:
    """Reproduce the fair federated-learning table on locally generated federated data.

    Parameters
    ----------
    seeds : int or sequence of int, default 3
        Seeds (each draws the data, the device sampling and the minibatches).
    quick : bool, default False
        Only the non-iid synthetic data (the iid variant is left out).
    progress : bool, default False
        Show a progress bar.
    data_dir : str, optional
        A local copy of the Vehicle data (or any federated data) in the LEAF JSON layout
        (``train/*.json``, ``test/*.json``); run too, with ``q = 5`` for q-FFL.
    rounds : int, default 600
        Communication rounds.
    methods : sequence of str
        A subset of :data:`~tiltlab.reproduce.fair_federated.FAIR_FL_METHODS`.

    Returns
    -------
    Reproduction
        Rows ``accuracy_average``, ``accuracy_worst10``, ``accuracy_best10``,
        ``accuracy_std`` and ``accuracy_variance`` (split ``test``, over devices) per
        method and data set.

    See Also
    --------
    tiltlab.reproduce.run : Runs an experiment by its command name.
    tiltlab.reproduce.federated.TermFL : The federated TERM server.

    Examples
    --------
    >>> from tiltlab.reproduce import fair_federated
    >>> rep = fair_federated(seeds=1, quick=True, rounds=5, methods=["FedAvg", "TERM"])
    >>> sorted({r["method"] for r in rep.rows})
    ['FedAvg', 'TERM']
    """
    from ..datasets import load_leaf_federated, synthetic_federated
    from .federated import TermFL, device_accuracies

    seeds_ = seed_list(seeds)
    methods = check_choices(methods, FAIR_FL_METHODS, "methods")
    if isinstance(rounds, bool) or int(rounds) != rounds or rounds < 1:
        raise ValueError(f"`rounds` must be a positive integer, got {rounds!r}")
    local = load_leaf_federated(data_dir) if data_dir is not None else None
    settings: list[tuple[str, object]] = [("synthetic (1, 1)", dict(iid=False))]
    if not quick:
        settings.append(("synthetic iid", dict(iid=True)))
    if local is not None:
        settings.append((local.name, local))
    sweep = not quick and "TERM" in methods
    runs = len(settings) * len(methods) + (len(TERM_SWEEP) if sweep else 0)
    bar = progress_bar(progress, runs * len(seeds_), "fair-federated")
    started = time.perf_counter()
    values: dict[tuple[str, str, str], list[float]] = {}
    curves: dict[str, dict] = {}
    for setting, source in settings:
        is_local = not isinstance(source, dict)
        servers = _servers(q=5.0 if is_local else 1.0)
        for s in seeds_:
            data = source if is_local else synthetic_federated(seed=s, **source)
            for m in methods:
                bar.set_postfix_str(f"{setting} seed={s} {m}")
                W = servers[m].run(data, int(rounds), np.random.default_rng([s, 7]))
                acc = device_accuracies(W, data.X_test, data.y_test)
                for metric, v in device_summary(acc).items():
                    values.setdefault((m, setting, metric), []).append(v)
                if s == seeds_[0]:
                    curves.setdefault(setting, {})[m] = acc
                bar.update(1)
            if setting == "synthetic (1, 1)" and sweep:
                for label, (t, loss) in TERM_SWEEP.items():
                    bar.set_postfix_str(f"{setting} seed={s} {label}")
                    server = TermFL(lr=0.1, t=t, device_loss=loss)
                    W = server.run(data, int(rounds), np.random.default_rng([s, 7]))
                    acc = device_accuracies(W, data.X_test, data.y_test)
                    for metric, v in device_summary(acc).items():
                        values.setdefault((label, _SWEEP_SETTING, metric), []).append(v)
                    bar.update(1)
    bar.close()

    def paper(m: str, setting: str, metric: str):
        if local is not None and setting == local.name and "vehicle" in setting.lower():
            return PAPER_FAIR_FL.get((m, metric))
        return None

    rows = [
        make_row(
            m, setting, metric, "test", values[(m, setting, metric)], paper(m, setting, metric)
        )
        for setting, _ in settings
        for m in methods
        for metric in _METRICS
    ]
    if sweep:
        rows += [
            make_row(m, _SWEEP_SETTING, metric, "test", values[(m, _SWEEP_SETTING, metric)])
            for m in TERM_SWEEP
            for metric in _METRICS
        ]
    seconds = time.perf_counter() - started
    table = format_grid(
        rows,
        row_of=lambda r: r["method"],
        col_of=lambda r: r["metric"].removeprefix("accuracy_"),
        block_of=lambda r: f"{r['setting']}: test accuracy across devices",
    )
    lines = ["", "paper, Vehicle (23 devices, linear SVM; for direction only):"]
    for m in ("FedAvg", "q-FFL", "TERM"):
        cells = ", ".join(
            f"{metric.removeprefix('accuracy_')} {PAPER_FAIR_FL[(m, metric)][0]:.3f}"
            for metric in _METRICS
            if (m, metric) in PAPER_FAIR_FL
        )
        label = {"q-FFL": "q-FFL (q=5)", "TERM": "TERM (t=0.1)"}.get(m, m)
        lines.append(f"  {label:<13} {cells}")
    table += "\n".join(lines)
    notes = _notes(rounds, len(seeds_), seconds)
    return Reproduction(
        experiment="fair-federated",
        rows=rows,
        title=(
            f"tiltlab reproduce fair-federated: TERM across devices against FedAvg, q-FFL "
            f"and AFL, {len(seeds_)} seed(s)\ndevice test accuracy: average, worst/best 10%, "
            "spread; mean (se) over seeds"
        ),
        table=table,
        notes=notes,
        curves=curves,
        plotter=_plot,
    )


def _notes(rounds: int, n_seeds: int, seconds: float) -> str:
    """The protocol and the differences from the paper, printed under the table."""
    notes = (
        "Protocol: multinomial logistic model from zero; FedAvg, q-FFL and TERM sample 10 "
        "devices per round uniformly and run 20 local\nSGD steps (batch 10, step 0.1); AFL "
        f"uses every device's full gradient each round; {rounds} rounds; per-device test "
        "splits of 10%.\nDifferences from the paper: its table is on Vehicle (23 sensors, "
        "L2-regularised linear SVM, 30 rounds), which tiltlab does not\nship (pass a local "
        "copy in the LEAF JSON layout with --data-dir; it then runs with q = 5 and these "
        "rows carry the paper's\nnumbers). On the synthetic data the paper's numbers are "
        "printed for direction only.\nDevices are sampled uniformly (q-FFL's code samples by "
        "size; with the log-normal sizes of this data the small\ndevices are then almost "
        "never seen).\nTERM's server follows the authors' tilting.py: each sampled "
        "device's training loss F_k at the global model, weights\nexp(t (F_k - max F)) over "
        "m times a running mean (factor 1/2) of their round means. Two deliberate "
        "differences, so that\nTERM at t = 0 is FedAvg exactly: no extra 1/m on the "
        "aggregated update (the authors' t = 0 is FedAvg with an m times smaller\nserver "
        "step), and the normaliser starts at the first round's value, not 0. Which loss is "
        "tilted matters most: the authors\ntilt each device's summed hinge loss (a Vehicle "
        "device holds many samples), so at t = 0.1 exponents can differ by tens and the\n"
        "step is nearly the update of the sampled device with the largest summed loss. "
        "Here the headline TERM tilts mean\ncross-entropies (a few nats apart at most), "
        "so t = 0.1 changes the weights by tens of percent at most and the gain is within\n"
        "the noise. In the sweep block (full run only) t = 0.3 gains more with the average "
        "held; t = 1 is unstable across seeds. The authors' "
        "summed loss at t = 0.1 (sweep block) fails on\nthis data: its log-normal sizes "
        "(about 45 to thousands of training samples) make the summed loss rank\ndevices by "
        "size, so each step follows one large device and the small, worst-served devices "
        "are ignored.\n"
        "AFL is not in the TERM paper's table.\nq-FFL's server step is damped by its "
        "Lipschitz estimate (sum_k q F_k^(q-1) |Delta_k|^2 + L F_k^q): in these rounds it "
        "has not caught up with FedAvg\n(the q-FFL paper ran 20,000 rounds on this data).\n"
        f"{n_seeds} seed(s), {seconds:.1f} s."
    )
    return notes


def _plot(rep: Reproduction, directory: str) -> list[str]:
    """Per data set: each method's distribution of device test accuracies (first seed)."""
    import matplotlib.pyplot as plt

    paths = []
    for setting, by_method in rep.curves.items():
        fig, ax = plt.subplots(figsize=(6, 4))
        bins = np.linspace(0, 1, 21)
        for m, acc in by_method.items():
            ax.hist(acc, bins=bins, histtype="step", lw=2, label=f"{m} (worst 10%: "
                    f"{device_summary(acc)['accuracy_worst10']:.2f})")  # fmt: skip
        ax.set_xlabel("device test accuracy")
        ax.set_ylabel("number of devices")
        ax.set_title(f"{setting}: accuracy across devices")
        ax.legend(fontsize=8)
        fig.tight_layout()
        name = "".join(c if c.isalnum() else "_" for c in setting).strip("_")
        path = os.path.join(directory, f"fair_federated_{name}.png")
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)
    return paths
