"""The problem an objective describes: a loss, data, a prior, a tilt tree and a ridge term.

:class:`TiltedProblem` is frozen: an engine reads it and never changes it. What is learned
on the way (the parameter shape of a parameter-space loss after its first evaluation, the
prior and group tree of such a loss) gives a new problem (:meth:`TiltedProblem.learned`),
and so does another tilt (:meth:`TiltedProblem.with_tilts`). ``cache`` is a per-data store
engines may fill (a Dask engine keeps its row-chunked data there); copies with another
tilt share it, since they share the data.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from .._compat import (
    PicklableNamespace,
    as_array,
    as_float_array,
    check_finite,
    device,
    is_lazy,
    is_numpy_namespace,
    namespace_of,
    real_number,
    seq_of_arrays,
)
from ..losses import get_loss
from ..risk import GroupTree, build_tree, check_group_mass, prepare_prior, prepare_tilts

__all__ = ["TiltedProblem", "depth_of", "tilt_value"]


def tilt_value(t: Any) -> float:
    """A sample-level tilt as a float (``+-inf`` allowed).

    Any real number or size-one array of any library; strings, booleans, NaN and
    arrays of several tilts are rejected.
    """
    return real_number(t, "t")


def depth_of(groups: Any) -> int:
    """Number of grouping levels in ``groups`` (one array, or a sequence of them)."""
    return len(groups) if seq_of_arrays(groups) else 1


@dataclasses.dataclass(frozen=True, eq=False)
class TiltedProblem(PicklableNamespace):
    """A tilted objective's data: what every engine evaluates.

    ``tilts`` holds the sample-level tilt alone, or one tilt per level of a hierarchy
    (outermost first). ``weights`` is the prior as given, ``prior`` its normalised form
    (None when uniform, or before the first evaluation of a parameter-space loss).
    """

    #: The per-sample loss (a :class:`~tiltlab.losses.Loss`).
    loss: Any
    #: The features, shape ``(N, d)`` (None for losses given in ``theta`` without data).
    X: Any
    #: The targets, shape ``(N,)`` (None where the loss takes none).
    y: Any
    #: The array namespace of the data (array-api-compat's).
    xp: Any
    #: The sample-level tilt alone, or one tilt per level of a hierarchy, outermost first.
    tilts: tuple[float, ...]
    #: The ridge coefficient: the objective adds ``l2 / 2 * ||theta||^2``.
    l2: float = 0.0
    #: The prior sample weights as given (None: uniform).
    weights: Any = None
    #: The prior normalised to sum to one (None when uniform, or not yet prepared).
    prior: Any = None
    #: The group labels of a hierarchical objective, outermost first (None: sample level).
    groups: Any = None
    #: The group structure built from ``groups`` (None until prepared, or sample level).
    tree: GroupTree | None = None
    #: The number of samples N (None until known, for losses given in ``theta``).
    n_samples: int | None = None
    #: The number of features d of ``X`` (None without ``X``).
    n_features: int | None = None
    #: The shape of ``theta``: ``(d,)``, or ``(d, K)`` for the multinomial loss.
    shape: tuple[int, ...] | None = None
    #: The floating dtype of the data and of ``theta``.
    dtype: Any = None
    #: The device of the data and of ``theta``.
    device: Any = None
    #: Values derived from the data once and kept (block plans, Dask plans, counts).
    cache: dict = dataclasses.field(default_factory=dict, repr=False)

    # -- construction -------------------------------------------------------------------

    @classmethod
    def build(
        cls,
        loss: Any,
        X: Any = None,
        y: Any = None,
        *,
        t: float = 0.0,
        groups: Any = None,
        tilts: Any = None,
        weights: Any = None,
        l2: float = 0.0,
        check_finite: bool = True,
        xp: Any = None,
    ) -> TiltedProblem:
        """Validate the arguments of :class:`~tiltlab.TiltedObjective` into a problem."""
        if not isinstance(check_finite, (bool, np.bool_)):
            raise TypeError(f"`check_finite` must be True or False, got {check_finite!r}")
        l2 = real_number(l2, "l2")
        if not math.isfinite(l2) or l2 < 0:
            raise ValueError(f"`l2` must be a finite non-negative number, got {l2!r}")
        loss = get_loss(loss)
        if xp is None:
            xp = namespace_of(X=X, y=y, weights=weights)
            carried = getattr(loss, "_xp", None)  # losses carrying their own data
            if X is None and y is None and carried is not None:
                xp = carried
        if groups is not None:
            if tilts is None:
                raise ValueError("`tilts` is required with `groups` (outermost first)")
            tilt_list = tuple(prepare_tilts(tilts, depth_of(groups)))
        elif tilts is not None:
            raise ValueError("`tilts` needs `groups`; for sample-level tilting pass `t`")
        else:
            tilt_list = (tilt_value(t),)
        common = dict(xp=xp, tilts=tilt_list, l2=l2, weights=weights, groups=groups)
        if not loss.is_linear:
            if X is not None:
                X = as_array(X, xp, name="X")
            return cls(loss=loss, X=X, y=y, **common)
        loss, X, y = _linear_data(loss, X, y, xp, bool(check_finite))
        n, d = int(X.shape[0]), int(X.shape[1])
        k = loss.n_outputs
        problem = cls(
            loss=loss,
            X=X,
            y=y,
            n_samples=n,
            n_features=d,
            shape=(d,) if k == 1 else (d, int(k)),
            dtype=X.dtype,
            device=device(X),
            **common,
        )
        return problem._with_prior_and_tree(n)

    def _with_prior_and_tree(self, n: int, like: Any = None) -> TiltedProblem:
        """The normalised prior and the group tree for ``n`` samples."""
        xp = self.xp
        prior = self.prior
        if prior is None and self.weights is not None:
            if like is None:
                like = xp.zeros((n,), dtype=self.dtype, device=self.device)
            prior = prepare_prior(self.weights, like, xp)
        tree = self.tree
        if tree is None and self.groups is not None:
            tree = build_tree(self.groups, n)
        if tree is not None:
            check_group_mass(prior, tree, xp)
        return dataclasses.replace(self, prior=prior, tree=tree)

    def learned(self, theta: Any, losses: Any) -> TiltedProblem:
        """A parameter-space problem after its first evaluation: the parameter shape, the
        number of samples, the dtype and device, the prior and the tree are known."""
        if self.n_samples is not None and self.ready:
            return self
        new = self
        if self.n_samples is None:
            new = dataclasses.replace(
                self,
                n_samples=int(losses.shape[0]),
                shape=tuple(int(s) for s in theta.shape),
                n_features=int(theta.shape[0]),
                dtype=losses.dtype,
                device=device(losses),
            )
        return new._with_prior_and_tree(int(losses.shape[-1]), like=losses)

    def with_tilts(self, tilts: tuple[float, ...]) -> TiltedProblem:
        """The same data with other tilts (validated by the caller)."""
        return dataclasses.replace(self, tilts=tuple(float(t) for t in tilts))

    # -- questions engines ask ----------------------------------------------------------

    @property
    def is_linear(self) -> bool:
        """The loss is a function of the predictor ``z = X @ theta``."""
        return bool(self.loss.is_linear)

    @property
    def is_hierarchical(self) -> bool:
        """The objective tilts over groups (``groups`` given), not only over samples."""
        return self.groups is not None

    @property
    def ready(self) -> bool:
        """The prior and the group tree are prepared (always, for predictor losses)."""
        prior_ok = self.prior is not None or self.weights is None
        return prior_ok and (self.tree is not None or self.groups is None)

    @property
    def finite_tilts(self) -> bool:
        """Every tilt is finite (no level takes a max or a min)."""
        return all(math.isfinite(t) for t in self.tilts)

    def check_theta(self, theta: Any, name: str = "theta") -> Any:
        """``theta`` as an array of the problem's namespace, dtype and device.

        Parameters are not data: a NumPy array is moved to the namespace and device (an
        array of a third library is rejected), after a check that its entries are finite.
        Other parameters are checked by the evaluations, when the losses are not finite
        (:meth:`check_finite_theta`).
        """
        xp = self.xp
        host = isinstance(theta, np.ndarray)
        if (host and is_numpy_namespace(xp) and theta.dtype == self.dtype
                and self.shape is not None and theta.shape in (self.shape, (theta.size,))
                and theta.size == math.prod(self.shape)):
            return theta  # already what the checks below would return (the solvers' case)
        if host and not is_numpy_namespace(xp):
            if theta.dtype.kind in "fiub" and not np.all(np.isfinite(theta)):
                raise ValueError(f"`{name}` contains NaN or infinite values")
            theta = xp.asarray(theta, device=self.device)
        th = as_float_array(theta, xp, name=name, dev=self.device)
        if self.dtype is not None and th.dtype != self.dtype:
            th = xp.astype(th, self.dtype)
        if self.shape is not None:
            size = int(np.prod(self.shape))
            if tuple(th.shape) != self.shape and tuple(th.shape) != (size,):
                raise ValueError(
                    f"`{name}` must have shape {self.shape} (or be flat of size {size}), got "
                    f"{tuple(th.shape)}"
                )
        return th

    def check_finite_theta(self, theta: Any, name: str = "theta") -> None:
        """Raise a ``ValueError`` naming ``name`` when ``theta`` holds NaN or infinity
        (engines ask when the losses they computed are not finite)."""
        xp = self.xp
        if isinstance(theta, np.ndarray):  # on the host, without the namespace's wrappers
            finite = bool(np.isfinite(theta).all())
        else:
            finite = is_lazy(xp) or bool(xp.all(xp.isfinite(theta)))
        if not finite:
            raise ValueError(f"`{name}` contains NaN or infinite values")

    # -- pickling -------------------------------------------------------------------------

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state["cache"] = {}  # engine caches belong to one process (a Dask client...)
        return state


def _linear_data(loss: Any, X: Any, y: Any, xp: Any, finite: bool) -> tuple[Any, Any, Any]:
    """Validated ``X``, ``y`` and the loss with its labels, for a predictor loss."""
    skip = "check_finite=False"
    if X is None or y is None:
        raise ValueError(f"the {loss.name} loss needs `X` and `y`")
    X = as_float_array(X, xp, name="X")
    if X.ndim != 2:
        raise ValueError(f"`X` must be 2-d (samples x features), got shape {X.shape}")
    _check_known_rows(X, "X")
    if X.shape[0] == 0 or X.shape[1] == 0:
        raise ValueError(f"`X` must not be empty, got shape {X.shape}")
    if finite:
        check_finite(X, xp, name="X", skip=skip)
    loss = loss.with_labels(y, xp=xp)
    y = loss.check_y(y, xp=xp)
    if y.ndim != 1:
        hint = " (pass `y.reshape(-1)`)" if y.ndim == 2 and y.shape[1] == 1 else ""
        raise ValueError(
            f"`y` must be 1-d with one target per row of `X`, got shape {tuple(y.shape)}{hint}"
        )
    _check_known_rows(y, "y")
    if y.shape[0] != X.shape[0]:
        raise ValueError(f"`y` has {y.shape[0]} entries but `X` has {X.shape[0]} rows")
    if xp.isdtype(y.dtype, "real floating"):
        if finite:
            check_finite(y, xp, name="y", skip=skip)
        if y.dtype != X.dtype:
            y = xp.astype(y, X.dtype)
    return loss, X, y


def _check_known_rows(a: Any, name: str) -> None:
    """Refuse an array whose number of rows is unknown (a Dask array after a filter)."""
    rows = a.shape[0]
    if rows is None or (isinstance(rows, float) and math.isnan(rows)):
        raise ValueError(
            f"`{name}` has an unknown number of rows (a Dask array with unknown chunk "
            f"sizes, e.g. after boolean indexing): call `{name}.compute_chunk_sizes()` first"
        )
