"""The ``tiltlab`` console command.

``tiltlab demo``
    The paper's 2-D point-estimation toy with outliers: for a grid of tilts, the tilted
    solution and its tilted risk, min, mean and max loss and the effective sample size.
``tiltlab reproduce EXPERIMENT [--seeds K] [--json PATH] [--plot DIR] [--no-progress] [--quick]``
    One of the paper's experiments on the shipped data, printed beside the published
    numbers: ``robust-regression`` (Table 1, the main job; also ``--noise``,
    ``--methods``, ``--jobs``), ``hiv1-fairness``, ``hierarchical``, ``abalone``, ``toys``,
    ``convergence``, ``fair-pca``, ``fair-federated`` (both also ``--data-dir``). ``--json`` writes
    ``{"experiment", "rows": [{"method", "setting", "metric", "split", "mean", "se",
    "n_seeds", "paper_mean", "paper_se"}]}`` (null where a number is missing); ``--plot``
    writes the paper's figures as PNG (needs matplotlib).
``tiltlab --version``
    Print the installed version and exit.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import numpy as np

__all__ = ["main", "demo_point_estimation"]

DEMO_TILTS = (-np.inf, -10.0, -2.0, -0.5, 0.0, 0.5, 2.0, 10.0, np.inf)


def demo_point_estimation(
    tilts: Sequence[float] = DEMO_TILTS,
    *,
    n: int = 100,
    outlier_fraction: float = 0.2,
    seed: int = 0,
) -> list[dict]:
    """Solve the 2-D point-estimation toy over a grid of tilts.

    The per-sample loss of a point estimate ``theta`` is ``||x_i - theta||^2``. Finite
    tilts are solved with :func:`tiltlab.tilt_path` (Newton, continuation from ``t = 0``
    outwards); ``t = +inf`` is the min-max point (the centre of the smallest enclosing
    ball, a convex problem solved by SciPy) and ``t = -inf`` the sample nearest the most
    negative finite solution (where continuation ends).

    Parameters
    ----------
    tilts : sequence of float, optional
        The tilts (default: nine from ``-inf`` to ``inf``).
    n : int, default 100
        Number of points.
    outlier_fraction : float, default 0.2
        Share of the points in the outlier cluster.
    seed : int, default 0
        Seed of the data.

    Returns
    -------
    list of dict
        One row per tilt with keys ``t, theta, tilted_risk, min, mean, max, ess``
        (``ess``: the effective sample size of the tilted weights).

    See Also
    --------
    tiltlab.datasets.point_estimation_2d : The data.
    tiltlab.tilt_path : The solver of the finite tilts.

    Examples
    --------
    >>> from tiltlab.cli import demo_point_estimation
    >>> rows = demo_point_estimation([-2.0, 0.0, 2.0], n=40)
    >>> [row["t"] for row in rows]
    [-2.0, 0.0, 2.0]
    >>> bool(rows[0]["mean"] <= rows[2]["mean"] or rows[0]["max"] >= rows[2]["max"])
    True
    """
    from scipy.optimize import minimize as scipy_minimize

    from .datasets import point_estimation_2d, point_estimation_objective
    from .diagnostics import effective_sample_size
    from .risk import tilted_risk, tilted_weights
    from .solvers import tilt_path

    points, _ = point_estimation_2d(n=n, outlier_fraction=outlier_fraction, seed=seed)
    objective = point_estimation_objective(points)
    start = points.mean(axis=0)
    finite = [float(t) for t in tilts if np.isfinite(t)]
    thetas: dict[float, np.ndarray] = {}
    if finite:
        path = tilt_path(objective, finite, method="newton", tol=1e-10, theta0=start)
        thetas.update({t: np.asarray(x) for t, x in zip(finite, path.x, strict=True)})
    for t in (float(t) for t in tilts if not np.isfinite(t)):
        if t > 0:  # minimise the maximum loss: smallest enclosing ball (convex)
            res = scipy_minimize(
                lambda th: float(np.max(objective.losses(th))),
                start,
                method="Nelder-Mead",
                options={"xatol": 1e-10, "fatol": 1e-12, "maxiter": 20000},
            )
            thetas[t] = res.x
        else:  # minimise the minimum loss: the sample nearest the most negative solution
            neg = [thetas[k] for k in sorted(thetas) if k < 0] or [start]
            thetas[t] = points[int(np.argmin(objective.losses(neg[0])))].copy()
    out = []
    for t in (float(t) for t in tilts):
        ell = np.asarray(objective.losses(thetas[t]))
        out.append(
            {
                "t": t,
                "theta": thetas[t],
                "tilted_risk": float(tilted_risk(ell, t)),
                "min": float(ell.min()),
                "mean": float(ell.mean()),
                "max": float(ell.max()),
                "ess": float(effective_sample_size(tilted_weights(ell, t))),
            }
        )
    return out


def _cmd_demo(args: argparse.Namespace) -> int:
    rows = demo_point_estimation(n=args.n, outlier_fraction=args.outliers, seed=args.seed)
    print(
        "tiltlab demo: 2-D point estimation, inliers around (1, 1), "
        f"{args.outliers:.0%} outliers, n = {args.n}, seed = {args.seed}"
    )
    print("per-sample loss ||x_i - theta||^2; theta(t) minimises the t-tilted risk\n")
    header = f"{'t':>8} {'theta':>18} {'R(t)':>10} {'min':>9} {'mean':>9} {'max':>9} {'ESS':>7}"
    print(header)
    print("-" * len(header))
    for r in rows:
        th = f"({r['theta'][0]:6.3f}, {r['theta'][1]:6.3f})"
        print(
            f"{r['t']:>8g} {th:>18} {r['tilted_risk']:>10.4f} {r['min']:>9.4f} "
            f"{r['mean']:>9.4f} {r['max']:>9.4f} {r['ess']:>7.1f}"
        )
    print(
        "\nNegative tilts suppress the outliers (theta moves to (1, 1), the ESS shrinks to "
        "the inliers);\npositive tilts pull theta towards the min-max point."
    )
    return 0


def _cmd_reproduce(args: argparse.Namespace) -> int:
    from .reproduce import run

    options = {}
    if args.experiment == "robust-regression":
        options = {"noise": args.noise, "jobs": args.jobs}
        if args.methods:
            options["methods"] = args.methods
    if args.experiment in _DEEP:
        options = {"device": args.device, "model": args.model}
    if args.experiment == "lm-noisy-targets":
        options = {"device": args.device}
    if getattr(args, "data_dir", None):
        options["data_dir"] = args.data_dir
    rep = run(
        args.experiment,
        seeds=args.seeds,
        quick=args.quick,
        progress=not args.no_progress,
        **options,
    )
    print(rep.report(), flush=True)
    if args.json is not None:
        from .reproduce import write_json

        write_json(rep.to_dict(), args.json)
        print(f"wrote {args.json}")
    if args.plot:
        paths = rep.plot(args.plot)
        if paths:
            print("figures: " + ", ".join(paths))
        else:
            print("(the paper has no figure for this experiment: --plot wrote nothing)")
    return 0


# --------------------------------------------------------------------------- argument types


def _int_at_least(minimum: int, what: str):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} must be an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{what} must be at least {minimum}, got {value}")
        return value

    return parse


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must lie in [0, 1), got {text}")
    return value


def _check_outputs(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Fail before any work when an output cannot be written."""
    import os

    path = getattr(args, "json", None)
    if path is not None:
        if not path.strip():
            parser.error("--json: the path is empty; give a file name")
        folder = os.path.dirname(os.path.abspath(path))
        if os.path.isdir(path):
            parser.error(f"--json {path}: is a folder, give a file name")
        if not os.path.isdir(folder):
            parser.error(f"--json {path}: folder {folder} does not exist")
        # try the write itself: permission bits do not tell (root, read-only mounts)
        existed = os.path.exists(path)
        try:
            with open(path, "a", encoding="utf-8"):
                pass
        except OSError as exc:
            parser.error(f"--json {path}: cannot be written ({exc.strerror or exc})")
        if not existed:
            os.remove(path)
    data_dir = getattr(args, "data_dir", None)
    if data_dir and not os.path.isdir(data_dir):
        parser.error(f"--data-dir {data_dir}: not a folder")
    if data_dir:
        _check_data_dir(parser, args.experiment, data_dir)
    if getattr(args, "experiment", None) in (*_DEEP, "lm-noisy-targets"):
        _check_device(parser, args.device)
    plot = getattr(args, "plot", None)
    if plot:
        if os.path.exists(plot) and not os.path.isdir(plot):
            parser.error(f"--plot {plot}: exists and is not a folder")
        if getattr(args, "experiment", None) in _HAS_FIGURES:
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                parser.error("--plot needs matplotlib: pip install matplotlib")
        try:
            os.makedirs(plot, exist_ok=True)
        except OSError as exc:
            parser.error(f"--plot {plot}: cannot create the folder ({exc})")
        if not os.access(plot, os.W_OK):
            parser.error(f"--plot {plot}: folder is not writable")


