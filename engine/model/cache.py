"""Device memory pools, allocated once: paged KV for full-attention layers, GDN state slots.

The model declares what its layers keep (:class:`CacheSpec`, from ``model.cache_spec()``); the pools
only allocate it, in the model dtype except the GDN recurrent state, whose dtype is the resolved
``--mamba-ssm-cache-dtype`` (fp32 by default, bf16 to halve the slot size). Block 0 of the KV pool
and slot 0 of the state pool are reserved as padding targets; the allocators in
``engine.core.kv_manager`` never hand them out.

With ``shared_pad_slot`` (the CUDA kernels, which never read or write a slot <= 0) the state pools
hold no slot 0 of their own per layer: layer j's slot 0 is layer j-1's last slot (layer 0's, one
padding row), so the layers' views overlap by that row and ``L - 1`` slot rows are saved (47 MiB for
the 4B's fp32 state). The torch reference ops write padding rows to slot 0, so they get the plain
layout.

With ``state_on_demand`` (CUDA kernels only) the recurrent state, the bulk of every slot, lives in
:class:`engine.model.vmm.GrowingRegions`: the pool's address range is reserved for every slot, and a
slot's memory is mapped when the slot is first handed out (:meth:`ModelCache.ensure_slot`), so the
pool holds what the most requests running at once needed, not ``--max-num-seqs`` slots. Slot 0 of
every layer is one shared page. The conv state (1.2 MiB a slot on the 4B) stays one plain allocation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.model.vmm import GrowingRegions

SSM_DTYPES = (torch.float32, torch.bfloat16)
"""The recurrent-state storage dtypes every GDN op accepts."""


@dataclass(frozen=True)
class CacheSpec:
    """Per-layer cache shapes a model declares (one entry per layer kind, excluding the pool axis)."""

    num_kv_layers: int
    kv_token_shape: tuple[int, ...]
    """One token's K (and V) in a full-attention layer: [Hkv, D], model dtype."""
    num_state_layers: int
    conv_state_shape: tuple[int, ...]
    """One slot's conv state in a GDN layer: [C, K-1], model dtype (as HF keeps it)."""
    ssm_state_shape: tuple[int, ...]
    """One slot's recurrent state in a GDN layer: [Nv, dk, dv], stored in the ssm dtype the pools are
    given (fp32 by default, bf16 with ``--mamba-ssm-cache-dtype bfloat16``; the ops compute in fp32
    either way and round to the pool's dtype when they store the state back)."""


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _itemsize(dtype: torch.dtype) -> int:
    return torch.tensor([], dtype=dtype).element_size()


def kv_bytes_per_block(spec: CacheSpec, block_size: int, dtype: torch.dtype) -> int:
    per_token = 2 * _numel(spec.kv_token_shape) * _itemsize(dtype)
    return per_token * block_size * spec.num_kv_layers


def state_bytes_per_slot(spec: CacheSpec, dtype: torch.dtype, ssm_dtype: torch.dtype = torch.float32) -> int:
    """One state slot over every GDN layer: conv state in ``dtype``, recurrent state in ``ssm_dtype``."""
    conv = _numel(spec.conv_state_shape) * _itemsize(dtype)
    ssm = _numel(spec.ssm_state_shape) * _itemsize(ssm_dtype)
    return spec.num_state_layers * (conv + ssm)


