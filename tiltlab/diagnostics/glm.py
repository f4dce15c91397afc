r"""The paper's GLM statistics :math:`\Lambda, \Gamma, \mathcal M, \mathcal V` and their
per-sample generalisation (see :mod:`tiltlab.diagnostics` for the mapping)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .._compat import as_array
from ..objective import TiltedObjective
from ..risk import tilted_risk, tilted_weights
from ._checks import _check_objective, _theta_of

__all__ = [
    "GLMStatistics",
    "glm_statistics",
]


@dataclass(frozen=True)
class GLMStatistics:
    r"""The paper's GLM quantities at ``(t, theta)`` and their per-sample generalisation.

    With ``T_i = T(y_i) x_i``, prior ``p`` and tilted weights ``w`` of the losses:

    Attributes
    ----------
    Lambda : 0-d array
        :math:`\Lambda(t;\theta) = t R(t;\theta) = \log\sum_i p_i e^{t\ell_i}` (no ridge).
    Gamma : 0-d array
        :math:`\Gamma(t;\theta) = \log\sum_i p_i e^{-t\theta^\top T_i}` (paper's definition).
    M : array (d,)
        :math:`\mathcal M = \sum_i \pi_i T_i` with
        :math:`\pi_i = p_i e^{-t\theta^\top T_i - \Gamma}` (paper's definition).
    V : array (d, d)
        :math:`\mathcal V = \sum_i \pi_i (T_i - \mathcal M)(T_i - \mathcal M)^\top`.
    statistic_weights : array (N,)
        :math:`\pi`.
    weights : array (N,)
        The tilted weights ``w`` of the losses (equal to ``pi`` when all samples share
        the cumulant and the offset, the paper's setting).
    tilted_M, tilted_V : arrays (d,), (d, d)
        Mean and covariance of ``T_i`` under ``w``.
    cumulant_mean : 0-d array
        :math:`\sum_i w_i (A(z_i) + c(y_i))` (the paper's :math:`A(\theta)`).
    cumulant_grad : array (d,)
        :math:`\sum_i w_i A'(z_i) x_i` (the paper's :math:`\nabla A`).
    cumulant_hess : array (d, d)
        :math:`\sum_i w_i A''(z_i) x_i x_i^\top` (the paper's :math:`\nabla^2 A`).
    """

    Lambda: Any
    Gamma: Any
    M: Any
    V: Any
    statistic_weights: Any
    weights: Any
    tilted_M: Any
    tilted_V: Any
    cumulant_mean: Any
    cumulant_grad: Any
    cumulant_hess: Any


def _require_sample_level(obj: TiltedObjective, what: str) -> None:
    if obj.is_hierarchical:
        raise NotImplementedError(
            f"{what} supports sample-level objectives only; for a hierarchical objective "
            "the solution depends on several tilts (differentiate a tilt path numerically "
            "instead, e.g. central differences of solutions)"
        )


def _require_glm(obj: TiltedObjective) -> None:
    loss = obj.loss
    if not (getattr(loss, "is_glm", False) and loss.is_linear and loss.n_outputs == 1):
        raise ValueError(
            f"the {loss.name} loss of `objective` is not a scalar GLM loss (A(z) - T(y) z "
            "+ c(y)); GLM statistics need e.g. the squared or logistic loss"
        )


def _prior(obj: TiltedObjective, th: Any) -> Any:
    """Normalised prior weights of a sample-level objective (the weights at t = 0)."""
    return obj.with_tilt(0.0).weights(th)


def _wcov(U: Any, W: Any, w: Any) -> Any:
    """Weighted cross-covariance sum_i w_i (u_i - ubar)(v_i - vbar)^T of rows of U, W."""
    Uc = U - (w @ U)[None, :] if U.ndim == 2 else U - w @ U
    Wc = W - (w @ W)[None, :] if W.ndim == 2 else W - w @ W
    if U.ndim == 1:
        return Wc.T @ (w * Uc) if W.ndim == 2 else w @ (Uc * Wc)
    if W.ndim == 1:
        return Uc.T @ (w * Wc)
    return Uc.T @ (w[:, None] * Wc)


def _glm_parts(obj: TiltedObjective, theta: Any) -> dict[str, Any]:
    _require_sample_level(obj, "glm_statistics")
    _require_glm(obj)
    if not math.isfinite(obj.t):
        raise ValueError(f"GLM statistics need a finite tilt; `objective` has t={obj.t}")
    xp = obj.xp
    th = xp.reshape(_theta_of(obj, theta), (obj.n_features,))
    X, y = obj.X, obj.y
    loss: Any = obj.loss  # a GLM loss: has cumulant/statistic/offset
    t = float(obj.t)
    z = X @ th
    A, A1, A2 = loss.cumulant(z, xp=xp)
    tau = as_array(loss.statistic(y, xp=xp), xp, name="y", dtype=th.dtype)
    c = as_array(loss.offset(y, xp=xp), xp, name="y", dtype=th.dtype)
    ell = obj.losses(th)
    p = _prior(obj, th)
    # Gamma and pi: the tilted risk/weights of the "losses" s_i = -theta . T_i
    s = -(tau * z)
    Gamma = t * tilted_risk(s, t, weights=p, xp=xp)
    pi = tilted_weights(s, t, weights=p, xp=xp)
    Lambda = t * tilted_risk(ell, t, weights=p, xp=xp)
    w = tilted_weights(ell, t, weights=p, xp=xp)
    T = tau[:, None] * X
    M = pi @ T
    V = _wcov(T, T, pi)
    Mw = w @ T
    Vw = _wcov(T, T, w)
    return {
        "xp": xp,
        "th": th,
        "t": t,
        "X": X,
        "A": A,
        "A1": A1,
        "A2": A2,
        "c": c,
        "ell": ell,
        "T": T,
        "w": w,
        "stats": GLMStatistics(
            Lambda=Lambda,
            Gamma=Gamma,
            M=M,
            V=0.5 * (V + V.T),
            statistic_weights=pi,
            weights=w,
            tilted_M=Mw,
            tilted_V=0.5 * (Vw + Vw.T),
            cumulant_mean=xp.sum(w * (A + c)),
            cumulant_grad=X.T @ (w * A1),
            cumulant_hess=X.T @ ((w * A2)[:, None] * X),
        ),
    }


def glm_statistics(objective: Any, theta: Any) -> GLMStatistics:
    r"""The paper's GLM quantities :math:`\Lambda, \Gamma, \mathcal M, \mathcal V` at ``theta``.

    For a scalar GLM loss :math:`\ell_i = A(x_i^\top\theta) - \theta^\top T_i + c(y_i)`
    with :math:`T_i = T(y_i) x_i` (squared: :math:`A(z) = z^2`, :math:`T = 2y`,
    :math:`c = y^2`, no factor 1/2; logistic: :math:`A = \mathrm{softplus}`,
    :math:`T = y`, :math:`c = 0`) and prior weights :math:`p` (the paper's :math:`1/N`):

    * :math:`\Lambda(t;\theta) = t R(t;\theta) = \log \sum_i p_i e^{t\ell_i}`
      (empirical cumulant generating function; the ridge penalty is not included);
    * :math:`\Gamma(t;\theta) = \log \sum_i p_i e^{-t\theta^\top T_i}`
      (empirical log-partition function);
    * :math:`\mathcal M = \sum_i \pi_i T_i`,
      :math:`\mathcal V = \sum_i \pi_i (T_i - \mathcal M)(T_i - \mathcal M)^\top` with
      :math:`\pi_i = p_i e^{-t\theta^\top T_i - \Gamma(t;\theta)}`.

    These follow the paper's definitions exactly; its lemmas on the partial derivatives
    of :math:`\Gamma` and :math:`\mathcal M` (:math:`\partial_t\Gamma = -\theta^\top
    \mathcal M`, :math:`\nabla_\theta\Gamma = -t\mathcal M`, :math:`\partial_t\mathcal M
    = -\mathcal V\theta`, :math:`\nabla_\theta\mathcal M = -t\mathcal V`) hold for any
    data. The paper's identity :math:`\Lambda = tA(\theta) + \Gamma` needs one cumulant
    shared by all samples and no offset; for regression GLMs the fields ``weights``,
    ``tilted_M``, ``tilted_V`` and ``cumulant_*`` hold the ``w``-averaged versions that
    make the lemmas on :math:`\Lambda` hold (e.g.
    :math:`\partial_t\Lambda = \bar A - \theta^\top \bar{\mathcal M}` and
    :math:`\nabla_\theta\Lambda = t(\overline{\nabla A} - \bar{\mathcal M})`); see the
    module notes and :class:`GLMStatistics`.

    Parameters
    ----------
    objective : TiltedObjective
        Sample-level objective with a scalar GLM loss (``loss.is_glm``) at a finite tilt.
    theta : array of shape (d,)

    Returns
    -------
    GLMStatistics
        Arrays in the objective's namespace, dtype and device.

    Raises
    ------
    ValueError
        Non-GLM loss or infinite tilt.
    NotImplementedError
        Hierarchical objective.

    See Also
    --------
    tiltlab.theory.check_path : Checks the paper's GLM lemmas along a path.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab import TiltedObjective, tilted_risk
    >>> from tiltlab.diagnostics import glm_statistics
    >>> X = np.ones((4, 1))                       # intercept only: the paper's setting
    >>> y = np.array([0, 1, 1, 1])
    >>> obj = TiltedObjective("logistic", X, y, t=1.5)
    >>> st = glm_statistics(obj, np.array([0.3]))
    >>> A = np.logaddexp(0.0, 0.3)                # softplus, shared by all samples
    >>> bool(np.isclose(st.Lambda, 1.5 * A + st.Gamma))
    True
    """
    obj = _check_objective(objective)
    return _glm_parts(obj, theta)["stats"]
