"""Simulated federated training of a multinomial logistic model: FedAvg, q-FFL, AFL, TERM.

One process plays the server and every device (host NumPy, float64). The model is
``softmax(x W + b)`` with the cross-entropy loss; a device's loss is its mean training
loss (TERM may tilt the summed one). Each server has the interface
``run(data, rounds, rng) -> parameters``:

* :class:`FedAvg` (McMahan et al., 2017): each round samples ``clients`` devices without
  replacement (uniformly, or with ``sampling="size"`` proportionally to their training
  sizes), runs
  ``local_steps`` minibatch SGD steps on each from the global model, and averages the
  local models.
* :class:`QFFL` (q-FedAvg, Li, Sanjabi, Beirami and Smith, 2020): the same local work;
  with ``L = 1 / lr``, ``Delta_k = L (w - w_k)``, the server steps
  ``w <- w - sum_k F_k^q Delta_k / sum_k (q F_k^(q-1) ||Delta_k||^2 + L F_k^q)``, where
  ``F_k`` is device ``k``'s loss at the global model; ``q = 0`` is FedAvg.
* :class:`AFL` (agnostic federated learning, Mohri, Sivek and Suresh, 2019): every
  device computes its full gradient each round; the server takes a gradient step on
  ``sum_k lambda_k F_k`` and a projected gradient-ascent step on the mixture weights
  ``lambda`` (on the simplex); the output is the average of the iterates.
* :class:`TermFL` (the TERM paper's federated TERM, as in the authors' ``tilting.py``
  trainer): the local work of FedAvg; each sampled device reports its training loss
  ``F_k`` at the global model before its local steps, and the server steps
  ``w <- w - sum_k a_k Delta_k`` with ``a_k = exp(t (F_k - max_j F_j)) / (m z)``, where
  ``m`` is the number of sampled devices and ``z`` a running average (factor
  ``memory = 1/2`` per round) of the round's ``mean_k exp(t (F_k - max_j F_j))``: the
  stochastic normaliser of the paper's Algorithm 2 at the device level, kept on the
  max-shifted scale as the authors do. ``device_loss="sum"`` tilts the device's summed
  training loss (the authors' choice, with their summed hinge loss), ``"mean"`` (the
  default) its mean loss. Two deliberate differences: the authors start ``z`` at 0 (so their first
  rounds take doubled steps) and average the already-weighted local models, a further
  factor ``1/m``; here ``z`` starts at the first round's value and there is no extra
  ``1/m``, so that at ``t = 0`` (either loss) the server is FedAvg exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["AFL", "QFFL", "FedAvg", "TermFL", "device_accuracies", "device_losses"]


def _design(X: np.ndarray) -> np.ndarray:
    return np.concatenate([X, np.ones((X.shape[0], 1))], axis=1)


def _loss_grad(W: np.ndarray, Z: np.ndarray, y: np.ndarray, need_grad: bool = True):
    """Mean cross-entropy of ``softmax(Z W)`` and its gradient in ``W`` (``Z`` has the bias
    column)."""
    logits = Z @ W
    top = logits.max(axis=1, keepdims=True)
    e = np.exp(logits - top)
    s = e.sum(axis=1, keepdims=True)
    n = Z.shape[0]
    loss = float(np.mean(np.log(s[:, 0]) + top[:, 0] - logits[np.arange(n), y]))
    if not need_grad:
        return loss, None
    p = e / s
    p[np.arange(n), y] -= 1.0
    return loss, Z.T @ p / n


def device_losses(W: np.ndarray, Xs, ys) -> np.ndarray:
    """Each device's mean cross-entropy loss at parameters ``W`` (``(d + 1) x C``).

    Parameters
    ----------
    W : numpy.ndarray, shape (d + 1, C)
        Weights; the last row is the bias.
    Xs : sequence of numpy.ndarray
        Each device's features ``(n_k, d)``.
    ys : sequence of numpy.ndarray
        Each device's integer labels ``(n_k,)`` in ``0 .. C - 1``.

    Returns
    -------
    numpy.ndarray, shape (K,)
        The mean cross-entropy of ``softmax(x W)`` on each device.

    See Also
    --------
    device_accuracies : The accuracy on each device.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.reproduce.federated import device_losses
    >>> W = np.zeros((2, 2))  # uniform predictions: every loss is log 2
    >>> device_losses(W, [np.array([[1.0], [-1.0]])], [np.array([0, 1])]).round(6)
    array([0.693147])
    """
    return np.array([_loss_grad(W, _design(X), y, False)[0] for X, y in zip(Xs, ys, strict=True)])


def device_accuracies(W: np.ndarray, Xs, ys) -> np.ndarray:
    """Each device's accuracy of ``argmax(x W)`` (``W`` of shape ``(d + 1) x C``).

    Parameters
    ----------
    W : numpy.ndarray, shape (d + 1, C)
        Weights; the last row is the bias.
    Xs : sequence of numpy.ndarray
        Each device's features ``(n_k, d)``.
    ys : sequence of numpy.ndarray
        Each device's integer labels ``(n_k,)``.

    Returns
    -------
    numpy.ndarray, shape (K,)
        The fraction of each device's rows whose label is the predicted class.

    See Also
    --------
    device_losses : The loss on each device.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.reproduce.federated import device_accuracies
    >>> W = np.array([[1.0, -1.0], [0.0, 0.0]])  # class 0 when x > 0
    >>> device_accuracies(W, [np.array([[1.0], [-1.0]])], [np.array([0, 0])])
    array([0.5])
    """
    return np.array(
        [
            float(np.mean(np.argmax(_design(X) @ W, axis=1) == y))
            for X, y in zip(Xs, ys, strict=True)
        ]
    )


@dataclass
class _Devices:
    Z: list
    y: list
    sizes: np.ndarray

    @classmethod
    def of(cls, data) -> _Devices:
        return cls([_design(X) for X in data.X_train], list(data.y_train), data.train_sizes)


@dataclass
class FedAvg:
    """Federated averaging of local SGD models (see the module notes).

    Parameters
    ----------
    lr : float, default 0.1
        Local SGD step size.
    clients : int, default 10
        Devices per round.
    local_steps : int, default 20
        Local minibatch SGD steps per round.
    batch_size : int, default 10
        Local minibatch size (drawn with replacement).
    sampling : {"uniform", "size"}, default "uniform"
        How the devices of a round are drawn (without replacement): uniformly, or with
        probability proportional to their training sizes.

    See Also
    --------
    QFFL, TermFL, AFL : The other servers.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.reproduce.federated import FedAvg, device_accuracies
    >>> from tiltlab.datasets import synthetic_federated
    >>> data = synthetic_federated(n_devices=5, seed=0)
    >>> W = FedAvg(clients=3, local_steps=5).run(data, rounds=3,
    ...                                         rng=np.random.default_rng(0))
    >>> W.shape
    (61, 10)
    """

    lr: float = 0.1
    clients: int = 10
    local_steps: int = 20
    batch_size: int = 10
    sampling: str = "uniform"

    def _sample(self, dev: _Devices, rng: np.random.Generator) -> np.ndarray:
        m = min(self.clients, len(dev.Z))
        p = dev.sizes / dev.sizes.sum() if self.sampling == "size" else None
        return rng.choice(len(dev.Z), m, replace=False, p=p)

    def _local(self, W: np.ndarray, Z: np.ndarray, y: np.ndarray, rng) -> np.ndarray:
        W = W.copy()
        n = Z.shape[0]
        for _ in range(self.local_steps):
            idx = rng.integers(0, n, min(self.batch_size, n))
            W -= self.lr * _loss_grad(W, Z[idx], y[idx])[1]
        return W

    def _device_loss(self, W: np.ndarray, dev: _Devices, k: int) -> float:
        """Device ``k``'s mean training loss at the global model."""
        return _loss_grad(W, dev.Z[k], dev.y[k], False)[0]

    def _aggregate(self, W, updates, losses) -> np.ndarray:
        return W - np.mean(updates, axis=0)

    def run(self, data, rounds: int, rng: np.random.Generator) -> np.ndarray:
        """Train for ``rounds`` rounds from zero.

        Parameters
        ----------
        data : tiltlab.datasets.FederatedData
            The devices' training data.
        rounds : int
            Number of communication rounds.
        rng : numpy.random.Generator
            Draws the devices of each round and the local minibatches.

        Returns
        -------
        numpy.ndarray, shape (d + 1, C)
            The global model's weights (the last row is the bias).

        See Also
        --------
        device_accuracies : Evaluates the returned weights.

        Examples
        --------
        >>> import numpy as np
        >>> from tiltlab.reproduce.federated import FedAvg, device_losses
        >>> from tiltlab.datasets import synthetic_federated
        >>> data = synthetic_federated(n_devices=5, seed=0)
        >>> W = FedAvg(clients=2, local_steps=5).run(data, 2, np.random.default_rng(0))
        >>> bool(device_losses(W, data.X_train, data.y_train).mean() < np.log(10))
        True
        """
        dev = _Devices.of(data)
        W = np.zeros((data.n_features + 1, data.n_classes))
        for _ in range(rounds):
            chosen = self._sample(dev, rng)
            losses = np.array([self._device_loss(W, dev, k) for k in chosen])
            updates = [W - self._local(W, dev.Z[k], dev.y[k], rng) for k in chosen]
            W = self._aggregate(W, updates, losses)
        return W


