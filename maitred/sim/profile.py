"""Engine profiles: the numbers the simulated GPU worker runs on, as a JSON file.

The default describes an H100-class GPU (80 GB HBM3, ~3.35 TB/s) serving a 7B GQA model in
BF16 with Qwen2.5-7B's shape (28 layers, 4 KV heads of dimension 128):

- KV bytes per token: 2 (K and V) × 28 layers × 4 heads × 128 × 2 bytes = 57,344 B.
- GPU KV capacity: 80 GB × 0.9 (memory fraction) − 15.2 GB of weights − ~4 GB of activations
  and CUDA graphs ≈ 52.8 GB ≈ 920,000 tokens (SGLang's ``max_total_num_tokens`` is of this order
  for this pair).
- Step time = base + prefill tokens × per-token cost + decode sequences × per-sequence cost +
  context tokens read × per-token attention cost. Base 6 ms: reading 15.2 GB of weights at
  ~3 TB/s effective takes ~5 ms per step. Prefill 2×7.6 GFLOP per token at ~45% of 989 TFLOP/s
  ≈ 34 µs per token. Decode overhead per sequence (sampling, scheduling) ~60 µs. Attention reads
  57 KB per context token per decode step at ~3 TB/s ≈ 19 ns per token.
- Host↔GPU: PCIe Gen5 x16 moves KV pages at ~25 GB/s in practice (paged, not one big copy).
- Chunked prefill of 8,192 tokens per step; at most 256 running requests.

Two more built-in profiles, the other configurations of MORI's evaluation, by name wherever a
profile path is taken (``--profile h200-7b``), derived the same way:

- ``h200-7b``: H200 (141 GB HBM3e, 4.8 TB/s, the same 989 TFLOP/s dense BF16 as H100; NVIDIA
  H200 datasheet) with the same 7B model: 141 × 0.9 − 15.2 − 4 ≈ 107.7 GB of KV ≈ 1,880,000
  tokens; base 15.2 GB at ~4.3 TB/s effective ≈ 3.5 ms; attention 57 KB at ~4.3 TB/s ≈ 13 ns per
  context token; prefill and PCIe as H100.
- ``b200x2-70b``: two B200 (192 GB HBM3e and 8 TB/s each, 2.25 PFLOP/s dense BF16; NVIDIA DGX
  B200 datasheet) serving Llama-3.1-70B at TP=2 (80 layers, 8 KV heads of 128): KV bytes per
  token 2 × 80 × 8 × 128 × 2 = 327,680; KV capacity 384 × 0.9 − 141 (weights) − 12
  (activations) ≈ 192.6 GB ≈ 588,000 tokens; base: 70.5 GB of weights per GPU at ~7 TB/s ≈ 10 ms
  plus ~2 ms of tensor-parallel all-reduce; prefill 2 × 70.6 GFLOP per token at 45% of
  2 × 2.25 PFLOP/s ≈ 70 µs; attention 328 KB per context token over 2 × ~7 TB/s ≈ 23 ns; decode
  overhead 80 µs per sequence; host↔GPU over two PCIe Gen5 x16 links ≈ 50 GB/s.

``maitred calibrate`` measures these on real hardware and writes a profile in the same format.
"""

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path


@dataclass(frozen=True, slots=True)
class EngineProfile:
    name: str = "h100-80gb-7b-gqa (assumed)"
    gpu_kv_tokens: int = 920_000
    kv_bytes_per_token: int = 57_344
    step_base_s: float = 0.006
    prefill_s_per_token: float = 3.4e-5
    decode_s_per_seq: float = 6.0e-5
    attention_s_per_ctx_token: float = 1.9e-8
    h2d_bytes_per_s: float = 25e9
    d2h_bytes_per_s: float = 25e9
    prefill_chunk_tokens: int = 8_192
    max_running: int = 256
    device: str = "assumed"
    notes: str = "defaults from published hardware figures; see maitred/sim/profile.py"

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in (int, float, "int", "float") and not (value > 0 and math.isfinite(value)):
                raise ValueError(f"engine profile {f.name}: must be positive and finite, got {value!r}")

    def step_s(self, prefill_tokens: int, decode_seqs: int, context_tokens: int) -> float:
        return (
            self.step_base_s
            + prefill_tokens * self.prefill_s_per_token
            + decode_seqs * self.decode_s_per_seq
            + context_tokens * self.attention_s_per_ctx_token
        )

    def load_s(self, tokens: int) -> float:
        return tokens * self.kv_bytes_per_token / self.h2d_bytes_per_s

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> "EngineProfile":
        """A profile JSON file, or the name of a built-in profile (``PROFILES``)."""
        if str(path) in PROFILES:
            return PROFILES[str(path)]
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"engine profile {path}: {exc} (built-in profiles: {', '.join(PROFILES)})") from None
        if not isinstance(data, dict):
            raise ValueError(f"engine profile {path}: expected a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"engine profile {path}: unknown fields {unknown}; known: {sorted(known)}")
        types = {f.name: f.type for f in fields(cls)}
        for key, value in data.items():
            wanted = types[key]
            if wanted in (int, "int") and not (isinstance(value, int) and not isinstance(value, bool)):
                raise ValueError(f"engine profile {path}: {key} must be an integer, got {value!r}")
            if wanted in (float, "float") and not (isinstance(value, (int, float)) and not isinstance(value, bool)):
                raise ValueError(f"engine profile {path}: {key} must be a number, got {value!r}")
        return cls(**data)


#: Built-in profiles by name (sources in the module docstring).
PROFILES: dict[str, EngineProfile] = {
    "h100-7b": EngineProfile(),
    "h200-7b": EngineProfile(
        name="h200-141gb-7b-gqa (assumed)", gpu_kv_tokens=1_880_000, step_base_s=0.0035, attention_s_per_ctx_token=1.3e-8
    ),
    "b200x2-70b": EngineProfile(
        name="2xb200-192gb-llama70b-tp2 (assumed)",
        gpu_kv_tokens=588_000,
        kv_bytes_per_token=327_680,
        step_base_s=0.012,
        prefill_s_per_token=7.0e-5,
        decode_s_per_seq=8.0e-5,
        attention_s_per_ctx_token=2.3e-8,
        h2d_bytes_per_s=50e9,
        d2h_bytes_per_s=50e9,
    ),
}
