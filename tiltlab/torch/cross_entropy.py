"""The tilted cross-entropy of a language model's output layer, without its logits:
:func:`tilted_cross_entropy` and :func:`token_cross_entropy`."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from typing import Any

import torch

from tiltlab._compat import library_namespace, real_number
from tiltlab.accumulator import NonFiniteLosses, TiltState
from tiltlab.risk import (
    hierarchical_risk,
    hierarchical_weights,
    tilted_weights,
)

__all__ = ["tilted_cross_entropy", "token_cross_entropy"]

xp_torch = library_namespace(torch.empty(0))

#: logits (tokens x vocabulary) formed at once by default: 4 Mi elements, 16 MiB in float32
CHUNK_ELEMENTS = 1 << 22
#: the fewest tokens of a default chunk: beyond ``CHUNK_ELEMENTS / MIN_TOKENS`` (64 Ki)
#: words the vocabulary is taken in blocks too
MIN_TOKENS = 64

LEVELS = ("token", "sequence", "group")
NORMALIZE = ("weights", "count")


@dataclass
class _Spec:
    t: float
    tilts: tuple | None
    level: str
    normalize: str
    ignore_index: int
    chunk: int
    vblock: int


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 accumulation for 16-bit inputs, the input's own precision otherwise."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _logits_pass(h, tgt, W, b, grad: bool, vblock: int):
    """Per-token cross-entropy of one chunk, with what its gradients need when ``grad``:
    ``softmax - onehot`` and its product with ``W`` (the hidden states' gradient of each
    token's loss), or, with the vocabulary in blocks of ``vblock``, a :class:`_Blocks`
    that recomputes them block by block in :func:`_add_chunk`."""
    V = W.shape[0]
    if vblock < V:
        lse = torch.full(tgt.shape, -math.inf, dtype=h.dtype, device=h.device)
        zt = torch.zeros(tgt.shape, dtype=h.dtype, device=h.device)
        for v0 in range(0, V, vblock):
            v1 = min(v0 + vblock, V)
            z = _block_logits(h, W, b, v0, v1)
            lse = torch.logaddexp(lse, torch.logsumexp(z, dim=-1))
            inside = (tgt >= v0) & (tgt < v1)
            at = z.gather(1, (tgt - v0).clamp(0, v1 - v0 - 1)[:, None])[:, 0]
            zt = zt + torch.where(inside, at, 0.0)
        return lse - zt, (_Blocks(h, tgt, W, b, lse, vblock) if grad else None), None
    z = h @ W.T
    if b is not None:
        z += b
    lse = torch.logsumexp(z, dim=-1)
    loss = lse - z.gather(1, tgt[:, None])[:, 0]
    if not grad:
        return loss, None, None
    z -= lse[:, None]
    z.exp_()
    z[torch.arange(z.shape[0], device=z.device), tgt] -= 1.0
    return loss, z, z @ W


def _block_logits(h, W, b, v0, v1):
    z = h @ W[v0:v1].T
    if b is not None:
        z += b[v0:v1]
    return z


@dataclass
class _Blocks:
    """A chunk's ``softmax - onehot`` by vocabulary blocks, recomputed when used."""

    h: Any
    tgt: Any
    W: Any
    b: Any
    lse: Any
    vblock: int

    def blocks(self):
        V = self.W.shape[0]
        for v0 in range(0, V, self.vblock):
            v1 = min(v0 + self.vblock, V)
            z = _block_logits(self.h, self.W, self.b, v0, v1)
            z -= self.lse[:, None]
            z.exp_()
            rows = torch.nonzero((self.tgt >= v0) & (self.tgt < v1))[:, 0]
            z[rows, self.tgt[rows] - v0] -= 1.0
            yield v0, v1, z


def _check(hidden, weight, targets, bias, spec, groups):
    if not isinstance(hidden, torch.Tensor) or hidden.ndim not in (2, 3):
        raise ValueError("`hidden` must be a tensor of shape (N, H) or (B, T, H)")
    if not hidden.dtype.is_floating_point:
        raise TypeError(f"`hidden` must be floating, got {hidden.dtype}")
    if not isinstance(weight, torch.Tensor) or weight.ndim != 2:
        raise ValueError("`weight` must be a tensor of shape (V, H)")
    if weight.shape[1] != hidden.shape[-1]:
        raise ValueError(
            f"`weight` has {weight.shape[1]} columns, `hidden` {hidden.shape[-1]} features"
        )
    if not isinstance(targets, torch.Tensor) or targets.shape != hidden.shape[:-1]:
        raise ValueError(
            f"`targets` must be a tensor of shape {tuple(hidden.shape[:-1])} (one per token)"
        )
    if targets.dtype.is_floating_point or targets.dtype == torch.bool:
        raise TypeError(f"`targets` must hold integer class indices, got {targets.dtype}")
    if bias is not None and (not isinstance(bias, torch.Tensor) or bias.shape != weight.shape[:1]):
        raise ValueError(f"`bias` must be a tensor of shape ({weight.shape[0]},)")
    valid = targets != spec.ignore_index
    bad = valid & ((targets < 0) | (targets >= weight.shape[0]))
    if bool(bad.any()):
        raise ValueError(f"`targets` must lie in [0, {weight.shape[0]}) or equal `ignore_index`")
    if spec.level in ("sequence", "group") and hidden.ndim != 3 and groups is None:
        raise ValueError(f"level={spec.level!r} needs `hidden` of shape (B, T, H)")
    return valid


def _parse(t, tilts, level, normalize, ignore_index, chunk_size, V):
    if level not in LEVELS:
        raise ValueError(f"`level` must be one of {LEVELS}, got {level!r}")
    if normalize not in NORMALIZE:
        raise ValueError(f"`normalize` must be one of {NORMALIZE}, got {normalize!r}")
    if level == "group":
        if tilts is None or t is not None:
            raise ValueError("level='group' takes `tilts=(t_outer, t_inner)` and no `t`")
        if isinstance(tilts, (str, bytes)) or len(tilts) != 2:
            raise ValueError("`tilts` must be a pair (t_outer, t_inner)")
        tl = (real_number(tilts[0], "tilts[0]"), real_number(tilts[1], "tilts[1]"))
        if normalize != "weights":
            raise ValueError("normalize='count' is defined for level='token' or 'sequence'")
        tt = 0.0
    else:
        if tilts is not None:
            raise ValueError("`tilts` needs level='group'; give `t` for this level")
        tl = None
        tt = 0.0 if t is None else real_number(t, "t")
        if normalize == "count" and math.isinf(tt):
            raise ValueError("normalize='count' needs a finite `t`")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"`ignore_index` must be an int, got {ignore_index!r}")
    vblock = V
    if chunk_size is None:
        chunk = max(MIN_TOKENS, CHUNK_ELEMENTS // max(V, 1))
        if chunk * V > CHUNK_ELEMENTS:
            vblock = max(1, CHUNK_ELEMENTS // chunk)
    else:
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"`chunk_size` must be a positive int, got {chunk_size!r}")
        chunk = chunk_size
    return _Spec(tt, tl, level, normalize, ignore_index, chunk, vblock)


def token_cross_entropy(hidden, weight, targets, *, bias=None, ignore_index=-100, chunk_size=None):
    """Per-token cross-entropy of ``hidden @ weight.T + bias`` without the logits.

    The losses of ignored tokens are 0. Differentiable: the backward pass recomputes the
    logits chunk by chunk (the per-token losses can then go into any reduction, such as
    :class:`TiltedLoss`).

    Parameters
    ----------
    hidden : Tensor, shape (..., H)
    weight : Tensor, shape (V, H)
    targets : Tensor of int, shape (...)
    bias : Tensor, shape (V,), optional
    ignore_index : int, default -100
    chunk_size : int, optional
        Tokens per chunk (default: about 4 Mi logits at once).

    Returns
    -------
    Tensor, shape (...)
        The losses, in float32 for 16-bit inputs, else in the input's dtype.

    Examples
    --------
    >>> import torch
    >>> from tiltlab.torch import token_cross_entropy
    >>> h, W = torch.randn(5, 3), torch.randn(7, 3)
    >>> y = torch.tensor([0, 6, 2, -100, 1])
    >>> l = token_cross_entropy(h, W, y)
    >>> ref = torch.nn.functional.cross_entropy(h @ W.T, y, reduction="none")
    >>> bool(torch.allclose(l, ref, atol=1e-5))
    True
    """
    spec = _parse(None, None, "token", "weights", ignore_index, chunk_size, weight.shape[0])
    valid = _check(hidden, weight, targets, bias, spec, None)
    return _TokenLosses.apply(hidden, weight, bias, targets, valid, spec)


class _TokenLosses(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, valid, spec):
        acc = _acc_dtype(hidden.dtype)
        h2 = hidden.reshape(-1, hidden.shape[-1])
        y = targets.reshape(-1)
        ok = valid.reshape(-1)
        W = weight.to(acc)
        b = None if bias is None else bias.to(acc)
        out = torch.zeros(h2.shape[0], dtype=acc, device=hidden.device)
        idx = torch.nonzero(ok)[:, 0]
        for s in range(0, idx.shape[0], spec.chunk):
            j = idx[s : s + spec.chunk]
            out[j] = _logits_pass(h2[j].to(acc), y[j], W, b, False, spec.vblock)[0]
        ctx.save_for_backward(hidden, weight, bias, targets, valid)
        ctx.spec = spec
        return out.reshape(targets.shape)

    @staticmethod
    def backward(ctx, go):
        hidden, weight, bias, targets, valid = ctx.saved_tensors
        acc = _acc_dtype(hidden.dtype)
        h2 = hidden.reshape(-1, hidden.shape[-1])
        y, ok, g = targets.reshape(-1), valid.reshape(-1), go.reshape(-1).to(acc)
        W = weight.to(acc)
        b = None if bias is None else bias.to(acc)
        dh = torch.zeros(h2.shape, dtype=acc, device=hidden.device)
        gw = torch.zeros(W.shape, dtype=acc, device=W.device)
        gb = None if b is None else torch.zeros(b.shape, dtype=acc, device=W.device)
        idx = torch.nonzero(ok)[:, 0]
        spec = ctx.spec
        for s in range(0, idx.shape[0], spec.chunk):
            j = idx[s : s + spec.chunk]
            hj = h2[j].to(acc)
            _, G, dhj = _logits_pass(hj, y[j], W, b, True, spec.vblock)
            a = g[j]
            blocked = _add_chunk(gw, gb, G, hj, a, 1.0)
            dh[j] = (dhj if blocked is None else blocked) * a[:, None]
        return (
            dh.reshape(hidden.shape).to(hidden.dtype),
            gw.to(weight.dtype),
            None if gb is None else gb.to(bias.dtype),
            None,
            None,
            None,
        )


def tilted_cross_entropy(
    hidden: Any,
    weight: Any,
    targets: Any,
    t: Any = None,
    *,
    bias: Any = None,
    tilts: Any = None,
    level: str = "token",
    groups: Any = None,
    ignore_index: int = -100,
    normalize: str = "weights",
    chunk_size: int | None = None,
) -> Any:
    r"""The tilted risk of the per-token cross-entropy of ``z = hidden @ weight.T + bias``,
    computed without the logits.

    The tokens are processed in chunks of ``chunk_size`` (whole sequences at sequence and
    group level); for each chunk the logits are formed, reduced to the per-token losses
    and to their gradients, and dropped. At token and sequence level this is one pass:
    the chunks' tilted states (:class:`tiltlab.accumulator.TiltState`, which carries the
    gradients of ``weight`` and ``bias`` as sums rescaled at every merge, as
    FlashAttention rescales its output) merge exactly, so the value and the gradients do
    not depend on ``chunk_size``. At group level the tilted weights of the hierarchy
    (:func:`tiltlab.hierarchical_weights`) need every loss first: a first pass computes
    the losses, a second the gradients. By default a chunk holds about 4 Mi logits and at
    least 64 tokens; beyond 64 Ki words the vocabulary is taken in blocks too (an online
    log-sum-exp over the blocks, then the blocks again for the gradients). 16-bit inputs
    are accumulated in float32.

    With ``normalize="weights"`` (default) the value is the tilted risk
    :math:`R_t = \frac1t \log \frac1N \sum_i e^{t \ell_i}` of the items (non-ignored
    tokens at ``level="token"``; at ``level="sequence"`` each sequence's mean token loss;
    at ``level="group"`` the two-level risk of :func:`tiltlab.hierarchical_risk` with
    ``tilts=(t_outer, t_inner)``), with ``t = 0`` (the mean), ``t = +-inf`` (the largest,
    smallest item) and tiny ``t`` exact, and the gradient
    :math:`\sum_i w_i \nabla \ell_i` with the tilted weights :math:`w_i`.

    With ``normalize="count"`` the value is
    :math:`\frac1N \sum_i \mathrm{sg}(e^{t \ell_i})\, \ell_i` (``sg``: no gradient
    through it), whose gradient is that of the tilted risk times the batch's mean
    :math:`\frac1N \sum_j e^{t \ell_j}`. At ``t = -1`` this is Dynamic Fine-Tuning (each
    token's loss weighted by its detached probability).

    Parameters
    ----------
    hidden : Tensor, shape (N, H) or (B, T, H)
        The last hidden states.
    weight : Tensor, shape (V, H)
        The output layer (the ``lm_head``'s weight).
    targets : Tensor of int, shape (N,) or (B, T)
        The next tokens; ``ignore_index`` marks tokens without a loss.
    t : float, optional
        The tilt at token and sequence level (default 0: the mean, as
        ``reduction="mean"``).
    bias : Tensor, shape (V,), optional
    tilts : (float, float), optional
        ``(t_outer, t_inner)`` for ``level="group"``.
    level : {"token", "sequence", "group"}
    groups : Tensor of int, optional
        For ``level="group"``: a label per token (shape of ``targets``) or per sequence
        (shape ``(B,)``; the items are then the sequences' mean losses).
    ignore_index : int, default -100
    normalize : {"weights", "count"}
    chunk_size : int, optional
        Tokens per chunk (default: about 4 Mi logits, 16 MiB in float32, at once, and at
        least 64 tokens; a given ``chunk_size`` takes the whole vocabulary at once).

    Returns
    -------
    Tensor
        A scalar in the dtype of ``hidden``, differentiable in ``hidden``, ``weight`` and
        ``bias``.

    Raises
    ------
    ValueError
        Shapes that do not fit, targets out of range, no token with a loss, an unknown
        ``level`` or ``normalize``, ``tilts`` without ``level="group"``.
    TypeError
        Non-integer ``targets``, a tilt that is not a real number.
    tiltlab.accumulator.NonFiniteLosses
        A NaN or infinite loss at a token with a loss (from NaN or infinite ``hidden``,
        ``weight`` or ``bias``), at every level and with either normaliser (a
        ``ValueError``). Ignored tokens are never read.

    Examples
    --------
    >>> import torch
    >>> from tiltlab.torch import tilted_cross_entropy
    >>> torch.manual_seed(0)
    <torch._C.Generator object at ...>
    >>> h = torch.randn(6, 4, requires_grad=True)
    >>> W = torch.randn(10, 4, requires_grad=True)
    >>> y = torch.randint(0, 10, (6,))
    >>> loss = tilted_cross_entropy(h, W, y, -1.0, chunk_size=4)
    >>> l = torch.nn.functional.cross_entropy(h @ W.T, y, reduction="none")
    >>> ref = -(torch.logsumexp(-l, 0) - torch.log(torch.tensor(6.0)))
    >>> bool(torch.isclose(loss, ref))
    True
    >>> loss.backward()
    >>> W.grad.shape
    torch.Size([10, 4])
    """
    if not isinstance(weight, torch.Tensor) or weight.ndim != 2:
        raise ValueError("`weight` must be a tensor of shape (V, H)")
    spec = _parse(t, tilts, level, normalize, ignore_index, chunk_size, weight.shape[0])
    if groups is not None and level != "group":
        raise ValueError("`groups` goes with level='group', and only")
    valid = _check(hidden, weight, targets, bias, spec, groups)
    if not bool(valid.any()):
        raise ValueError("`targets`: every token is `ignore_index`, no loss to reduce")
    return _TiltedHead.apply(hidden, weight, bias, targets, valid, groups, spec)


class _TiltedHead(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, valid, groups, spec):
        grad = any(x is not None and x.requires_grad for x in (hidden, weight, bias))
        value, dh, gw, gb = _head(hidden, weight, bias, targets, valid, groups, spec, grad)
        if grad:
            ctx.save_for_backward(dh, gw, *(() if gb is None else (gb,)))
        ctx.dtypes = (hidden.dtype, weight.dtype, None if bias is None else bias.dtype)
        return value.to(hidden.dtype)

    @staticmethod
    def backward(ctx, go):
        saved = ctx.saved_tensors
        g = go.to(saved[0].dtype)
        hd, wd, bd = ctx.dtypes
        if bool(g == 1.0):  # the usual loss.backward(): no copy of the gradients
            scaled = saved
        else:
            scaled = [x * g for x in saved]
        dh, gw = scaled[0].to(hd), scaled[1].to(wd)
        gb = scaled[2].to(bd) if len(saved) > 2 else None
        return dh, gw, gb, None, None, None, None


def _head(hidden, weight, bias, targets, valid, groups, spec, grad):
    acc = _acc_dtype(hidden.dtype)
    W = weight.to(acc)
    b = None if bias is None else bias.to(acc)
    if spec.level == "token" or hidden.ndim == 2:
        h2 = hidden.reshape(-1, hidden.shape[-1])
        n_seq, T = h2.shape[0], 1
    else:
        n_seq, T = hidden.shape[0], hidden.shape[1]
        h2 = hidden.reshape(-1, hidden.shape[-1])
    y, ok = targets.reshape(-1), valid.reshape(-1)
    dh = torch.zeros(h2.shape, dtype=acc, device=hidden.device) if grad else None
    if spec.level == "group":
        return _group_head(h2, y, ok, W, b, groups, spec, grad, dh, (n_seq, T), hidden)
    seq = spec.level == "sequence"
    # the tokens with a loss, in order (sequence by sequence): ignored positions are never
    # read, so that whatever they hold (padding, NaN) reaches neither value nor gradient
    idx_all = torch.nonzero(ok)[:, 0]
    if seq:
        counts = ok.reshape(n_seq, T).sum(1)
        per = max(1, spec.chunk // T)
        sizes = counts.tolist()
        offsets = [0, *itertools.accumulate(sizes)]  # each sequence's first place in idx_all
        # chunks of whole sequences; a chunk of sequences without a token with a loss has
        # no item and adds nothing (its state would be the merge's identity)
        starts = [
            (s * T, min(s + per, n_seq) * T)
            for s in range(0, n_seq, per)
            if offsets[min(s + per, n_seq)] > offsets[s]
        ]
    else:
        starts = [
            (s, min(s + spec.chunk, idx_all.shape[0]))
            for s in range(0, idx_all.shape[0], spec.chunk)
        ]
    state = TiltState.empty(spec.t, xp=xp_torch, dtype=acc, device=hidden.device)
    one = torch.ones((), dtype=acc, device=hidden.device)
    zero = torch.zeros((), dtype=acc, device=hidden.device)
    gw = torch.zeros(W.shape, dtype=acc, device=W.device) if grad else None
    gb = torch.zeros(b.shape, dtype=acc, device=W.device) if grad and b is not None else None
    value = zero
    items = []  # item losses, for the weights of the hidden states' gradient
    n_items = sum(c > 0 for c in sizes) if seq else idx_all.shape[0]
    for lo, hi in starts:
        j = idx_all[offsets[lo // T] : offsets[hi // T]] if seq else idx_all[lo:hi]
        hj = h2[j].to(acc)
        loss, G, dhj = _logits_pass(hj, y[j], W, b, grad, spec.vblock)
        if seq:
            cnt = counts[lo // T : hi // T].to(acc)
            keep = cnt > 0
            # the chunk's losses in its (sequences, T) layout, zero where ignored
            dense = torch.zeros(hi - lo, dtype=acc, device=hidden.device)
            dense[j - lo] = loss
            item = dense.reshape(-1, T).sum(1)[keep] / cnt[keep]
            row = torch.div(j - lo, T, rounding_mode="floor")  # each token's sequence

            # token weight of an item weight a: a / count on the sequence's tokens
            def spread(a, keep=keep, cnt=cnt, row=row):
                full = torch.zeros(keep.shape, dtype=acc, device=a.device)
                full[keep] = a / cnt[keep]
                return full[row]
        else:
            item = loss

            def spread(a):
                return a

        items.append(item)
        if grad and dhj is not None:
            dh[j] = dhj
        if spec.normalize == "count":
            a = torch.exp(spec.t * item) / n_items
            value = value + (a * item).sum()
            if grad:
                _set_rows(dh, j, _add_chunk(gw, gb, G, hj, spread(a), 1.0))
            continue
        # the chunk's state; the gradients' accumulators are rescaled with the factors the
        # merge applies to the two states' sums (markers (1, 0) and (0, 1), read back)
        box = {}

        def sums(pe, box=box):
            box["pe"] = pe
            return (zero, one)

        try:
            chunk = TiltState.from_block(
                item.detach(), spec.t, sums=sums if grad else None, xp=xp_torch
            )
        except NonFiniteLosses:
            raise _nonfinite() from None
        state = state.merge(chunk)
        if grad:
            ra, rb = (float(x) for x in state.sums)
            if "pe" in box and rb != 0.0:
                _set_rows(dh, j, _add_chunk(gw, gb, G, hj, spread(box["pe"]) * rb, ra))
            elif ra != 1.0:
                gw.mul_(ra)
                if gb is not None:
                    gb.mul_(ra)
            state = replace(state, sums=(one, zero))
    items_all = torch.cat(items)
    if spec.normalize == "count":
        _check_finite(items_all)  # one read, as the tilted states' extremes check it
        w_items = torch.exp(spec.t * items_all) / n_items
    else:
        value = state.risk()
        if grad:
            w_items = tilted_weights(items_all, spec.t, check_finite=False)
            gw /= state.s
            if gb is not None:
                gb /= state.s
    if not grad:
        return value, None, None, None
    dh = _scale_rows(dh, w_items, ok, counts if seq else None, T, acc)
    return value, dh.reshape(hidden.shape), gw, gb


def _nonfinite() -> NonFiniteLosses:
    return NonFiniteLosses(
        "`hidden`, `weight` and `bias` give NaN or infinite losses at tokens with a loss; "
        "pass finite values"
    )


def _check_finite(items):
    """Raise :func:`_nonfinite` when an item loss is NaN or infinite."""
    if not bool(torch.isfinite(items).all()):
        raise _nonfinite()


def _add_chunk(gw, gb, G, h, a, beta):
    """``gw <- beta gw + sum_i a_i G_i^T h_i`` and ``gb <- beta gb + sum_i a_i G_i`` in
    place (one buffer of each gradient). With the vocabulary in blocks (``G`` a
    :class:`_Blocks`) it also returns the hidden states' gradients ``G_i W`` of the
    chunk's tokens (unweighted), else None."""
    if isinstance(G, _Blocks):
        dh = torch.zeros(h.shape, dtype=h.dtype, device=h.device)
        ha = h * a[:, None]
        for v0, v1, z in G.blocks():
            dh.addmm_(z, G.W[v0:v1])
            gw[v0:v1].addmm_(z.T, ha, beta=beta)
            if gb is not None:
                gb[v0:v1].addmv_(z.T, a, beta=beta)
        return dh
    gw.addmm_(G.T, h * a[:, None], beta=beta)
    if gb is not None:
        gb.addmv_(G.T, a, beta=beta)
    return None


def _set_rows(dh, j, rows):
    """The hidden states' gradients of a chunk computed with the vocabulary in blocks."""
    if rows is not None:
        dh[j] = rows


def _scale_rows(dh, w_items, ok, counts, T, acc):
    """The hidden states' gradient: each token's row times its weight."""
    if counts is None:
        wt = torch.zeros(ok.shape, dtype=acc, device=ok.device)
        wt[ok] = w_items.to(acc)
    else:
        keep = counts > 0
        ws = torch.zeros(counts.shape, dtype=acc, device=ok.device)
        ws[keep] = w_items.to(acc) / counts[keep].to(acc)
        wt = (ws[:, None] * ok.reshape(-1, T).to(acc)).reshape(-1)
    return dh * wt[:, None]


def _group_head(h2, y, ok, W, b, groups, spec, grad, dh, shape, hidden):
    """Two passes: the losses, the hierarchy's weights, then the gradients."""
    n_seq, T = shape
    acc = W.dtype
    if groups is None:
        raise ValueError("level='group' needs `groups` (a label per token or per sequence)")
    g = torch.as_tensor(groups, device=h2.device)
    if g.dtype.is_floating_point:
        raise TypeError("`groups` must hold integer labels")
    per_seq = hidden.ndim == 3 and g.shape == (n_seq,)
    if not per_seq and g.numel() != ok.numel():
        raise ValueError(
            "`groups` must hold a label per token (the shape of `targets`) or per "
            "sequence (shape (B,))"
        )
    idx = torch.nonzero(ok)[:, 0]
    losses = torch.zeros(ok.shape, dtype=acc, device=h2.device)
    for s in range(0, idx.shape[0], spec.chunk):
        j = idx[s : s + spec.chunk]
        losses[j] = _logits_pass(h2[j].to(acc), y[j], W, b, False, spec.vblock)[0]
    if per_seq:
        m = ok.reshape(n_seq, T).to(acc)
        cnt = m.sum(1)
        keep = cnt > 0
        items = (losses.reshape(n_seq, T) * m).sum(1)[keep] / cnt[keep]
        labels = g[keep]
    else:
        items, labels = losses[ok], g.reshape(-1)[ok]
    _check_finite(items)
    value = hierarchical_risk(items, labels, spec.tilts, check_finite=False)
    if not grad:
        return value, None, None, None
    w = hierarchical_weights(items, labels, spec.tilts, check_finite=False)
    if per_seq:
        ws = torch.zeros(n_seq, dtype=acc, device=h2.device)
        ws[keep] = w / cnt[keep]
        wt = (ws[:, None] * m).reshape(-1)
    else:
        wt = torch.zeros(ok.shape, dtype=acc, device=h2.device)
        wt[ok] = w
    gw = torch.zeros(W.shape, dtype=acc, device=W.device)
    gb = None if b is None else torch.zeros(b.shape, dtype=acc, device=W.device)
    for s in range(0, idx.shape[0], spec.chunk):
        j = idx[s : s + spec.chunk]
        hj = h2[j].to(acc)
        _, G, dhj = _logits_pass(hj, y[j], W, b, True, spec.vblock)
        blocked = _add_chunk(gw, gb, G, hj, wt[j], 1.0)
        dh[j] = (dhj if blocked is None else blocked) * wt[j][:, None]
    return value, dh.reshape(hidden.shape), gw, gb
