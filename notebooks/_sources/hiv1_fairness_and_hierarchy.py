"""Cells of notebooks/hiv1_fairness_and_hierarchy.ipynb (see ../_build_notebooks.py)."""

CELLS = [
    (
        "md",
        """# HIV-1: fairness across classes, and hierarchical tilting

The HIV-1 protease cleavage data (6590 octamers, 160 one-hot features) has a rare class
(about 1 in 5). Two of the paper's experiments:

* **Class-level TERM** (fairness): a large positive tilt *across classes* makes the model
  care about its worst class, the rare one; the paper compares it with ERM and with ERM
  whose decision threshold is tuned for the rare class.
* **Hierarchical TERM** (compound issues): with 30% label noise *and* class imbalance, a
  positive tilt across classes and a negative tilt *inside* each class at once.

One seed and the public API only: `tiltlab.datasets.load_hiv1`, `tiltlab.TiltedObjective`
with `groups` and `tilts`, and `tiltlab.minimize`.""",
    ),
    (
        "code",
        """import numpy as np

import tiltlab as tl
from tiltlab.datasets import load_hiv1


def fit(X, y, **tilting):
    obj = tl.TiltedObjective("logistic", X, y, l2=1e-4, **tilting)
    return tl.minimize(obj, method="newton", tol=1e-6).x


def accuracies(X, y, theta, threshold=0.0):
    correct = (X @ np.asarray(theta) > threshold) == (y == 1)
    return {"rare": correct[y == 1].mean(), "common": correct[y == 0].mean(),
            "overall": correct.mean()}


def show(rows):
    print(f"{'method':>28} {'rare':>6} {'common':>7} {'overall':>8}")
    for name, acc in rows:
        print(f"{name:>28} {acc['rare']:6.3f} {acc['common']:7.3f}"
              f" {acc['overall']:8.3f}")""",
    ),
    ("md", "## Class-level tilting for the rare class"),
    (
        "code",
        """data = load_hiv1(seed=0, intercept=True)
print("training rows:", data.y_train.size,
      " rare share:", round(data.y_train.mean(), 3))

erm = fit(data.X_train, data.y_train)
# tilt 50 across the two classes, plain average (tilt 0) inside each class
fair = fit(data.X_train, data.y_train, groups=data.y_train, tilts=(50.0, 0.0))

# ERM+ (the paper's protocol): move ERM's decision threshold until its validation
# accuracy on the rare class equals that of TERM (t = 50); the largest such threshold
target = accuracies(data.X_val, data.y_val, fair)["rare"]
z_val = data.X_val @ np.asarray(erm)
candidates = np.sort(z_val)[::-1]


def rare_accuracy(c):
    return accuracies(data.X_val, data.y_val, erm, c - 1e-12)["rare"]


threshold = next(c for c in candidates if rare_accuracy(c) >= target) - 1e-12

show([
    ("ERM", accuracies(data.X_test, data.y_test, erm)),
    ("ERM+ (tuned threshold)", accuracies(data.X_test, data.y_test, erm, threshold)),
    ("class-level TERM (t = 50)", accuracies(data.X_test, data.y_test, fair)),
])
print("paper, test, 5 seeds: ERM 0.822 / 0.966 / 0.934, ERM+ 0.916 / 0.917 / 0.917, "
      "TERM (t = 50) 0.917 / 0.925 / 0.924")""",
    ),
    (
        "md",
        """The tilt across classes trades a little common-class accuracy for a large gain on
the rare class, with no decision threshold to tune. ERM+ gets there by moving its
threshold until its validation accuracy on the rare class equals TERM's. In the paper,
over five seeds, TERM then beats ERM+ on the common class and overall by 0.008. On this
one seed it does not: ERM+ generalises its rare-class accuracy better and the two tie
overall. The difference in the paper is small, and one seed cannot confirm it.

## Label noise and imbalance together

Now 30% of the training labels are redrawn at random, and in the second setting the rare
class is cut to 1:20. A negative tilt *over samples* treats noisy labels as outliers, but
with 1:20 imbalance it treats the whole rare class as outliers too. The hierarchical
objective separates the two jobs: tilt `-2` inside each class suppresses the noisy labels,
and a positive tilt across classes (0.1 at 1:4, 50 at 1:20, as in the paper) protects the
rare class.""",
    ),
    (
        "code",
        """for imbalance, t_class, label in ((None, 0.1, "1:4"), (0.05, 50.0, "1:20")):
    d = load_hiv1(seed=0, intercept=True, noise=0.3, imbalance=imbalance)
    rows = [
        ("ERM", fit(d.X_train, d.y_train)),
        ("sample-level TERM (t = -2)", fit(d.X_train, d.y_train, t=-2.0)),
        (f"hierarchical ({t_class:g}, -2)",
         fit(d.X_train, d.y_train, groups=d.y_train, tilts=(t_class, -2.0))),
    ]
    print(f"30% label noise, imbalance {label} (test accuracy)")
    show([(name, accuracies(d.X_test, d.y_test, theta)) for name, theta in rows])
    print()""",
    ),
    (
        "md",
        """At 1:20 the sample-level negative tilt gives up on the rare class altogether,
while the hierarchical tilt keeps it: the paper's point about compound issues. The
paper's table also has an annotator-level variant (10 annotators, 3 of them spammers),
which is a third grouping level: `groups=[annotator, 2 * annotator + y]` with three
tilts.""",
    ),
]