@dataclass
class QFFL(FedAvg):
    """q-FedAvg: FedAvg's local work, updates scaled by ``F_k^q`` with a Lipschitz step.

    ``q`` is the fairness parameter (``q = 0``: FedAvg); see the module notes.

    Parameters
    ----------
    lr, clients, local_steps, batch_size, sampling
        As in :class:`FedAvg`; the Lipschitz constant of the server step is ``1 / lr``.
    q : float, default 1.0
        Fairness parameter: larger values weigh the devices with large losses more.

    See Also
    --------
    FedAvg, TermFL, AFL : The other servers.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.reproduce.federated import QFFL
    >>> from tiltlab.datasets import synthetic_federated
    >>> data = synthetic_federated(n_devices=5, seed=0)
    >>> QFFL(q=1.0, clients=3, local_steps=5).run(data, 3, np.random.default_rng(0)).shape
    (61, 10)
    """

    q: float = 1.0

    def _aggregate(self, W, updates, losses) -> np.ndarray:
        L = 1.0 / self.lr
        F = np.asarray(losses) + 1e-10
        deltas = [L * u for u in updates]
        num = sum(f**self.q * dl for f, dl in zip(F, deltas, strict=True))
        den = sum(
            self.q * f ** (self.q - 1) * float(np.sum(dl * dl)) + L * f**self.q
            for f, dl in zip(F, deltas, strict=True)
        )
        return W - num / den


