"""Cells of notebooks/superquantile_and_tradeoffs.ipynb (see ../_build_notebooks.py)."""

CELLS = [
    (
        "md",
        """# TERM as an approximate superquantile method, and the loss trade-offs along t

This notebook reproduces two figures of the TERM paper (Li, Beirami, Sanjabi, Smith,
ICLR 2021) with `tiltlab` only:

* the **superquantile figure** (appendix "TERM as an Approximate Superquantile Method"):
  for a threshold `a`, `Q(a; theta)` is the share of samples whose loss is at least `a`.
  `Q0(a)` is its global minimum over `theta` (computed exactly here), `Q1(a)` the best
  value over the tilted solutions `theta(t)`, `Q3(a)` the smallest value of the tilted
  tail bound, attained at a tilt `t~(a)`, and `Q2(a) = Q(a; theta(t~(a)))`. The paper's
  theorem is `Q0 <= Q1 <= Q2 <= Q3`;
* the **trade-off figure** (appendix "Experiments to showcase properties of TERM"):
  mean, max and min loss, loss variance and weight entropy of the tilted solutions.

It ends with `tiltlab.theory.check_path`, which checks the paper's properties of tilted
solutions numerically; see `tiltlab.theory` for which of them are theorems and which are
claims that fail on valid data.""",
    ),
    (
        "code",
        """import matplotlib.pyplot as plt
import numpy as np

import tiltlab as tl
from tiltlab.bounds import min_tail_fraction, quantile_curves
from tiltlab.datasets import (
    linear_regression_outliers,
    logistic_imbalanced,
    point_estimation_2d,
    point_estimation_objective,
)
from tiltlab.plot import plot_path, plot_quantile_curves, plot_tradeoffs
from tiltlab.theory import check_path, format_checks, tradeoff_curves

# tilts on both sides of 0, dense near 0 and reaching far out (the bound's infimum
# over t)
tilts = np.r_[-np.logspace(1, -2, 10), 0.0, np.logspace(-2, 2, 16)]""",
    ),
    ("md", "## Superquantile figure: point estimation"),
    (
        "code",
        """points, inlier = point_estimation_2d(n=50, outlier_fraction=0.2, seed=0)
pe = point_estimation_objective(points)
pe_path = tl.tilt_path(pe, tilts, method="newton", tol=1e-10,
                       theta0=points.mean(axis=0))

a_pe = np.linspace(0.05, 30.0, 80)
pe_curves = quantile_curves(pe_path, a_pe)
pe_q0 = min_tail_fraction(points, a_pe)  # exact: best open disk of radius sqrt(a)

assert np.all(pe_q0 <= pe_curves["Q1"] + 1e-12)
assert np.all(pe_curves["Q1"] <= pe_curves["Q2"])
assert np.all(pe_curves["Q2"] <= pe_curves["Q3"])
print("largest gap Q2 - Q0:", np.max(pe_curves["Q2"] - pe_q0))""",
    ),
    ("md", "## Superquantile figure: linear regression"),
    (
        "code",
        """X, y, _ = linear_regression_outliers(n=50, outlier_fraction=0.2, seed=0)
lr = tl.TiltedObjective("squared", X, y, l2=1e-6)
lr_path = tl.tilt_path(lr, tilts / 10, method="newton", tol=1e-10)

a_lr = np.linspace(0.01, 30.0, 80)
lr_curves = quantile_curves(lr_path, a_lr)
lr_q0 = min_tail_fraction(lr, a_lr)  # exact: best open strip of half-width sqrt(a)

assert np.all(lr_q0 <= lr_curves["Q1"] + 1e-12)
assert np.all(lr_curves["Q1"] <= lr_curves["Q2"])
assert np.all(lr_curves["Q2"] <= lr_curves["Q3"])
print("largest gap Q2 - Q0:", np.max(lr_curves["Q2"] - lr_q0))

fig, axes = plt.subplots(2, 1, figsize=(6.5, 7.5), layout="constrained")
plot_quantile_curves(pe_curves, a_pe, ax=axes[0], Q0=pe_q0)
axes[0].set_title("point estimation")
plot_quantile_curves(lr_curves, a_lr, ax=axes[1], Q0=lr_q0)
axes[1].set_title("linear regression")
plt.show()""",
    ),
    (
        "md",
        """As in the paper, `Q1` and `Q2` stay close to the exact `Q0`: the solution
`theta(t~(a))` picked by minimising the tilted bound is a good approximate minimiser of the
tail share, although the bound `Q3` itself is loose.""",
    ),
    ("md", "## Trade-off figure: point estimation and logistic regression"),
    (
        "code",
        """Xl, yl = logistic_imbalanced(n=100, rare_fraction=0.1, seed=0)
lg = tl.TiltedObjective("logistic", Xl, yl, l2=1e-3)
grid = np.linspace(-2.0, 4.0, 25)
lg_path = tl.tilt_path(lg, grid, method="newton", tol=1e-10)
pe_small = tl.tilt_path(pe, grid / 4, method="newton", tol=1e-10,
                        theta0=points.mean(axis=0))

fig, axes = plt.subplots(3, 2, figsize=(9, 10), layout="constrained")
plot_tradeoffs(pe_small, ax=axes[:, 0])
axes[0, 0].set_title("point estimation")
plot_tradeoffs(lg_path, ax=axes[:, 1])
axes[0, 1].set_title("logistic regression")
plt.show()

curves = tradeoff_curves(lg_path)
print("logistic:   t    mean     max      min  variance")
for k in range(0, curves["t"].size, 4):
    stats = [curves[key][k] for key in ("t", "mean", "max", "min", "variance")]
    print("  {:7.2f} {:7.4f} {:7.4f} {:8.5f} {:9.5f}".format(*stats))""",
    ),
    (
        "md",
        """## Checking the paper's properties along the paths

`check_path` returns one record per property. Theorems (monotonicity of the tilted
objective in `t`, the derivative checks, the corrected local statements, the `Q`
ordering) hold; the paper's global claims derived from its sign theorem can fail, and
the table shows where they do on these data.""",
    ),
    (
        "code",
        """checks = check_path(lg_path)
print("logistic regression, t in [-2, 4]:")
print(format_checks(checks))

a_check = np.linspace(0.05, 3.0, 12)
checks = check_path(lr_path, a=a_check)
print()
print("linear regression toy, t in [-1, 10]:")
print(format_checks(checks))""",
    ),
    (
        "md",
        """On the linear-regression toy several of the paper's claims fail. For `t < 0` the
continuation jumps to a second branch that fits the outliers (around `t = -0.1`), where no
smooth statement can hold. But the max-loss trade-off also fails for `t > 0`, where the
objective is convex and every solution is accurate to ~1e-12: the max-loss *rises* between
`t = 0.02` and `t = 0.25` (an independent SciPy solve gives 11.33 and 12.32).""",
    ),
    (
        "code",
        """lr_curves_t = tradeoff_curves(lr_path)
positive = lr_curves_t["t"] >= 0
positive_t, positive_max = lr_curves_t["t"][positive], lr_curves_t["max"][positive]
for t, top in zip(positive_t, positive_max, strict=True):
    print(f"t = {t:8.4f}   max loss = {top:.4f}")""",
    ),
    (
        "code",
        """fig, ax = plt.subplots(figsize=(6.5, 4), layout="constrained")
plot_path(lr_path, ax=ax)
ax.set_xscale("symlog", linthresh=0.01)
ax.set_title("linear regression: (slope, intercept) along t")
plt.show()""",
    ),
]
