"""``maitred calibrate``: measure an engine profile on this machine with torch.

It builds a small decoder-only transformer from a config (random weights; only the shapes
matter), then times what the simulator's step model needs — prefill cost per token, decode cost
per sequence, attention cost per context token — plus host↔device copy bandwidth with pinned
memory, KV bytes per token and free device memory. On a GPU this fits the simulator to that
GPU; on a CPU it runs too and says so in the profile (``device``), for trying the pipeline.
torch is an optional extra (``pip install 'maitred[calibrate]'``).
"""

import time
from dataclasses import dataclass
from typing import Any

from maitred.sim.profile import EngineProfile


@dataclass(frozen=True, slots=True)
class ModelShape:
    layers: int = 28
    hidden: int = 3584
    heads: int = 28
    kv_heads: int = 4
    head_dim: int = 128
    intermediate: int = 18944
    dtype_bytes: int = 2

    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes


CPU_SHAPE = ModelShape(layers=2, hidden=512, heads=8, kv_heads=2, head_dim=64, intermediate=1408, dtype_bytes=4)


def _timed(fn, device, repeats: int = 3) -> float:
    import torch

    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - began)
    return best


def resolve_device(device_name: str | None = None) -> Any:
    """The torch device to measure: ``device_name``, or cuda when there is one, else cpu.
    ValueError for a name torch does not know or a device this machine does not have, so a
    typo fails at once instead of after minutes of measuring."""
    try:
        import torch
    except ImportError:
        raise RuntimeError("maitred calibrate needs torch: pip install 'maitred[calibrate]'") from None
    try:
        device = torch.device(device_name or ("cuda" if torch.cuda.is_available() else "cpu"))
    except RuntimeError:
        raise ValueError(f"{device_name!r} is not a torch device (e.g. cpu, cuda, cuda:1)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{device_name!r}: no CUDA device on this machine")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"{device_name!r}: this machine has {torch.cuda.device_count()} CUDA devices")
    return device


def calibrate(device_name: str | None = None, shape: ModelShape | None = None, *, progress=None) -> EngineProfile:
    import torch
    import torch.nn.functional as F

    device = resolve_device(device_name)
    shape = shape or (ModelShape() if device.type == "cuda" else CPU_SHAPE)
    dtype = torch.float16 if shape.dtype_bytes == 2 and device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    step = progress or (lambda message: None)

    def layer_weights():
        def w(*size):
            return torch.randn(*size, device=device, dtype=dtype) * 0.02

        q = shape.heads * shape.head_dim
        kv = shape.kv_heads * shape.head_dim
        return (
            w(shape.hidden, q + 2 * kv),
            w(q, shape.hidden),
            w(shape.hidden, 2 * shape.intermediate),
            w(shape.intermediate, shape.hidden),
        )

    layers = [layer_weights() for _ in range(shape.layers)]
    group = shape.heads // shape.kv_heads

    def forward(x, cache_len: int, batch: int):
        """One transformer pass over ``x`` (batch, tokens, hidden) attending to ``cache_len`` cached tokens."""
        tokens = x.shape[1]
        for qkv_w, o_w, up_w, down_w in layers:
            qkv = x @ qkv_w
            q, k, v = qkv.split(
                [shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.kv_heads * shape.head_dim], -1
            )
            q = q.view(batch, tokens, shape.heads, shape.head_dim).transpose(1, 2)
            k = k.view(batch, tokens, shape.kv_heads, shape.head_dim).transpose(1, 2)
            v = v.view(batch, tokens, shape.kv_heads, shape.head_dim).transpose(1, 2)
            if cache_len:
                past = torch.randn(batch, shape.kv_heads, cache_len, shape.head_dim, device=device, dtype=dtype)
                k, v = torch.cat([past, k], 2), torch.cat([past, v], 2)
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
            attn = F.scaled_dot_product_attention(q, k, v, is_causal=cache_len == 0)
            x = x + attn.transpose(1, 2).reshape(batch, tokens, -1) @ o_w
            gate, up = (x @ up_w).chunk(2, -1)
            x = x + (F.silu(gate) * up) @ down_w
        return x

    def run(batch: int, tokens: int, cache_len: int) -> float:
        x = torch.randn(batch, tokens, shape.hidden, device=device, dtype=dtype)
        with torch.no_grad():
            return _timed(lambda: forward(x, cache_len, batch), device)

    small, large = (256, 1024) if device.type == "cpu" else (1024, 8192)
    step("prefill")
    t_small, t_large = run(1, small, 0), run(1, large, 0)
    prefill_per_token = max((t_large - t_small) / (large - small), 1e-9)
    step("decode")
    b1, b2 = (1, 8) if device.type == "cpu" else (1, 64)
    d1, d2 = run(b1, 1, 128), run(b2, 1, 128)
    per_seq = max((d2 - d1) / (b2 - b1), 1e-9)
    base = max(d1 - per_seq, 1e-6)
    step("attention")
    c1, c2 = (128, 2048) if device.type == "cpu" else (512, 16384)
    a1, a2 = run(b2, 1, c1), run(b2, 1, c2)
    per_ctx = max((a2 - a1) / (b2 * (c2 - c1)), 1e-12)
    step("copy bandwidth")
    h2d, d2h = _bandwidth(torch, device)
    kv_bytes = shape.kv_bytes_per_token()
    free = _free_bytes(torch, device)
    return EngineProfile(
        name=f"calibrated on {device.type} ({_device_name(torch, device)})",
        gpu_kv_tokens=max(int(free * 0.8 / kv_bytes), 1),
        kv_bytes_per_token=kv_bytes,
        step_base_s=base,
        prefill_s_per_token=prefill_per_token,
        decode_s_per_seq=per_seq,
        attention_s_per_ctx_token=per_ctx,
        h2d_bytes_per_s=h2d,
        d2h_bytes_per_s=d2h,
        device=device.type,
        notes=(
            f"measured by maitred calibrate with torch {torch.__version__}; model shape {shape}; "
            + ("CPU run: the figures describe this CPU, not a GPU" if device.type == "cpu" else "GPU run")
        ),
    )


def _bandwidth(torch, device) -> tuple[float, float]:
    size = 64 * 1024 * 1024 if device.type == "cpu" else 512 * 1024 * 1024
    pin = device.type == "cuda"
    host = torch.empty(size, dtype=torch.uint8, pin_memory=pin)
    dev = torch.empty(size, dtype=torch.uint8, device=device)
    h2d = size / _timed(lambda: dev.copy_(host, non_blocking=pin), device)
    d2h = size / _timed(lambda: host.copy_(dev, non_blocking=pin), device)
    return h2d, d2h


def _free_bytes(torch, device) -> int:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    import os

    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") * 0.5)


def _device_name(torch, device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    return platform.processor() or platform.machine()
