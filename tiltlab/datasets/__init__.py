"""Data for tiltlab: the TERM paper's real data sets and small seeded toy problems.

Real data (shipped inside the package, read offline; provenance in ``data/README.md``):

* :func:`load_drug_discovery` - QSAR regression, 4085 x 411 (robust-regression table),
* :func:`load_abalone` - UCI abalone regression, 4177 x 9,
* :func:`load_hiv1` - UCI HIV-1 protease cleavage classification, 6590 x 160.

Data read from a local folder (not shipped, never downloaded): :func:`load_cifar10`
(the CIFAR-10 python batches, for the deep reproductions' paper setting).

Grouped data for fair PCA (``tiltlab.datasets.groups``): :func:`abalone_by_sex`,
:func:`wine_by_cultivar` and :func:`load_csv_groups`.

Federated data (``tiltlab.datasets.federated``): :func:`synthetic_federated` (the
q-FFL "synthetic (alpha, beta)" recipe) and :func:`load_leaf_federated` (a local copy in
the LEAF JSON layout).

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
from .federated import FederatedData, load_leaf_federated, synthetic_federated
from .groups import GroupedData, abalone_by_sex, load_csv_groups, wine_by_cultivar
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
    "FederatedData",
    "GroupedData",
    "abalone_by_sex",
    "load_csv_groups",
    "wine_by_cultivar",
    "linear_regression_outliers",
    "load_abalone",
    "load_cifar10",
    "load_drug_discovery",
    "load_hiv1",
    "load_leaf_federated",
    "logistic_imbalanced",
    "point_estimation_2d",
    "point_estimation_losses",
    "point_estimation_objective",
    "synthetic_federated",
]
