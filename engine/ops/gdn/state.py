"""The GDN recurrent-state pool as the CUDA kernels take it (cuda/gdn/state.cuh): fp32 or bf16
storage (``--mamba-ssm-cache-dtype``), fp32 math in registers, rounded to bf16 only when stored."""

from __future__ import annotations

import torch

from engine.ops.compile import check_cuda, require

STATE_TYPES = {torch.float32: "float", torch.bfloat16: "unsigned short"}
"""torch dtype -> the kernels' ``ST`` template argument (bf16 travels as its raw 16 bits)."""


def state_type(op: str, ssm_state: torch.Tensor) -> str:
    """The C++ element type to instantiate for ``ssm_state``; a ValueError naming ``op`` when the
    tensor is not a 4-d CUDA tensor of a dtype the kernels store."""
    check_cuda(f"{op} ssm_state", ssm_state, dim=4)
    require(
        ssm_state.dtype in STATE_TYPES,
        f"{op}: ssm_state must be float32 or bfloat16 (--mamba-ssm-cache-dtype), got {ssm_state.dtype}",
    )
    return STATE_TYPES[ssm_state.dtype]
