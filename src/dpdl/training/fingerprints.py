"""Fingerprints of what a run trains (the initial parameters, the model's whole state and
code, the loss, the mixing matrices): they enter a seeded run's stream settings and a
checkpoint's run digest, so two runs that compute different things never share noise, and
neither resumes the other."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import torch
from torch import nn

from dpdl.algorithms.randomness import settings_digest
from dpdl.models.state import code_fingerprint, describe_value, module_state

__all__ = ["behaviour_digest", "code_fingerprint", "mixing_digest", "parameters_digest",
           "state_digest"]  # fmt: skip


def parameters_digest(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for name, p in model.state_dict().items():
        digest.update(name.encode())
        digest.update(p.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def behaviour_digest(model: nn.Module, loss) -> str:
    """SHA-256 of what the model and the loss compute, as code: the module tree and the
    code of every module class's ``forward``, and the loss's code.  Two models (or
    losses) of one class and parameters that compute different things (a relu for a
    tanh, another lambda) thus get other streams; unlike outputs, code does not depend
    on the device or the thread count."""
    classes = sorted({type(m) for m in model.modules()}, key=lambda c: c.__qualname__)
    forwards = [code_fingerprint(getattr(c, "forward", None)) for c in classes]
    code = loss if isinstance(loss, str) else code_fingerprint(loss)
    return settings_digest([repr(model), forwards, code])


def state_digest(model: nn.Module, loss) -> str:
    """SHA-256 of the model's whole state and code (:func:`dpdl.models.state.module_state`:
    every parameter and buffer, persistent or not, every submodule's class code, every
    attribute and every class data attribute (``SCALE = 3.0`` on the class), followed into
    containers, objects and callables: ``self.act = torch.relu`` and ``torch.tanh`` differ)
    and of the loss (a name, or the callable described alike, its class's data too)."""
    loss_part = loss if isinstance(loss, str) else describe_value(loss)
    return settings_digest([module_state(model), loss_part])


def mixing_digest(topology, steps: int) -> str:
    """SHA-256 of the mixing a run of ``steps`` gossip rounds applies (its steps times an
    algorithm's rounds per step): P^k = P^(k mod period) and every gossip round is numbered
    below ``steps``, so the phases 0 .. min(period, steps) - 1
    are all it uses (at most one period: a schedule that never repeats is given with
    period = steps).  Each phase as the engine applies it: its circulant form (offsets and
    weights) where it rolls, else the float64 matrix itself; describe() names a networkx
    graph by its size alone, and two graphs of one size must not share streams."""
    digest = hashlib.sha256(b"dpdl mixing v1")
    for k in range(min(int(topology.period), max(int(steps), 1))):
        form = topology.circulant(k)
        if form is not None:
            text = json.dumps([[int(s), float(w).hex()] for s, w in form])
            digest.update(f"circulant {k} {text};".encode())
        else:
            matrix = np.ascontiguousarray(topology.mixing_matrix(k), dtype=np.float64)
            digest.update(f"matrix {k} {matrix.shape};".encode())
            digest.update(matrix.tobytes())
    return digest.hexdigest()
