"""Tilt schedules and the random batch sizes of the multilevel estimator."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from .checks import check_positive_int, tilt_value

__all__ = ["linear_schedule", "LinearSchedule", "MLMCBatchSampler", "level_probabilities"]


def linear_schedule(start: float, stop: float, steps: int):
    """A tilt that moves linearly from ``start`` to ``stop`` over ``steps`` steps, then stays.

    The paper's recipe for noisy labels scales t linearly from 0 to its final (negative)
    value over training: a constant t = -2 from the first step can collapse a network
    that has not learned anything yet (every loss is high, so the tilted weights single
    out whatever the initial network happens to fit), while the ramp lets it first learn
    the easy, mostly clean samples.

    Parameters
    ----------
    start, stop : float
        Tilt at step 0 and from step ``steps`` on.
    steps : int
        Length of the ramp (at least 1).

    Returns
    -------
    callable
        ``schedule(step) -> t``. It uses only arithmetic and comparisons, so it also
        accepts a 0-d tensor step (as :class:`tiltlab.torch.TiltedLoss` passes it, which
        keeps ``torch.compile`` graphs free of breaks).

    Examples
    --------
    >>> from tiltlab.minibatch import linear_schedule
    >>> schedule = linear_schedule(0.0, -2.0, steps=100)
    >>> schedule(0), schedule(50), schedule(100), schedule(1000)
    (0.0, -1.0, -2.0, -2.0)
    """
    return LinearSchedule(start, stop, steps)


class LinearSchedule:
    """The schedule :func:`linear_schedule` returns: a module-level class, so that objects
    holding one pickle (``torch.save(model)``, spawn-based workers)."""

    def __init__(self, start: float, stop: float, steps: int):
        start = tilt_value(start, "start")
        stop = tilt_value(stop, "stop")
        if not (math.isfinite(start) and math.isfinite(stop)):
            raise ValueError("`start` and `stop` must be finite")
        self.start, self.stop = start, stop
        self.steps = check_positive_int(steps, "steps")

    def __call__(self, step: Any) -> Any:
        frac = step / self.steps
        frac = frac - (frac - 1) * (frac > 1)  # min(frac, 1) without a Python branch
        # exact at both ends (start + (stop - start) * 1 can miss stop by an ulp)
        return self.start * (1 - frac) + self.stop * frac

    def __repr__(self) -> str:
        return f"linear_schedule({self.start!r}, {self.stop!r}, steps={self.steps})"


def level_probabilities(max_level: int) -> np.ndarray:
    """``P(J = j)`` for ``j = 1..max_level``: proportional to ``2**-j`` (truncated geometric).

    Examples
    --------
    >>> from tiltlab.minibatch import level_probabilities
    >>> level_probabilities(3).round(4).tolist()
    [0.5714, 0.2857, 0.1429]
    """
    max_level = check_positive_int(max_level, "max_level")
    p = 0.5 ** np.arange(1, max_level + 1)
    return p / p.sum()


class MLMCBatchSampler:
    """Batches of random size ``base_batch_size * 2**J`` for the multilevel estimator.

    ``J`` is drawn from :func:`level_probabilities` (``P(J = j)`` proportional to
    ``2**-j``, ``j = 1..max_level``), so the mean batch size grows only linearly in
    ``max_level`` while the bias removed is that of the largest batch,
    ``base_batch_size * 2**max_level``. Within a batch the indices are distinct (drawn
    without replacement) and batches are independent. Use it as a PyTorch ``DataLoader``'s
    ``batch_sampler``::

        sampler = MLMCBatchSampler(len(dataset), base_batch_size=16, max_level=5, seed=0)
        loader = DataLoader(dataset, batch_sampler=sampler)
        tilt = MinibatchTilt(1.0, estimator="mlmc", base_batch_size=16, max_level=5)

    Parameters
    ----------
    n_samples : int
        Size of the data set.
    base_batch_size : int
        Size of the smallest batch (level 0).
    max_level : int
        Largest level; ``base_batch_size * 2**max_level`` must not exceed ``n_samples``.
    num_batches : int, optional
        Batches per pass (``len(sampler)``); default: as many as make about one epoch.
    seed : int or numpy.random.Generator, optional
        Seed of the level and index draws (runs are reproducible).

    Examples
    --------
    >>> from tiltlab.minibatch import MLMCBatchSampler
    >>> sampler = MLMCBatchSampler(100, base_batch_size=4, max_level=3, seed=0)
    >>> sizes = [len(batch) for batch in sampler]
    >>> set(sizes) <= {8, 16, 32}, len(sizes) == len(sampler)
    (True, True)
    """

    def __init__(
        self,
        n_samples: int,
        base_batch_size: int,
        max_level: int,
        *,
        num_batches: int | None = None,
        seed: Any = None,
    ):
        self.n_samples = check_positive_int(n_samples, "n_samples")
        self.base_batch_size = check_positive_int(base_batch_size, "base_batch_size")
        self.max_level = check_positive_int(max_level, "max_level")
        if self.base_batch_size * 2**self.max_level > self.n_samples:
            raise ValueError(
                f"the largest batch, `base_batch_size` * 2**`max_level` = "
                f"{self.base_batch_size * 2**self.max_level}, exceeds `n_samples` = "
                f"{self.n_samples}"
            )
        self.probabilities = level_probabilities(self.max_level)
        mean_size = self.base_batch_size * float(
            np.sum(self.probabilities * 2.0 ** np.arange(1, self.max_level + 1))
        )
        if num_batches is None:
            num_batches = max(1, round(self.n_samples / mean_size))
        self.num_batches = check_positive_int(num_batches, "num_batches")
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return self.num_batches

    def draw_level(self) -> int:
        """One level ``J`` in ``1..max_level``."""
        return int(self.rng.choice(self.max_level, p=self.probabilities)) + 1

    def __iter__(self) -> Iterator[list[int]]:
        for _ in range(self.num_batches):
            size = self.base_batch_size * 2 ** self.draw_level()
            yield self.rng.choice(self.n_samples, size=size, replace=False).tolist()