@dataclass
class TermFL(FedAvg):
    """Federated TERM: device updates weighted by ``exp(t F_k)`` over a running normaliser.

    ``t`` is the tilt across devices, ``memory`` the weight of the past in the running
    normaliser (1/2 in the authors' trainer), ``device_loss`` the tilted device loss
    (``"sum"`` or ``"mean"`` of its training losses); see the module notes.

    Parameters
    ----------
    lr, clients, local_steps, batch_size, sampling
        As in :class:`FedAvg`.
    t : float, default 0.1
        The tilt across devices (``0``: FedAvg).
    memory : float, default 0.5
        Weight of the past in the running normaliser ``Z`` (in ``[0, 1)``).
    device_loss : {"mean", "sum"}, default "mean"
        The device loss that is tilted: the mean of its training losses, or their sum
        (the authors' choice, which ranks devices mostly by size on uneven data).

    See Also
    --------
    FedAvg, QFFL, AFL : The other servers.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.datasets import synthetic_federated
    >>> from tiltlab.reproduce.federated import FedAvg, TermFL
    >>> data = synthetic_federated(n_devices=8, n_features=4, n_classes=3, seed=0)
    >>> fedavg = FedAvg(clients=4).run(data, 5, np.random.default_rng(0))
    >>> flat = TermFL(clients=4, t=0.0, device_loss="sum").run(
    ...     data, 5, np.random.default_rng(0))
    >>> bool(np.allclose(flat, fedavg))  # t = 0 is FedAvg
    True
    """

    t: float = 0.1
    memory: float = 0.5
    device_loss: str = "mean"

    def _device_loss(self, W: np.ndarray, dev: _Devices, k: int) -> float:
        """Device ``k``'s training loss at the global model: summed or mean."""
        mean = super()._device_loss(W, dev, k)
        if self.device_loss not in ("sum", "mean"):
            raise ValueError(f"`device_loss` must be 'sum' or 'mean', got {self.device_loss!r}")
        return mean * dev.y[k].shape[0] if self.device_loss == "sum" else mean

    def run(self, data, rounds: int, rng: np.random.Generator) -> np.ndarray:
        """As :meth:`FedAvg.run`, with the tilted server step.

        Parameters
        ----------
        data : tiltlab.datasets.FederatedData
            The devices' training data.
        rounds : int
            Number of communication rounds.
        rng : numpy.random.Generator
            Draws the devices of each round and the local minibatches.

        Returns
        -------
        numpy.ndarray, shape (d + 1, C)
            The global model's weights (the last row is the bias).

        See Also
        --------
        FedAvg.run : The untilted server.

        Examples
        --------
        >>> import numpy as np
        >>> from tiltlab.reproduce.federated import TermFL
        >>> from tiltlab.datasets import synthetic_federated
        >>> data = synthetic_federated(n_devices=5, seed=0)
        >>> TermFL(t=1.0, clients=3, local_steps=5).run(data, 2, np.random.default_rng(0)).shape
        (61, 10)
        """
        self._z: float | None = None
        return super().run(data, rounds, rng)

    def _aggregate(self, W, updates, losses) -> np.ndarray:
        shifted = np.exp(self.t * (np.asarray(losses) - np.max(losses)))  # in (0, 1]
        batch = float(np.mean(shifted))
        if self._z is None or self.memory == 0:
            self._z = batch
        else:
            self._z = self.memory * self._z + (1.0 - self.memory) * batch
        weights = shifted / (self._z * len(updates))
        return W - sum(w * u for w, u in zip(weights, updates, strict=True))


