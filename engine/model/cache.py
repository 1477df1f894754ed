"""Device memory pools, allocated once: paged KV for full-attention layers, GDN state slots.

Block 0 of the KV pool and slot 0 of the state pool are reserved as padding targets; the
allocators in ``engine.core.kv_manager`` never hand them out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.model.qwen3_5.config import Qwen35Config


def kv_bytes_per_block(cfg: Qwen35Config, block_size: int, dtype: torch.dtype) -> int:
    per_token = 2 * cfg.num_key_value_heads * cfg.head_dim * torch.tensor([], dtype=dtype).element_size()
    return per_token * block_size * len(cfg.full_layers)


def state_bytes_per_slot(cfg: Qwen35Config, dtype: torch.dtype) -> int:
    n = len(cfg.linear_layers)
    conv = cfg.conv_dim * (cfg.linear_conv_kernel_dim - 1) * torch.tensor([], dtype=dtype).element_size()
    ssm = cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim * 4
    return n * (conv + ssm)


@dataclass
class ModelCache:
    k_cache: list[torch.Tensor]  # per full-attention layer: [NB, bs, Hkv, D]
    v_cache: list[torch.Tensor]
    conv_state: list[torch.Tensor]  # per GDN layer: [S, C, K-1] in model dtype (as HF keeps it)
    ssm_state: list[torch.Tensor]  # per GDN layer: [S, Nv, dk, dv] fp32
    num_blocks: int
    block_size: int
    num_slots: int

    @staticmethod
    def allocate(
        cfg: Qwen35Config,
        num_blocks: int,
        block_size: int,
        num_slots: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> ModelCache:
        if num_blocks < 2 or num_slots < 2:
            raise ValueError("need at least 2 KV blocks and 2 state slots (index 0 is reserved)")
        kv_shape = (num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim)
        nf, nl = len(cfg.full_layers), len(cfg.linear_layers)
        # One allocation per pool kind; layers are views, so the pool is one contiguous block.
        k = torch.zeros((nf, *kv_shape), dtype=dtype, device=device)
        v = torch.zeros((nf, *kv_shape), dtype=dtype, device=device)
        conv = torch.zeros(
            (nl, num_slots, cfg.conv_dim, cfg.linear_conv_kernel_dim - 1), dtype=dtype, device=device
        )
        ssm = torch.zeros(
            (nl, num_slots, cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim),
            dtype=torch.float32,
            device=device,
        )
        return ModelCache(
            k_cache=list(k.unbind(0)),
            v_cache=list(v.unbind(0)),
            conv_state=list(conv.unbind(0)),
            ssm_state=list(ssm.unbind(0)),
            num_blocks=num_blocks,
            block_size=block_size,
            num_slots=num_slots,
        )
