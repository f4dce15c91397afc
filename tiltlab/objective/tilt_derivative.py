r"""The derivative in the tilt of a sample-level objective's gradient, at a fixed point.

With tilted weights :math:`w_i(t) = p_i e^{t\ell_i} / \sum_j p_j e^{t\ell_j}` (prior
``p``), :math:`\partial w_i/\partial t = w_i(\ell_i - \bar\ell)` with
:math:`\bar\ell = \sum_j w_j\ell_j`, so that

.. math:: \frac{\partial}{\partial t}\nabla F(\theta; t)
          = \sum_i w_i(\ell_i - \bar\ell)\,\nabla\ell_i(\theta)
          = \mathrm{Cov}_w(\ell, \nabla\ell),

the ridge term having no tilt. The formula holds at ``t = 0`` (plain weights ``p``). It
is the right-hand side of the tangent equation of a tilt path,
:math:`H\,d\theta/dt = -\partial_t\nabla F`, which :func:`tiltlab.tilt_path` solves to
predict the solution at the next tilt.
"""

from __future__ import annotations

from typing import Any

from .engines.generic import aggregate

__all__ = ["gradient_tilt_derivative"]


def gradient_tilt_derivative(objective: Any, theta: Any) -> Any:
    r"""The derivative :math:`\partial_t \nabla F(\theta; t)` at fixed ``theta``.

    Two passes over ``X`` (one product with ``X`` and one with ``X^T``), counted in
    ``objective.n_passes``.

    Parameters
    ----------
    objective : TiltedObjective
        A sample-level objective with a linear-predictor loss, at a finite tilt.
    theta : array
        The point, flat or in the objective's parameter shape.

    Returns
    -------
    array
        :math:`\sum_i w_i(\ell_i - \bar\ell)\nabla\ell_i` in the shape of ``theta`` (and
        its namespace, dtype and device).

    Raises
    ------
    NotImplementedError
        A hierarchical objective (several tilts) or a loss without a linear predictor.
    ValueError
        An infinite tilt, or a ``theta`` of the wrong shape.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab import TiltedObjective
    >>> from tiltlab.objective.tilt_derivative import gradient_tilt_derivative
    >>> X = np.c_[np.ones(4), np.arange(4.0)]
    >>> obj = TiltedObjective("squared", X, np.array([0.0, 1.0, 1.0, 5.0]), t=0.5)
    >>> theta, h = np.array([0.2, 0.8]), 1e-6
    >>> fd = (obj.with_tilt(0.5 + h).gradient(theta)
    ...       - obj.with_tilt(0.5 - h).gradient(theta)) / (2 * h)
    >>> bool(np.allclose(gradient_tilt_derivative(obj, theta), fd, rtol=1e-6))
    True
    """
    problem = objective.problem
    if problem.is_hierarchical:
        raise NotImplementedError(
            "the tilt derivative is defined for a sample-level objective (one tilt)"
        )
    if not problem.is_linear:
        raise NotImplementedError(
            f"the tilt derivative needs a loss with a linear predictor, got {problem.loss.name!r}"
        )
    if not problem.finite_tilts:
        raise ValueError("the tilt derivative is not defined at an infinite tilt")
    xp = objective.xp
    th = objective.check_theta(theta)
    T = th if problem.shape is None else xp.reshape(th, problem.shape)
    z = problem.X @ T
    ell, d1, _ = problem.loss.derivatives(z, problem.y, validate=False, xp=xp)
    _, w = aggregate(problem, ell, th)
    u = w * (ell - xp.sum(w * ell))
    coef = u[:, None] * d1 if d1.ndim == 2 else u * d1
    out = problem.X.T @ coef
    objective.n_passes += 2
    return xp.reshape(out, th.shape)
