"""Data for tiltlab: the TERM paper's real data sets and small seeded toy problems.

Real data (shipped inside the package, read offline; provenance in ``data/README.md``):

* :func:`load_drug_discovery` - QSAR regression, 4085 x 411 (robust-regression table),
* :func:`load_abalone` - UCI abalone regression, 4177 x 9,
* :func:`load_hiv1` - UCI HIV-1 protease cleavage classification, 6590 x 160.

Data read from a local folder (not shipped, never downloaded): :func:`load_cifar10`
(the CIFAR-10 python batches, for the deep reproductions' paper setting).

Toy problems (:mod:`tiltlab.datasets.toys`):
:func:`point_estimation_2d`, :func:`linear_regression_outliers`,
:func:`logistic_imbalanced`, and :func:`point_estimation_losses`.

Everything here returns host-side NumPy ``float64`` arrays.
"""

from ._loaders import (
    ABALONE_FEATURES,
    AMINO_ACIDS,
    DatasetSplit,
    load_abalone,
    load_drug_discovery,
    load_hiv1,
)
from .cifar import CIFAR10_CLASSES, load_cifar10
from .toys import (
    linear_regression_outliers,
    logistic_imbalanced,
    point_estimation_2d,
    point_estimation_losses,
    point_estimation_objective,
)

__all__ = [
    "ABALONE_FEATURES",
    "CIFAR10_CLASSES",
    "AMINO_ACIDS",
    "DatasetSplit",
    "linear_regression_outliers",
    "load_abalone",
    "load_cifar10",
    "load_drug_discovery",
    "load_hiv1",
    "logistic_imbalanced",
    "point_estimation_2d",
    "point_estimation_losses",
    "point_estimation_objective",
]
