"""A language model trained on corrupted target sequences, in miniature.

A small causal transformer (written here: token and position embeddings, causal
self-attention blocks, a linear output layer) learns a synthetic language generated on
the spot: a Markov chain over a vocabulary of 32 tokens whose next token is a fixed
permutation of the current one with probability 0.8 (uniform otherwise). A share (20, 40,
60%) of the training sequences is corrupted: all their targets follow another fixed
permutation (a systematic, not a random, error). Nothing is downloaded.

Methods, all through :func:`tiltlab.torch.tilted_cross_entropy` (the chunked head):

* ``ERM``: the mean token cross-entropy (``t = 0``);
* ``DFT``: Dynamic Fine-Tuning, ``normalize="count"`` at ``t = -1``;
* ``TERM-token``: the tilted risk over the batch's tokens at ``t < 0``;
* ``TERM-sequence``: the tilted risk over the batch's sequences (each its mean token loss)
  at ``t < 0``;
* ``Oracle``: ERM on the clean training sequences only.

Reported: clean held-out token accuracy and mean token loss, mean and standard error
over seeds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import numpy as np

from ._common import Reproduction, check_choices, format_grid, make_row, progress_bar, seed_list

__all__ = ["METHODS", "NOISE", "lm_noisy_targets"]

#: The methods compared, in the table's row order.
METHODS = ("ERM", "DFT", "TERM-token", "TERM-sequence", "Oracle")
#: Shares of corrupted training sequences.
NOISE = (0.2, 0.4, 0.6)

VOCAB, LENGTH, P_RULE = 32, 24, 0.8


def _rules(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The language's rule and the corruption's rule: permutations of the vocabulary (the
    next token of each token), the corruption's differing from the rule's everywhere."""
    rng = np.random.default_rng([seed, 1])
    rule = rng.permutation(VOCAB)
    shift = rng.integers(1, VOCAB)
    return rule, rule[(np.arange(VOCAB) + shift) % VOCAB]


