"""Per-slot streaming caches at a fixed batch shape, changed only through masks.

transformers' attention and causal-conv layers take a cache object and call
``update`` on it; these classes answer those calls from preallocated per-row
buffers, so the layers stream one frame per call for every slot of the batch
with shapes that never change:

* ``RingKVCache``: ``update(key, value, layer_idx)`` writes each row's one new
  position at that row's own index (``position % length``) and returns the whole
  buffer; ``mask`` says which entries a row may attend to. With no rotary
  embedding (NemotronH) or keys stored after it (Gemma3), the order of entries
  does not matter to one query, so a conversation longer than ``length`` keeps
  attending to its last ``length`` positions.
* ``ConvCache``: ``update(hidden_states, cache_key, conv_module)`` prepends each
  row's left context (the last ``left_pad`` time steps of that conv's input) and
  keeps the new tail.

Every update honours the rows of ``bind(n, exec_mask)``: only rows ``0..n-1``
are touched and a row whose mask is False keeps its cache exactly as it was
(the slot is frozen this tick). ``reset(row)`` clears a row for a new session.
"""

from __future__ import annotations

import torch

__all__ = ["ConvCache", "RingKVCache"]


class RingKVCache:
    """K/V of ``len(layers)`` attention layers for ``rows`` rows, ``length`` positions each.

    ``layers`` maps a layer's ``layer_idx`` (as the layer calls ``update``) to
    its buffer. Call ``bind(n, exec_mask, lengths)`` before a step: ``lengths
    [n]`` is each row's number of positions already written (its new position's
    index); the caller advances it after the step.
    """

    def __init__(
        self,
        layers: list[int],
        rows: int,
        kv_heads: int,
        length: int,
        head_dim: int,
        *,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.index = {layer: i for i, layer in enumerate(layers)}
        self.length = length
        shape = (len(layers), rows, kv_heads, length, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self._n = rows
        self._exec: torch.Tensor | None = None
        self._slot: torch.Tensor | None = None

    def bind(self, n: int, exec_mask: torch.Tensor, lengths: torch.Tensor) -> None:
        """Rows ``0..n-1`` step next; ``exec_mask [n]`` bool; ``lengths [n]`` int64 positions written."""
        self._n = n
        self._exec = exec_mask[:, None, None, None]
        self._slot = (lengths % self.length)[:, None, None, None]

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *_: object) -> tuple:
        """Write one position per row (``key``/``value`` ``[n, heads, 1, dim]``); return the buffers."""
        i = self.index[layer_idx]
        n = self._n
        assert key.shape[2] == 1, f"one new position per row per step, got {key.shape[2]}"
        k, v = self.k[i, :n], self.v[i, :n]
        idx = self._slot.expand(n, k.shape[1], 1, k.shape[3])
        k.scatter_(2, idx, torch.where(self._exec, key.to(k.dtype), k.gather(2, idx)))
        v.scatter_(2, idx, torch.where(self._exec, value.to(v.dtype), v.gather(2, idx)))
        return k, v

    def mask(self, lengths: torch.Tensor, window: int | None = None) -> torch.Tensor:
        """Bool ``[n, 1, 1, length]``: the entries a row's new position attends to (itself included).

        ``window`` keeps only the last ``window`` positions (a sliding-window layer).
        """
        j = torch.arange(self.length, device=lengths.device)
        age = (lengths[:, None] - j[None, :]) % self.length  # how many positions ago entry j was written
        valid = age <= lengths[:, None]
        if window is not None and window < self.length:
            valid = valid & (age < window)
        return valid[:, None, None, :]

    def load_row(self, row: int, layer_idx: int, key: torch.Tensor, value: torch.Tensor) -> None:
        """Put a prefill's ``key``/``value`` ``[heads, P, dim]`` (positions ``0..P-1``) into ``row``."""
        i = self.index[layer_idx]
        P = key.shape[1]
        pos = torch.arange(P, device=key.device)
        keep = pos >= P - self.length
        self.k[i, row, :, pos[keep] % self.length] = key[:, keep].to(self.k.dtype)
        self.v[i, row, :, pos[keep] % self.length] = value[:, keep].to(self.v.dtype)

    def reset(self, row: int) -> None:
        self.k[:, row].zero_()
        self.v[:, row].zero_()


class ConvCache:
    """Left context of causal convolutions, per row, keyed like the conv layers' ``cache_key``.

    ``add(key, shape)`` declares a cache of ``shape`` = ``(channels, left_pad)``
    (1-d conv, time last) or ``(channels, left_pad, width)`` (2-d conv, time
    second). ``update`` concatenates along time and keeps the last ``left_pad``
    steps of the result for the rows that step.
    """

    def __init__(self, rows: int, *, dtype: torch.dtype, device: torch.device) -> None:
        self.rows = rows
        self.dtype = dtype
        self.device = device
        self.buffers: dict[str, torch.Tensor] = {}
        self._n = rows
        self._exec: torch.Tensor | None = None

    def add(self, key: str, shape: tuple[int, ...]) -> None:
        self.buffers[key] = torch.zeros((self.rows, *shape), dtype=self.dtype, device=self.device)

    def bind(self, n: int, exec_mask: torch.Tensor) -> None:
        self._n = n
        self._exec = exec_mask

    def update(self, hidden_states: torch.Tensor, cache_key: str, conv_module: object = None) -> torch.Tensor:
        buf = self.buffers[cache_key][: self._n]
        time_dim = 2
        full = torch.cat([buf.to(hidden_states.dtype), hidden_states], dim=time_dim)
        left = buf.shape[time_dim]
        tail = full.narrow(time_dim, full.shape[time_dim] - left, left)
        exec_mask = self._exec.view(-1, *([1] * (buf.dim() - 1)))
        buf.copy_(torch.where(exec_mask, tail.to(buf.dtype), buf))
        return full

    def reset(self, row: int) -> None:
        for buf in self.buffers.values():
            buf[row].zero_()
