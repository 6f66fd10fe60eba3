"""Fingerprints of what a run trains (the initial parameters, the code of the model and the
loss): they enter a seeded run's stream settings and a checkpoint's run digest, so two runs
that compute different things never share noise, and neither resumes the other."""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from torch import nn

from dpdl.algorithms.randomness import settings_digest

__all__ = ["behaviour_digest", "code_fingerprint", "parameters_digest"]


def code_fingerprint(fn) -> Any:
    """A stable description of a Python callable's code (nested code objects included, never
    their memory addresses); the qualified name of anything without Python code."""
    import types

    def describe(code: types.CodeType) -> list:
        consts = [describe(c) if isinstance(c, types.CodeType) else repr(c)
                  for c in code.co_consts]  # fmt: skip
        return [code.co_code.hex(), consts, list(code.co_names)]

    fn = getattr(fn, "__func__", fn)
    code = getattr(fn, "__code__", None)
    if code is None and callable(fn):  # a callable object: its class's __call__
        code = getattr(type(fn).__dict__.get("__call__"), "__code__", None)
    if code is None:
        return getattr(fn, "__qualname__", type(fn).__qualname__)
    return describe(code)


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