def _data_loader(experiment: str):
    """The function that reads ``--data-dir`` for ``experiment`` (what its run calls)."""
    if experiment == "label-noise":
        from .datasets import load_cifar10

        return load_cifar10
    if experiment == "fair-pca":
        from .datasets import load_csv_groups

        return load_csv_groups
    if experiment == "fair-federated":
        from .datasets import load_leaf_federated

        return load_leaf_federated
    raise AssertionError(f"--data-dir is not an option of {experiment}")  # pragma: no cover


def _check_data_dir(parser: argparse.ArgumentParser, experiment: str, data_dir: str) -> None:
    """Read ``--data-dir`` once before any work: a folder without the expected files (or
    with unreadable ones) is a usage error naming the option, not a traceback."""
    import pickle

    try:
        _data_loader(experiment)(data_dir)
    except (OSError, ValueError, TypeError, EOFError, pickle.UnpicklingError) as exc:
        message = str(exc).removeprefix("`data_dir` ")
        for name in (repr(data_dir), data_dir):  # the loaders name the folder: once is enough
            if message.startswith(name + ": ") or message.startswith(name + " "):
                message = message[len(name) :].lstrip(": ")
        parser.error(f"--data-dir {data_dir}: {message}")


def _check_device(parser: argparse.ArgumentParser, device: str) -> None:
    """``--device`` of the deep reproductions: PyTorch installed and the device usable."""
    try:
        from .reproduce.deep import check_device

        check_device(device)
    except ImportError as exc:
        parser.error(str(exc))
    except ValueError as exc:
        parser.error(f"--device {device}: " + str(exc).split(": ", 1)[-1])


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("tiltlab")
    except Exception:  # not installed (running from a checkout)
        from . import __version__

        return __version__


