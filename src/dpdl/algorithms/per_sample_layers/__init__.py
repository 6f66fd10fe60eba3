"""Layer types that book-keeping clipping (:mod:`dpdl.algorithms.per_sample`) can read, one
handler class per type, found by exact module type in :data:`LAYERS` (the pattern of
Opacus's ``grad_sample``).  A new type is supported by a subclass of :class:`LayerTerms`
decorated with ``@register_layer(ModuleType)``; a model with any other layer that holds
parameters takes the per-record path."""

# the handler modules register their layer types when imported
from dpdl.algorithms.per_sample_layers.conv2d import Conv2dTerms
from dpdl.algorithms.per_sample_layers.embedding import EmbeddingTerms
from dpdl.algorithms.per_sample_layers.linear import LinearTerms
from dpdl.algorithms.per_sample_layers.norm import GroupNormTerms, LayerNormTerms
from dpdl.algorithms.per_sample_layers.registry import (
    LAYERS,
    LayerTerms,
    RankOne,
    SparseRows,
    register_layer,
)

__all__ = [
    "LAYERS", "Conv2dTerms", "EmbeddingTerms", "GroupNormTerms", "LayerNormTerms", "LayerTerms",
    "LinearTerms", "RankOne", "SparseRows", "register_layer",
]  # fmt: skip
