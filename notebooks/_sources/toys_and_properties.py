"""Cells of notebooks/toys_and_properties.ipynb (see ../_build_notebooks.py)."""

CELLS = [
    (
        "md",
        """# The paper's toy problems, and the properties of tilted solutions

The first figure of the TERM paper shows what a tilt does on three small problems:

1. **point estimation** in 2-D, with a cluster of outliers;
2. **linear regression** with a block of gross outliers;
3. **logistic regression** with an imbalanced (rare) class.

Negative tilts ignore the outliers; positive tilts pull the solution towards the worst-off
samples (the outliers, or the rare class). The second part draws the property figures:
how the mean, max and min losses trade off along `t`. Public API only: the toy generators
of `tiltlab.datasets`, `tiltlab.TiltedObjective`, `tiltlab.tilt_path` and `tiltlab.plot`.""",
    ),
    (
        "code",
        """import matplotlib.pyplot as plt
import numpy as np

import tiltlab as tl
from tiltlab.datasets import (
    linear_regression_outliers,
    logistic_imbalanced,
    point_estimation_2d,
    point_estimation_objective,
)
from tiltlab.plot import plot_tradeoffs

TILTS = [-2.0, 0.0, 2.0]
COLORS = {-2.0: "tab:blue", 0.0: "black", 2.0: "tab:red"}""",
    ),
    ("md", "## Figure 1: three toys over a range of tilts"),
    (
        "code",
        """points, inlier = point_estimation_2d(n=100, outlier_fraction=0.2, seed=0)
pe_path = tl.tilt_path(point_estimation_objective(points), TILTS, method="newton",
                       theta0=points.mean(axis=0))

X, y, clean = linear_regression_outliers(n=100, outlier_fraction=0.2, seed=0)
lr_path = tl.tilt_path(tl.TiltedObjective("squared", X, y), TILTS, method="newton")

Xc, yc = logistic_imbalanced(n=200, rare_fraction=0.1, seed=0)
lg_path = tl.tilt_path(tl.TiltedObjective("logistic", Xc, yc, l2=1e-3), TILTS,
                       method="newton")

fig, axes = plt.subplots(3, 1, figsize=(6.5, 13), layout="constrained")
ax = axes[0]
ax.scatter(*points[inlier].T, s=10, c="0.6", label="inliers")
ax.scatter(*points[~inlier].T, s=10, c="tab:orange", label="outliers")
for t, theta in zip(pe_path.ts, np.asarray(pe_path.x), strict=True):
    ax.plot(*theta, "*", ms=16, c=COLORS[t], label=f"t = {t:g}")
ax.set_title("point estimation")
ax.set_xlabel("first coordinate")
ax.set_ylabel("second coordinate")
ax.legend()

ax = axes[1]
ax.scatter(X[clean, 0], y[clean], s=10, c="0.6")
ax.scatter(X[~clean, 0], y[~clean], s=10, c="tab:orange")
grid = np.linspace(0, 2, 2)
for t, (slope, intercept) in zip(lr_path.ts, np.asarray(lr_path.x), strict=True):
    ax.plot(grid, slope * grid + intercept, c=COLORS[t], label=f"t = {t:g}")
ax.set_title("linear regression")
ax.set_xlabel("x")
ax.set_ylabel("y")
ax.legend()

ax = axes[2]
ax.scatter(*Xc[yc == 0, :2].T, s=10, c="0.6", label="common class")
ax.scatter(*Xc[yc == 1, :2].T, s=10, c="tab:orange", label="rare class")
u = np.linspace(Xc[:, 0].min(), Xc[:, 0].max(), 2)
for t, (a, b, c) in zip(lg_path.ts, np.asarray(lg_path.x), strict=True):
    ax.plot(u, -(a * u + c) / b, c=COLORS[t], label=f"t = {t:g}")  # a x1 + b x2 + c = 0
ax.set_ylim(Xc[:, 1].min() - 0.5, Xc[:, 1].max() + 0.5)
ax.set_title("logistic regression: decision boundaries")
ax.set_xlabel("first feature")
ax.set_ylabel("second feature")
ax.legend(fontsize=8)
plt.show()""",
    ),
    (
        "code",
        """print("point estimation: distance of theta(t) to the inlier mean")
for t, theta in zip(pe_path.ts, np.asarray(pe_path.x), strict=True):
    print(f"  t = {t:5.1f}: {np.linalg.norm(theta - points[inlier].mean(axis=0)):.3f}")

print("linear regression (true slope 2, intercept 1)")
for t, theta in zip(lr_path.ts, np.asarray(lr_path.x), strict=True):
    print(f"  t = {t:5.1f}: slope {theta[0]:6.3f}, intercept {theta[1]:6.3f}")

print("logistic regression: accuracy on the rare and the common class")
for t, theta in zip(lg_path.ts, np.asarray(lg_path.x), strict=True):
    pred = Xc @ theta > 0
    rare, common = pred[yc == 1].mean(), (~pred[yc == 0]).mean()
    print(f"  t = {t:5.1f}: rare {rare:.2f}, common {common:.2f}")""",
    ),
    (
        "md",
        """## Properties: average loss against the worst and best losses

Along the path `theta(t)`, the paper's property figures show a positive tilt lowering the
max loss at the price of a higher mean loss, and a negative tilt trading the mean loss
against the min loss. ERM (`t = 0`) has the smallest mean loss by definition; how the max
and min losses move away from `t = 0` is a property of the data, not a theorem (see the
user guide's page on the theory and `tiltlab.theory.check_path`). Here is the point
estimation toy.""",
    ),
    (
        "code",
        """grid = np.r_[-np.logspace(0.5, -2, 12), 0.0, np.logspace(-2, 0.5, 12)]
path = tl.tilt_path(point_estimation_objective(points), grid, method="newton",
                    theta0=points.mean(axis=0), tol=1e-10)

fig, axes = plt.subplots(3, 1, figsize=(6.5, 10), layout="constrained")
plot_tradeoffs(path, ax=axes)
plt.show()

s = path.stats
order = np.argsort(path.ts)
print("    t     mean      max      min   variance")
for k in order[::4]:
    print(f"{path.ts[k]:6.2f} {s['mean'][k]:8.3f} {s['max'][k]:8.3f} "
          f"{s['min'][k]:8.4f} {s['variance'][k]:9.3f}")""",
    ),
]