_EXPERIMENT_HELP = {
    "robust-regression": "Table 1: robust regression on Drug Discovery (the main job)",
    "hiv1-fairness": "class-level TERM on HIV-1: fairness (t=50) and generalisation (t=0.1)",
    "hierarchical": "hierarchical TERM on HIV-1 with label noise and class imbalance",
    "abalone": "appendix: feature-and-target noise on abalone",
    "toys": "figure 1's toy problems and the average vs max/min-loss trade-offs",
    "convergence": "appendix: convergence with t and the stochastic solver's correctness",
    "label-noise": "deep, in miniature: uniform label noise (ERM, GCE, SCE, focal, TERM)",
    "noisy-annotators": "deep, in miniature: 100 annotators, most of them spammers",
    "class-imbalance": "deep, in miniature: a rare class (ERM, focal, class weights, TERM)",
    "fair-pca": "TERM-PCA: each group's reconstruction loss against t, with PCA and the SDP",
    "fair-federated": "fair federated learning: TERM across devices against FedAvg, q-FFL, AFL",
    "lm-noisy-targets": "a small causal language model on corrupted target sequences (DFT, TERM)",
}

# experiments that read an optional local copy of data tiltlab does not ship
_DATA_DIR_HELP = {
    "fair-pca": "a folder of CSV files, one group per file (e.g. the Default Credit groups)",
    "fair-federated": "a local copy of federated data (e.g. Vehicle) in the LEAF JSON layout",
    "label-noise": "the CIFAR-10 python batches (never downloaded; default: the handwritten "
    "digits shipped with scikit-learn)",
}