@dataclass
class ModelCache:
    k_cache: list[torch.Tensor]  # per full-attention layer: [NB, bs, Hkv, D]
    v_cache: list[torch.Tensor]
    conv_state: list[torch.Tensor]  # per GDN layer: [S, C, K-1] in model dtype (as HF keeps it)
    ssm_state: list[torch.Tensor]  # per GDN layer: [S, Nv, dk, dv] fp32 or bf16 (the ssm dtype)
    num_blocks: int
    block_size: int
    num_slots: int
    grown: GrowingRegions | None = None
    """The recurrent state's regions when it is mapped on demand (``state_on_demand``)."""

    @staticmethod
    def allocate(
        spec: CacheSpec,
        num_blocks: int,
        block_size: int,
        num_slots: int,
        dtype: torch.dtype,
        device: torch.device | str,
        ssm_dtype: torch.dtype = torch.float32,
        shared_pad_slot: bool = False,
        state_on_demand: bool = False,
    ) -> ModelCache:
        """KV and conv state in ``dtype``, the recurrent state in ``ssm_dtype`` (fp32 or bf16);
        ``shared_pad_slot``: the layers share one padding row; ``state_on_demand``: the recurrent state
        is mapped slot by slot as slots are handed out, slot 1 at once (module docstring)."""
        if num_blocks < 2 or num_slots < 2:
            raise ValueError("need at least 2 KV blocks and 2 state slots (index 0 is reserved)")
        if ssm_dtype not in SSM_DTYPES:
            raise ValueError(f"recurrent state dtype {ssm_dtype}: the ops store float32 or bfloat16")
        nf, nl = spec.num_kv_layers, spec.num_state_layers
        kv_shape = (nf, num_blocks, block_size, *spec.kv_token_shape)
        # One allocation per pool kind; layers are views, so the pool is one contiguous block.
        k = torch.zeros(kv_shape, dtype=dtype, device=device)
        v = torch.zeros(kv_shape, dtype=dtype, device=device)
        conv = _state_pool(nl, num_slots, spec.conv_state_shape, dtype, device, shared_pad_slot)
        grown = None
        if state_on_demand and nl:
            row = _numel(spec.ssm_state_shape) * _itemsize(ssm_dtype)
            grown = GrowingRegions(torch.device(device), nl, num_slots, row, first_row=1)  # maps slot 1
            ssm = [grown.view(j, ssm_dtype, (num_slots, *spec.ssm_state_shape)) for j in range(nl)]
        else:
            ssm = _state_pool(nl, num_slots, spec.ssm_state_shape, ssm_dtype, device, shared_pad_slot)
        return ModelCache(
            k_cache=list(k.unbind(0)),
            v_cache=list(v.unbind(0)),
            conv_state=conv,
            ssm_state=ssm,
            num_blocks=num_blocks,
            block_size=block_size,
            num_slots=num_slots,
            grown=grown,
        )

    @property
    def state_bytes(self) -> int:
        """Device bytes the GDN state pools hold now (a shared padding row counted once; of an
        on-demand recurrent state, what is mapped)."""
        return _storage_bytes(self.conv_state) + (
            self.grown.mapped_bytes if self.grown is not None else _storage_bytes(self.ssm_state)
        )

    @property
    def state_reserved_bytes(self) -> int:
        """What the GDN state pools hold with every slot in use (what the memory plan budgets)."""
        if self.grown is None:
            return self.state_bytes
        return _storage_bytes(self.conv_state) + self.grown.full_bytes

    def ensure_slot(self, slot: int) -> bool:
        """Back ``slot``'s recurrent state with device memory before a step uses it; False when the
        device has none left for it (the slot must not be used then)."""
        return self.grown is None or self.grown.ensure(slot + 1)

    def close(self) -> None:
        """Give an on-demand state's memory back now (waits for the device); the pools are unusable
        afterwards. Without it, it goes back with the last view."""
        if self.grown is not None:
            self.grown.close()


def _storage_bytes(views: list[torch.Tensor]) -> int:
    """Bytes of the one allocation a pool's per-layer views share."""
    return views[0].untyped_storage().nbytes() if views else 0


def _state_pool(
    layers: int,
    slots: int,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: torch.device | str,
    shared_pad_slot: bool,
) -> list[torch.Tensor]:
    """Per-layer ``[slots, *shape]`` views of one allocation; with ``shared_pad_slot``, layer j's view
    starts at layer j-1's last slot, which serves as its never-touched slot 0."""
    if not shared_pad_slot or layers == 0:
        return list(torch.zeros((layers, slots, *shape), dtype=dtype, device=device).unbind(0))
    rows = torch.zeros((layers * (slots - 1) + 1, *shape), dtype=dtype, device=device)
    return [rows[j * (slots - 1) : j * (slots - 1) + slots] for j in range(layers)]