def _sequences(n: int, rule: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``n`` sequences of ``LENGTH + 1`` tokens of the Markov chain of ``rule``."""
    x = np.empty((n, LENGTH + 1), dtype=np.int64)
    x[:, 0] = rng.integers(0, VOCAB, n)
    for k in range(1, LENGTH + 1):
        follow = rng.random(n) < P_RULE
        x[:, k] = np.where(follow, rule[x[:, k - 1]], rng.integers(0, VOCAB, n))
    return x


def _corrupt(x: np.ndarray, bad: np.ndarray) -> np.ndarray:
    """Corrupted targets of the sequences ``x``: every next token by the ``bad`` rule."""
    return bad[x[:, :-1]]


def _model(torch, dim: int, layers: int, seed: int):
    nn = torch.nn
    torch.manual_seed(seed)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.attn = nn.MultiheadAttention(dim, 2, batch_first=True)
            self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

        def forward(self, h, mask):
            a = self.ln1(h)
            h = h + self.attn(a, a, a, attn_mask=mask, need_weights=False)[0]
            return h + self.mlp(self.ln2(h))

    class CausalLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(VOCAB, dim)
            self.pos = nn.Embedding(LENGTH, dim)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln = nn.LayerNorm(dim)
            self.head = nn.Linear(dim, VOCAB, bias=False)

        def hidden(self, x):
            T = x.shape[1]
            mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device=x.device), 1)
            h = self.tok(x) + self.pos(torch.arange(T, device=x.device))
            for blk in self.blocks:
                h = blk(h, mask)
            return self.ln(h)

    return CausalLM()


def _objective(method: str, t_token: float, t_sequence: float):
    from ..torch import tilted_cross_entropy

    def loss(h, W, y):
        if method == "DFT":
            return tilted_cross_entropy(h, W, y, -1.0, normalize="count")
        if method == "TERM-token":
            return tilted_cross_entropy(h, W, y, t_token)
        if method == "TERM-sequence":
            return tilted_cross_entropy(h, W, y, t_sequence, level="sequence")
        return tilted_cross_entropy(h, W, y, 0.0)

    return loss


def _train_eval(torch, method, x, y, x_test, y_test, *, seed, epochs, device, t_token,
                t_sequence, dim, layers):
    threads = torch.get_num_threads()
    if device == "cpu":  # a network this small gains nothing from a second thread
        torch.set_num_threads(1)
    try:
        return _fit(torch, method, x, y, x_test, y_test, seed=seed, epochs=epochs,
                    device=device, t_token=t_token, t_sequence=t_sequence, dim=dim,
                    layers=layers)
    finally:
        torch.set_num_threads(threads)


def _fit(torch, method, x, y, x_test, y_test, *, seed, epochs, device, t_token, t_sequence,
         dim, layers):
    net = _model(torch, dim, layers, seed).to(device)
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    loss_fn = _objective(method, t_token, t_sequence)
    X = torch.as_tensor(x, device=device)
    Y = torch.as_tensor(y, device=device)
    g = torch.Generator().manual_seed(seed)
    batch = 32
    for _ in range(epochs):
        order = torch.randperm(X.shape[0], generator=g)
        for s in range(0, X.shape[0], batch):
            j = order[s : s + batch].to(device)
            opt.zero_grad()
            loss_fn(net.hidden(X[j]), net.head.weight, Y[j]).backward()
            opt.step()
    net.eval()
    with torch.no_grad():
        Xt, Yt = torch.as_tensor(x_test, device=device), torch.as_tensor(y_test, device=device)
        z = net.head(net.hidden(Xt))
        ce = torch.nn.functional.cross_entropy(z.reshape(-1, VOCAB), Yt.reshape(-1))
        acc = (z.argmax(-1) == Yt).double().mean()
    return float(acc), float(ce)


def lm_noisy_targets(
    seeds: int | Sequence[int] = 3,
    *,
    quick: bool = False,
    progress: bool = False,
    noise: Sequence[float] = NOISE,
    methods: Sequence[str] = METHODS,
    t_token: float = -1.0,
    t_sequence: float = -4.0,
    device: str = "cpu",
    epochs: int | None = None,
    n_train: int | None = None,
) -> Reproduction:
    """Clean held-out token accuracy and loss of a small causal transformer trained with
    ERM, DFT, token- and sequence-level TERM on partly corrupted target sequences.

    Parameters
    ----------
    seeds : int or sequence of int, default 3
        Number of seeds (language, data, initialisation), or the seeds.
    quick : bool, default False
        Fewer training sequences and epochs (for CI and a first look).
    progress : bool, default False
        Show a progress bar.
    noise : sequence of float, default (0.2, 0.4, 0.6)
        Shares of corrupted training sequences, in [0, 1).
    methods : sequence of str, default all of ``METHODS``
    t_token, t_sequence : float
        The (negative) tilts of token- and sequence-level TERM.
    device : str, default "cpu"
        ``"cuda"`` to train on a GPU.
    epochs, n_train : int, optional
        Override the number of epochs and of training sequences.

    Returns
    -------
    Reproduction
        Rows ``(method, "noise p", metric, "test")`` with metrics ``token_accuracy`` and
        ``token_loss`` on clean held-out sequences.

    See Also
    --------
    tiltlab.torch.tilted_cross_entropy : The chunked tilted head every method trains with.
    tiltlab.reproduce.run : Runs an experiment by its command name.

    Examples
    --------
    >>> from tiltlab.reproduce import lm_noisy_targets
    >>> rep = lm_noisy_targets(seeds=1, noise=[0.4], methods=["ERM"], epochs=1, n_train=64)
    >>> sorted({r["metric"] for r in rep.rows})
    ['token_accuracy', 'token_loss']
    """
    import torch

    from ._deep import check_device

    device = check_device(device)
    methods = check_choices(methods, METHODS, "methods")
    levels = [float(p) for p in noise]
    if not levels or any(not (0.0 <= p < 1.0) for p in levels):
        raise ValueError(f"`noise` must be shares in [0, 1), got {noise!r}")
    for name, t in (("t_token", t_token), ("t_sequence", t_sequence)):
        if not (math.isfinite(t) and t < 0):
            raise ValueError(f"`{name}` must be a negative number, got {t!r}")
    seeds_ = seed_list(seeds)
    n_epochs = int(epochs) if epochs is not None else (6 if quick else 12)
    n = int(n_train) if n_train is not None else (384 if quick else 1024)
    dim, layers = (32, 1) if quick else (64, 2)
    started = time.perf_counter()
    res: dict[tuple[str, float, str], list[float]] = {}
    bar = progress_bar(progress, len(seeds_) * len(levels) * len(methods), "lm-noisy-targets")
    for seed in seeds_:
        rule, bad = _rules(seed)
        rng = np.random.default_rng([seed, 2])
        x_all = _sequences(n, rule, rng)
        test = _sequences(256, rule, rng)
        x_test, y_test = test[:, :-1], test[:, 1:]
        for p in levels:
            corrupted = np.random.default_rng([seed, 3, int(p * 100)]).random(n) < p
            y = x_all[:, 1:].copy()
            y[corrupted] = _corrupt(x_all[corrupted], bad)
            x = x_all[:, :-1]
            for m in methods:
                bar.set_postfix_str(f"seed={seed} noise={p:g} {m}")
                keep = ~corrupted if m == "Oracle" else np.ones(n, dtype=bool)
                acc, loss = _train_eval(
                    torch, m, x[keep], y[keep], x_test, y_test, seed=seed, epochs=n_epochs,
                    device=device, t_token=t_token, t_sequence=t_sequence, dim=dim,
                    layers=layers,
                )
                res.setdefault((m, p, "token_accuracy"), []).append(acc)
                res.setdefault((m, p, "token_loss"), []).append(loss)
                bar.update(1)
    bar.close()
    rows = [
        make_row(m, f"noise {p:g}", metric, "test", res[(m, p, metric)])
        for metric in ("token_accuracy", "token_loss")
        for m in methods
        for p in levels
    ]
    bayes = P_RULE + (1 - P_RULE) / VOCAB
    notes = (
        f"A synthetic Markov language over {VOCAB} tokens (the rule's next token with "
        f"probability {P_RULE}), sequences of {LENGTH} targets; all targets of a corrupted "
        "sequence follow another rule.\n"
        f"A causal transformer ({layers} block(s), width {dim}) with Adam (batch 32, "
        f"{n_epochs} epochs, {n} training sequences). TERM: t = {t_token:g} over tokens, "
        f"t = {t_sequence:g} over sequences; DFT: normalize='count' at t = -1; Oracle: ERM "
        "on the clean sequences only.\n"
        f"The best possible token accuracy is {bayes:.3f}. {len(seeds_)} seed(s), "
        f"{time.perf_counter() - started:.1f} s."
    )
    return Reproduction(
        experiment="lm-noisy-targets",
        rows=rows,
        title=(
            f"tiltlab reproduce lm-noisy-targets: {len(methods)} methods, corrupted target "
            f"sequences, {len(seeds_)} seed(s), clean held-out tokens"
        ),
        table=format_grid(
            rows,
            row_of=lambda r: r["method"],
            col_of=lambda r: r["setting"],
            block_of=lambda r: r["metric"],
        ),
        notes=notes,
        curves={"results": res, "noise": levels},
    )