_DEFAULT_SEEDS = {
    "toys": 1, "convergence": 3, "fair-pca": 3, "fair-federated": 3, "lm-noisy-targets": 3,
}  # fmt: skip
# the paper shows the others as tables
_HAS_FIGURES = (
    "toys", "convergence", "fair-pca", "fair-federated",
    "label-noise", "noisy-annotators", "class-imbalance",
)  # fmt: skip
# the deep-learning reproductions (PyTorch): device and network options
_DEEP = ("label-noise", "noisy-annotators", "class-imbalance")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``tiltlab`` command (``demo`` and ``reproduce``).

    Returns
    -------
    argparse.ArgumentParser
        The parser; each sub-command stores its handler as ``func``.

    See Also
    --------
    main : Parses the arguments and runs the command.

    Examples
    --------
    >>> from tiltlab.cli import build_parser
    >>> args = build_parser().parse_args(["demo", "--n", "50"])
    >>> args.command, args.n
    ('demo', 50)
    """
    parser = argparse.ArgumentParser(
        prog="tiltlab", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="the 2-D point-estimation toy over a grid of tilts")
    demo.add_argument(
        "--n", type=_int_at_least(5, "--n"), default=100, help="number of points (default 100)"
    )
    demo.add_argument(
        "--outliers", type=_fraction, default=0.2, help="outlier fraction in [0, 1) (default 0.2)"
    )
    demo.add_argument(
        "--seed", type=_int_at_least(0, "--seed"), default=0, help="random seed (default 0)"
    )
    demo.set_defaults(func=_cmd_demo, parser=demo)
    rep = sub.add_parser("reproduce", help="reproduce a table or figure of the TERM paper")
    experiments = rep.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")
    for name, text in _EXPERIMENT_HELP.items():
        exp = experiments.add_parser(name, help=text, description=text)
        seeds = _DEFAULT_SEEDS.get(name, 5)
        exp.add_argument(
            "--seeds",
            type=_int_at_least(1, "--seeds"),
            default=seeds,
            help=f"number of seeds (default {seeds})",
        )
        exp.add_argument("--json", default=None, help="write the rows to this JSON file")
        exp.add_argument("--plot", default=None, metavar="DIR", help="write PNG figures here")
        exp.add_argument("--no-progress", action="store_true", help="no progress bar")
        exp.add_argument(
            "--quick", action="store_true", help="a reduced grid (for CI and a first look)"
        )
        if name == "robust-regression":
            from .reproduce import ROBUST_METHODS

            exp.add_argument(
                "--noise",
                type=_fraction,
                nargs="+",
                default=[0.2, 0.4, 0.8],
                help="noise fractions in [0, 1) (default 0.2 0.4 0.8)",
            )
            exp.add_argument(
                "--jobs",
                type=_int_at_least(1, "--jobs"),
                default=None,
                help="worker processes, one BLAS thread each (default: one per CPU)",
            )
            exp.add_argument(
                "--methods",
                nargs="+",
                default=None,
                choices=list(ROBUST_METHODS),
                metavar="METHOD",
                help="subset of: " + ", ".join(repr(m) for m in ROBUST_METHODS),
            )
        if name in _DEEP or name == "lm-noisy-targets":
            exp.add_argument(
                "--device", default="cpu", help="PyTorch device: cpu (default) or cuda[:N]"
            )
        if name in _DEEP:
            exp.add_argument(
                "--model", default="mlp", choices=["mlp", "cnn"], help="network (default mlp)"
            )
        if name in _DATA_DIR_HELP:
            exp.add_argument("--data-dir", default=None, metavar="DIR", help=_DATA_DIR_HELP[name])
        exp.set_defaults(func=_cmd_reproduce, parser=exp)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tiltlab`` command: ``tiltlab demo`` and ``tiltlab reproduce``.

    Parameters
    ----------
    argv : sequence of str, optional
        The arguments (default: the command line's).

    Returns
    -------
    int
        The exit status (0 on success).

    See Also
    --------
    tiltlab.reproduce.run : The experiments that ``tiltlab reproduce NAME`` runs.

    Examples
    --------
    >>> import contextlib, io
    >>> from tiltlab.cli import main
    >>> with contextlib.redirect_stdout(io.StringIO()) as out:
    ...     status = main(["demo"])
    >>> status, out.getvalue().split(":")[0]
    (0, 'tiltlab demo')
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    _check_outputs(args.parser, args)
    try:
        return int(args.func(args))
    except BrokenPipeError:  # e.g. `tiltlab reproduce toys | head`: stop quietly
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes stdout
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
