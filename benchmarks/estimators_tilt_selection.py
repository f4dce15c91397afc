"""The tilt chosen from data by ``TiltedRegressorCV()`` (default arguments) on Drug Discovery.

Protocol of ``tiltlab reproduce robust-regression``: for each noise level and seed,
``load_drug_discovery(seed=s, noise=p)`` shuffles and splits the data 80/10/10 and replaces
a share ``p`` of the training and validation targets by N(5, 5) draws. The estimators see
the training and validation rows together (they hold out their own rows) without the
loader's intercept column; the test RMSE is on the clean test targets.

Columns: the chosen tilt, its test RMSE, the best test RMSE over the grid's fixed tilts
(``TiltedRegressor(t=t)`` with the same defaults as the refit: ``early_stopping="auto"``,
``random_state=seed``) and that tilt, least squares (``LinearRegression``), the estimated
share of corrupted held-out rows, and the CV fit time in seconds (one process, machine
load printed).

Run:
    python benchmarks/estimators_tilt_selection.py
    python benchmarks/estimators_tilt_selection.py --noise 0.8 --seeds 0 1
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--noise", type=float, nargs="+", default=[0.0, 0.2, 0.4, 0.8])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    args = ap.parse_args(argv)

    from sklearn.linear_model import LinearRegression

    from tiltlab.datasets import load_drug_discovery
    from tiltlab.estimators import DEFAULT_TS, TiltedRegressor, TiltedRegressorCV

    print(f"load average {os.getloadavg()}")
    head = (
        f"{'noise':>5} {'seed':>4} {'t chosen':>9} {'RMSE':>6} {'best t':>7} {'best':>6} "
        f"{'gap':>6} {'LS':>6} {'vs LS':>7} {'contam.':>7} {'CV s':>6}"
    )
    print(head)
    print("-" * len(head))
    for p in args.noise:
        for s in args.seeds:
            d = load_drug_discovery(seed=s, noise=p)
            X = np.r_[d.X_train, d.X_val][:, :-1]
            y = np.r_[d.y_train, d.y_val]
            Xt = d.X_test[:, :-1]

            def rmse(model, Xt=Xt, yt=d.y_test):
                return float(np.sqrt(np.mean((model.predict(Xt) - yt) ** 2)))

            t0 = time.perf_counter()
            cv = TiltedRegressorCV(random_state=s).fit(X, y)
            elapsed = time.perf_counter() - t0
            fixed = [
                rmse(TiltedRegressor(t=t, early_stopping="auto", random_state=s).fit(X, y))
                for t in DEFAULT_TS
            ]
            j = int(np.argmin(fixed))
            ls = rmse(LinearRegression().fit(X, y))
            r = rmse(cv)
            print(
                f"{p:>5.1f} {s:>4d} {cv.t_:>+9.2f} {r:>6.3f} {DEFAULT_TS[j]:>+7.2f} "
                f"{fixed[j]:>6.3f} {r - fixed[j]:>6.3f} {ls:>6.3f} {r / ls - 1:>+7.1%} "
                f"{cv.contamination_:>7.2f} {elapsed:>6.1f}",
                flush=True,
            )
    print(f"load average at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
