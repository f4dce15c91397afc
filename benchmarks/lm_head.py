"""The chunked tilted cross-entropy head against the full-logits path: time and memory.

Both paths compute the value and the gradients of ``hidden`` and ``weight`` (and ``bias``)
of the tilted risk of the per-token cross-entropy of ``hidden @ weight.T + bias``:

- ``full``: the logits ``z`` (tokens x vocabulary) formed at once,
  ``F.cross_entropy(z, y, reduction="none")``, the tilted risk written with
  ``torch.logsumexp``, then ``backward()``;
- ``chunked``: :func:`tiltlab.torch.tilted_cross_entropy` (the logits of a chunk of
  tokens at a time), then ``backward()``.

**Time**: forward + backward, both paths interleaved in one process after a warm-up call,
the median of the repeats, in process CPU time (``time.process_time``) and in wall time.

**Memory**: each path runs once in a fresh child process. The child makes a small call (imports,
first-call buffers), allocates and touches
the inputs, reads its resident set size, resets the kernel's high-water mark
(``/proc/self/clear_refs``, Linux), runs forward + backward once, and reads the mark
(``VmHWM``): the difference is the peak memory the path needs above its inputs, gradients
included (PyTorch's CPU allocator is not seen by ``tracemalloc``; the kernel's mark sees
every page touched). On CUDA: ``torch.cuda.max_memory_allocated`` above the inputs. The
ratio against the size of the full logits in float32 is printed.

Usage::

    python benchmarks/lm_head.py                       # 8192 tokens, vocabulary 32768
    python benchmarks/lm_head.py --tokens 2048 --vocab 8192 --repeats 3
    python benchmarks/lm_head.py --device cuda         # time and max_memory_allocated
    python benchmarks/lm_head.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time


def _inputs(torch, n, v, h, device, dtype, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    hid = (torch.randn(n, h, generator=g) / math.sqrt(h)).to(device, dtype)
    W = torch.randn(v, h, generator=g).to(device, dtype)
    b = torch.zeros(v).to(device, dtype)
    y = torch.randint(0, v, (n,), generator=g).to(device)
    return [x.requires_grad_(True) for x in (hid, W, b)] + [y]


def _full(torch, hid, W, b, y, t):
    z = hid @ W.T + b
    l = torch.nn.functional.cross_entropy(z.float(), y, reduction="none")
    if t == 0:
        return l.mean()
    return (torch.logsumexp(t * l, 0) - math.log(l.shape[0])) / t


def _chunked(torch, hid, W, b, y, t, chunk):
    from tiltlab.torch import tilted_cross_entropy

    return tilted_cross_entropy(hid, W, y, t, bias=b, chunk_size=chunk)


def _step(torch, path, xs, t, chunk):
    hid, W, b, y = xs
    for x in (hid, W, b):
        x.grad = None
    val = _full(torch, hid, W, b, y, t) if path == "full" else _chunked(
        torch, hid, W, b, y, t, chunk)
    val.backward()
    return val


def _sync(torch, device):
    if device == "cuda":
        torch.cuda.synchronize()


def _child(args) -> None:
    """One forward + backward of one path: prints the peak memory above the inputs."""
    import torch

    # a small call first: imports and the libraries' first-call buffers are not the path's
    small = _inputs(torch, 64, 256, args.hidden, args.device, torch.float32)
    _step(torch, args.child, small, args.t, args.chunk)
    del small
    xs = _inputs(torch, args.tokens, args.vocab, args.hidden, args.device, torch.float32)
    if args.device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        _step(torch, args.child, xs, args.t, args.chunk)
        torch.cuda.synchronize()
        print(torch.cuda.max_memory_allocated() - base)
        return
    before = _status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:  # resets the peak (VmHWM) to VmRSS
        f.write("5")
    _step(torch, args.child, xs, args.t, args.chunk)
    print(_status("VmHWM") - before)


def _status(field: str) -> int:
    """A memory figure of this process from ``/proc/self/status``, in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status (Linux only)")


def _memory(args, path) -> int:
    cmd = [sys.executable, __file__, "--child", path, "--tokens", str(args.tokens),
           "--vocab", str(args.vocab), "--hidden", str(args.hidden), "--t", str(args.t),
           "--device", args.device]
    if args.chunk:
        cmd += ["--chunk", str(args.chunk)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--t", type=float, default=-1.0)
    p.add_argument("--chunk", type=int, default=None)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        _child(args)
        return {}
    import torch

    xs = _inputs(torch, args.tokens, args.vocab, args.hidden, args.device, torch.float32)
    times = {"full": [], "chunked": []}
    cpu = {"full": [], "chunked": []}
    vals = {}
    for path in times:  # warm-up
        vals[path] = float(_step(torch, path, xs, args.t, args.chunk).detach())
    for _ in range(args.repeats):
        for path in times:
            _sync(torch, args.device)
            w0, c0 = time.perf_counter(), time.process_time()
            _step(torch, path, xs, args.t, args.chunk)
            _sync(torch, args.device)
            times[path].append(time.perf_counter() - w0)
            cpu[path].append(time.process_time() - c0)
    logits = args.tokens * args.vocab * 4
    mem = {path: _memory(args, path) for path in times}
    res = {
        "tokens": args.tokens, "vocab": args.vocab, "hidden": args.hidden, "t": args.t,
        "device": args.device,
        "device_name": (torch.cuda.get_device_name() if args.device == "cuda"
                        else platform.processor() or platform.machine()),
        "torch": torch.__version__, "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "wall_s": {k: statistics.median(v) for k, v in times.items()},
        "cpu_s": {k: statistics.median(v) for k, v in cpu.items()},
        "peak_above_inputs_bytes": mem,
        "full_logits_bytes": logits,
        "value": vals,
    }
    w, c = res["wall_s"], res["cpu_s"]
    print(f"{args.tokens} tokens x {args.vocab} vocabulary, hidden {args.hidden}, "
          f"t={args.t}, {args.device} ({res['device_name']}), {res['threads']} threads")
    print(f"{'path':8} {'wall s':>8} {'cpu s':>8} {'peak MiB':>9} {'/ logits':>9}")
    for k in times:
        print(f"{k:8} {w[k]:8.3f} {c[k]:8.3f} {mem[k] / 2**20:9.1f} {mem[k] / logits:9.3f}")
    print(f"chunked / full: wall {w['chunked'] / w['full']:.2f}, "
          f"cpu {c['chunked'] / c['full']:.2f}; values {vals['chunked']:.6f} "
          f"{vals['full']:.6f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    main()
