"""nn.Embedding: record r's weight gradient is the scatter-add of its output gradients onto
the rows of its token ids, P_r[v] = sum_{t: x_rt = v} g_rt (zero at ``padding_idx``), kept as
the few rows it touches (:class:`~dpdl.algorithms.per_sample_layers.registry.SparseRows`):
a token repeated within a record has its gradients summed into one row first, then the norm
is taken of those rows, exactly what is summed."""

from __future__ import annotations

import math

import torch
from torch import nn

from dpdl.algorithms.per_sample_layers.registry import LayerTerms, SparseRows, register_layer


@register_layer(nn.Embedding)
class EmbeddingTerms(LayerTerms):
    def problem(self) -> str | None:
        # refused for training by dpdl.models.validation.validate_model; here, for a caller
        # of the engine alone, the per-record path (autograd's own numbers)
        emb = self.module
        if emb.max_norm is not None or emb.sparse or emb.scale_grad_by_freq:
            return "max_norm, sparse or scale_grad_by_freq"
        return None

    def cost(self) -> tuple[float, float]:
        tokens = math.prod(self.in_shape)
        width = math.prod(self.out_shape) // max(tokens, 1)
        # sort, gather and scatter-add of the output gradients; the gathered copy and the
        # record's rows, and the ids, their order and slots
        return 4.0 * tokens * width, 8.0 * tokens * width + 24.0 * tokens

    def _tokens(self, a: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids (..., T), output gradients (..., T, D)), zero at ``padding_idx``, from ``a``
        (..., *in_shape) and ``g`` (..., *in_shape, D) with ``lead`` leading dimensions."""
        lead = a.dim() - len(self.in_shape)
        ids = a.reshape(*a.shape[:lead], -1)
        grads = g.reshape(*ids.shape, g.shape[-1])
        pad = self.module.padding_idx
        if pad is not None:  # F.embedding's gradient at padding_idx is zero
            grads = grads.masked_fill((ids == pad).unsqueeze(-1), 0.0)
        return ids, grads

    def unit_sums(self, a: torch.Tensor, g: torch.Tensor):
        """Every token's output gradient added into its unit's row of the weight (a padding
        record's g is zero)."""
        ids, grads = self._tokens(a, g)
        m, (vocab, width) = ids.shape[0], self.module.weight.shape
        unit = torch.arange(m, device=ids.device).unsqueeze(1) * vocab
        total = grads.new_zeros((m * vocab, width))
        total.index_add_(0, (unit + ids.reshape(m, -1)).reshape(-1), grads.reshape(-1, width))
        return {self.weight: total.reshape(m, vocab, width)}

    def terms(self, a: torch.Tensor, g: torch.Tensor):
        ids, grads = self._tokens(a, g)  # (N, T), (N, T, D)
        width = grads.shape[-1]
        sorted_ids, order = ids.sort(dim=1, stable=True)
        # slot k of record r: its k-th distinct token; a repeated token's gradients summed
        first = torch.ones_like(sorted_ids, dtype=torch.bool)
        first[:, 1:] = sorted_ids[:, 1:] != sorted_ids[:, :-1]
        slot = first.cumsum(dim=1) - 1
        rows = grads.new_zeros(grads.shape).scatter_add_(
            1, slot.unsqueeze(-1).expand(-1, -1, width),
            grads.gather(1, order.unsqueeze(-1).expand(-1, -1, width)),
        )  # fmt: skip
        index = torch.zeros_like(ids).scatter_(1, slot, sorted_ids)
        return rows.square().sum((1, 2)), SparseRows(index, rows)