@dataclass
class AFL:
    """Agnostic federated learning: gradient descent on ``sum_k lambda_k F_k``, ascent on
    ``lambda`` over the simplex, every device every round; returns the averaged iterate.

    Parameters
    ----------
    lr : float, default 0.1
        Step size of the model.
    lr_lambda : float, default 0.01
        Step size of the mixture weights.

    See Also
    --------
    FedAvg, QFFL, TermFL : The sampled-device servers.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.reproduce.federated import AFL
    >>> from tiltlab.datasets import synthetic_federated
    >>> data = synthetic_federated(n_devices=5, seed=0)
    >>> AFL(lr=0.1, lr_lambda=0.01).run(data, 3, np.random.default_rng(0)).shape
    (61, 10)
    """

    lr: float = 0.1
    lr_lambda: float = 0.01

    def run(self, data, rounds: int, rng: np.random.Generator) -> np.ndarray:
        """Train for ``rounds`` rounds from zero; returns the average of the iterates.

        Parameters
        ----------
        data : tiltlab.datasets.FederatedData
            The devices' training data.
        rounds : int
            Number of rounds; every device computes its full gradient in each.
        rng : numpy.random.Generator
            Unused (the method is deterministic); accepted for the common interface.

        Returns
        -------
        numpy.ndarray, shape (d + 1, C)
            The average of the model iterates (the last row is the bias).

        See Also
        --------
        FedAvg.run : The sampled-device server.

        Examples
        --------
        >>> import numpy as np
        >>> from tiltlab.reproduce.federated import AFL
        >>> from tiltlab.datasets import synthetic_federated
        >>> data = synthetic_federated(n_devices=5, seed=0)
        >>> W1 = AFL().run(data, 2, np.random.default_rng(0))
        >>> W2 = AFL().run(data, 2, np.random.default_rng(1))
        >>> bool(np.array_equal(W1, W2))  # deterministic
        True
        """
        del rng  # deterministic: full device gradients
        dev = _Devices.of(data)
        K = len(dev.Z)
        W = np.zeros((data.n_features + 1, data.n_classes))
        lam = np.full(K, 1.0 / K)
        avg = np.zeros_like(W)
        for i in range(rounds):
            grad = np.zeros_like(W)
            losses = np.empty(K)
            for k in range(K):
                losses[k], g = _loss_grad(W, dev.Z[k], dev.y[k])
                grad += lam[k] * g
            W = W - self.lr * grad
            lam = _project_simplex(lam + self.lr_lambda * losses)
            avg += (W - avg) / (i + 1)
        return avg


def _project_simplex(v: np.ndarray) -> np.ndarray:
    """Euclidean projection onto the probability simplex (sort-based, exact)."""
    u = np.sort(v)[::-1]
    css = np.cumsum(u) - 1.0
    k = np.arange(1, v.size + 1)
    rho = int(np.nonzero(u - css / k > 0)[0][-1])
    return np.maximum(v - css[rho] / (rho + 1), 0.0)
