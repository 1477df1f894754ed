"""Seeded paged-attention batches for the kernel tests and engine.bench.attention (numpy RNG only).

A batch is a list of (num_computed, q_len) per sequence, decodes first as the engine orders them.
Every sequence gets its own blocks in a shuffled order (block 0 is the null block), the block table
has one spare zero column, and ``poisoned_caches`` NaN-fills every cache slot no sequence may read
(the null block, unassigned blocks, the tail of each sequence's last block) for the kernel's run
only: the reference multiplies masked probabilities by those slots, so it needs the clean caches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Batch:
    q: torch.Tensor  # [T, H, D] bf16 (a strided view when built with strided_q)
    gate: torch.Tensor  # [T, H, D] bf16, a strided view of a [T, H, 2D] buffer like the model's
    k_cache: torch.Tensor  # [NB, bs, Hkv, D] bf16
    v_cache: torch.Tensor
    block_table: torch.Tensor  # [B, M] int32
    query_start_loc: torch.Tensor  # [B+1] int32
    seq_lens: torch.Tensor  # [B] int32
    num_computed: torch.Tensor  # [B] int32
    max_query_len: int
    max_seq_len: int
    specs: tuple[tuple[int, int], ...]

    def args(self, k_cache: torch.Tensor | None = None, v_cache: torch.Tensor | None = None) -> tuple:
        """Positional arguments of paged_attention up to max_seq_len (scale = D ** -0.5)."""
        return (
            self.q,
            self.k_cache if k_cache is None else k_cache,
            self.v_cache if v_cache is None else v_cache,
            self.block_table,
            self.query_start_loc,
            self.seq_lens,
            self.num_computed,
            self.q.shape[-1] ** -0.5,
            self.max_query_len,
            self.max_seq_len,
        )

    def poisoned_caches(self) -> tuple[torch.Tensor, torch.Tensor]:
        bs = self.k_cache.shape[1]
        live = torch.zeros(self.k_cache.shape[:2], dtype=torch.bool)  # [NB, bs]
        table = self.block_table.cpu().tolist()
        for row, (nc, ql) in zip(table, self.specs, strict=True):
            for p in range(nc + ql):
                live[row[p // bs], p % bs] = True
        dead = (~live).to(self.k_cache.device)[:, :, None, None]
        nan = torch.tensor(float("nan"), dtype=self.k_cache.dtype, device=self.k_cache.device)
        return torch.where(dead, nan, self.k_cache), torch.where(dead, nan, self.v_cache)


def bf16(rng: np.random.Generator, *shape: int, device: str) -> torch.Tensor:
    return torch.from_numpy(rng.standard_normal(shape, dtype=np.float32)).to(device).to(torch.bfloat16)


def make_batch(
    specs,
    block_size: int,
    num_kv_heads: int,
    group: int,
    head_dim: int,
    *,
    seed: int = 0,
    device: str = "cuda",
    strided_q: bool = False,
    spare_blocks: int = 5,
    max_seq_len: int | None = None,
    extra_columns: int = 1,
) -> Batch:
    """``max_seq_len`` / ``extra_columns`` widen the bounds (CUDA-graph capture at a bucket size)."""
    rng = np.random.default_rng(seed)
    specs = tuple((int(nc), int(ql)) for nc, ql in specs)
    lens = [nc + ql for nc, ql in specs]
    nblocks = [-(-n // block_size) for n in lens]
    num_blocks = 1 + sum(nblocks) + spare_blocks
    order = (rng.permutation(num_blocks - 1) + 1).tolist()
    width = max(nblocks) + extra_columns
    table, at = [], 0
    for n in nblocks:
        table.append(order[at : at + n] + [0] * (width - n))
        at += n
    T, H, D = sum(ql for _, ql in specs), num_kv_heads * group, head_dim
    cache_shape = (num_blocks, block_size, num_kv_heads, D)
    k_cache, v_cache = bf16(rng, *cache_shape, device=device), bf16(rng, *cache_shape, device=device)
    q = bf16(rng, T, H, 2 * D, device=device)[..., :D] if strided_q else bf16(rng, T, H, D, device=device)
    gate = bf16(rng, T, H, 2 * D, device=device)[..., D:]

    def i32(x: list[int]) -> torch.Tensor:
        return torch.tensor(x, dtype=torch.int32, device=device)

    return Batch(
        q=q,
        gate=gate,
        k_cache=k_cache,
        v_cache=v_cache,
        block_table=i32(table),
        query_start_loc=i32(np.concatenate([[0], np.cumsum([ql for _, ql in specs])]).tolist()),
        seq_lens=i32(lens),
        num_computed=i32([nc for nc, _ in specs]),
        max_query_len=max(ql for _, ql in specs),
        max_seq_len=max(lens) if max_seq_len is None else max_seq_len,
        specs=specs,
    )


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative Frobenius error of ``a`` against ``b`` (fp32); non-finite ``a`` fails loudly."""
    a, b = a.float(), b.float()
    assert torch.isfinite(a).all(), "non-finite output (an unwritten or poisoned element?)"
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def reference_fp32(batch: Batch, use_gate: bool) -> torch.Tensor:
    """The fp32 reference with fp32 q (so no final bf16 cast) and an fp32 sigmoid gate."""
    from engine.ops import reference as ref

    args = (batch.q.float(),) + batch.args()[1:]
    return ref.paged_attention(*args, gate=batch.gate.float() if use_gate else None)
