"""A module's whole state as data: every parameter and buffer, every attribute of every
submodule (its Python-level ``__dict__``: counters, lists, tensors kept as attributes,
generators, callables by qualified name and code) and every class-level data attribute of
its classes (``SCALE = 3.0``, a counter kept on the class), as JSON-able values, tensors by
digest.  A value that cannot be read as data (a C object such as ``itertools.count``, or one
nested deeper than :data:`MAX_DEPTH`) is marked, and :func:`undescribed` lists such marks:
its state could change unseen, so the checks refuse it rather than guess.

Two uses.  :func:`dpdl.models.validation.refuse_stateful` compares it before and after a
forward: a model whose state changes across a forward would keep a noise-free statistic of
the records it saw (and the released model would carry it), and would couple the nodes one
process hosts (the engine calls it once per chunk of their records).  And
:func:`dpdl.training.fingerprints.state_digest` keys a seeded run's streams with it: two
models that differ in any attribute (``self.act = torch.relu`` or ``torch.tanh``) compute
different things and must never share noise.

Descriptions hold no memory address or process-wide counter (hook handles are described by
the hooks alone), so every process of the distributed runtime describes one model alike.
Global variables that a method reads are not followed (its code names them).
"""

from __future__ import annotations

import collections
import datetime
import decimal
import functools
import hashlib
import json
import logging
import random
import re
import types
import weakref
from typing import Any

import numpy as np
import torch
from torch import nn

__all__ = ["class_code", "class_data", "code_fingerprint", "describe_value", "module_state",
           "state_changes", "undescribed"]  # fmt: skip

# How deep attribute values are followed (an object in a list in an object ...): deeper than
# any model attribute met in practice; beyond it a value is named by its type only.
MAX_DEPTH = 8
# nn.Module's own entries, described apart (parameters, buffers and children by name).
_OWN_ENTRIES = ("_parameters", "_buffers", "_modules")
_SCALARS = (bool, int, float, complex, str)
_TORCH_NAMED = (torch.dtype, torch.device, torch.Size, torch.layout, torch.memory_format)
# What marks a value that is not described (never a Python name nor a repr: no other part of
# a description can read so)
OPAQUE, DEEP = "<opaque>", "<deep>"
# Classes whose class-level entries are library machinery, not a model's data: torch's own
# (nn.Module's _version, a TypeVar), Python's (object) and the typing / ABC machinery's
_LIBRARY_MODULES = ("torch", "builtins", "typing", "abc")
# Class entries that are caches of the ABC machinery (isinstance results), not data
_MACHINERY = frozenset({"_abc_impl"})


def code_fingerprint(fn) -> Any:
    """A stable description of a Python callable's code (nested code objects included, never
    their memory addresses); the qualified name of anything without Python code."""
    fn = getattr(fn, "__func__", fn)
    code = getattr(fn, "__code__", None)
    if code is None and callable(fn):  # a callable object: its class's __call__
        code = getattr(type(fn).__dict__.get("__call__"), "__code__", None)
    if code is None:
        return getattr(fn, "__qualname__", type(fn).__qualname__)
    return _describe_code(code)


def _describe_code(code: types.CodeType) -> list:
    consts = [_describe_code(c) if isinstance(c, types.CodeType) else _const(c)
              for c in code.co_consts]  # fmt: skip
    return [code.co_code.hex(), consts, list(code.co_names)]


def _const(value) -> str:
    # a frozenset constant (``x in {"a", "b"}``) iterates in an order that string hashing
    # randomises per process: sorted, every process describes it alike
    if isinstance(value, frozenset):
        return "frozenset(" + repr(sorted(repr(v) for v in value)) + ")"
    return repr(value)


def class_code(cls: type) -> list:
    """The code of every Python function a class and its bases define (nn.Module's own and
    object's excepted: they are torch's and Python's), by name."""
    out = []
    for base in cls.__mro__:
        if base in (nn.Module, object):
            continue
        for name, member in sorted(vars(base).items()):
            member = getattr(member, "__func__", member)  # staticmethod / classmethod
            if isinstance(member, property):
                member = member.fget
            elif isinstance(member, functools.cached_property):
                member = member.func
            if isinstance(member, types.FunctionType):
                out.append([_qualified(base), name, code_fingerprint(member)])
    return out


def _library_class(cls: type) -> bool:
    module = getattr(cls, "__module__", None) or ""
    return module.split(".")[0] in _LIBRARY_MODULES


def class_data(cls: type) -> list[tuple[type, str, Any]]:
    """(class, name, value) of every class-level data attribute of ``cls`` and its bases
    (torch's, Python's and the typing / ABC machinery's classes excepted): every entry of a
    class ``__dict__`` but dunders, functions and descriptors (:func:`class_code` describes
    those as code).  A forward may read such a value (``self.SCALE``) or change it
    (``type(self).calls += 1``) as it would an instance attribute."""
    out = []
    for base in cls.__mro__:
        if _library_class(base):
            continue
        for name, value in vars(base).items():
            if (name.startswith("__") and name.endswith("__")) or name in _MACHINERY:
                continue
            if isinstance(value, staticmethod | classmethod):
                value = value.__func__  # a Python function: code; a builtin (torch.relu): data
            # a descriptor (function, property, slot) is code, not data
            if not hasattr(type(value), "__get__"):
                out.append((base, name, value))
    return out


def _qualified(cls: type) -> str:
    return f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', cls.__name__)}"


def tensor_description(t: torch.Tensor) -> list:
    """dtype, shape and the SHA-256 of the bytes (on the CPU: the device is no state)."""
    try:
        flat = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
    except (RuntimeError, TypeError, ValueError, NotImplementedError):  # sparse, meta, lazy
        return ["tensor", str(t.dtype), list(t.shape), type(t).__name__, "unreadable"]
    return ["tensor", str(t.dtype), list(t.shape), hashlib.sha256(flat.tobytes()).hexdigest()]


def module_state(model: nn.Module) -> dict[str, Any]:
    """{what: description} of everything a forward of ``model`` could read or write: each
    ``parameter NAME`` and ``buffer NAME``, each submodule's ``module WHERE`` (class, code,
    the names of its parameters, buffers and children), ``attribute WHERE.NAME`` and
    ``class attribute WHERE.NAME (CLASS)`` (:func:`class_data` of the submodule's class)."""
    names = {id(m): name or "model" for name, m in model.named_modules()}
    state: dict[str, Any] = {}
    for name, p in model.named_parameters():
        state[f"parameter {name}"] = tensor_description(p)
    for name, b in model.named_buffers():
        state[f"buffer {name}"] = tensor_description(b)
    for prefix, module in model.named_modules():
        where = prefix or "model"
        state[f"module {where}"] = [
            _qualified(type(module)), class_code(type(module)),
            list(module._parameters), list(module._buffers), list(module._modules),
            sorted(module._non_persistent_buffers_set),
        ]  # fmt: skip
        for key, value in vars(module).items():
            if key in _OWN_ENTRIES or key == "_non_persistent_buffers_set":
                continue
            if key.startswith("_") and "hooks" in key and isinstance(value, dict):
                value = list(value.values())  # keyed by a process-wide handle counter
            state[f"attribute {where}.{key}"] = describe_value(value, names)
        for cls, key, value in class_data(type(module)):
            state[f"class attribute {where}.{key} ({_qualified(cls)})"] = describe_value(
                value, names)  # fmt: skip
    return state


def undescribed(description: Any) -> list[str]:
    """The classes of the values a description could not read (marked opaque, or nested
    deeper than :data:`MAX_DEPTH`), each once, in the order met."""
    found: list[str] = []
    stack = [description]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, list):
            if len(item) == 2 and item[0] in (OPAQUE, DEEP):
                kind = item[1] + (" (nested too deep)" if item[0] == DEEP else "")
                if kind not in found:
                    found.append(kind)
            else:
                stack.extend(reversed(item))
    return found


def state_changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """The entries of two :func:`module_state` that differ, appeared or disappeared."""
    return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))


def describe_value(value: Any, names: dict[int, str] | None = None, depth: int = 0,
                   path: frozenset = frozenset()) -> Any:  # fmt: skip
    """A JSON-able description of ``value`` that two processes give alike and that changes
    whenever the value does (containers and objects followed to :data:`MAX_DEPTH`).
    ``names``: modules of the model being described, named rather than followed."""
    names = {} if names is None else names
    simple = _simple(value)
    if simple is not None:
        return simple
    if id(value) in names:
        return ["submodule", names[id(value)]]
    if depth >= MAX_DEPTH or id(value) in path:
        return [DEEP if depth >= MAX_DEPTH else "cycle", _qualified(type(value))]
    path = path | {id(value)}

    def inner(v):
        return describe_value(v, names, depth + 1, path)

    for kinds, describe in _COMPOSITES:
        if isinstance(value, kinds):
            return describe(value, inner)
    if hasattr(value, "__dict__"):
        return ["object", _qualified(type(value)), class_code(type(value)),
                inner(vars(value)), *_class_part(type(value), inner)]  # fmt: skip
    slots = [s for c in type(value).__mro__ for s in getattr(c, "__slots__", ())]
    if slots:
        return ["object", _qualified(type(value)),
                [[s, inner(getattr(value, s, None))] for s in slots],
                *_class_part(type(value), inner)]  # fmt: skip
    return [OPAQUE, _qualified(type(value))]


def _class_part(cls: type, inner) -> list:
    """[class data described] when ``cls`` holds any, else nothing: the descriptions (and so
    a seeded run's keys) of objects whose classes hold none stay what they were."""
    data = class_data(cls)
    return [[[_qualified(c), name, inner(v)] for c, name, v in data]] if data else []


def _simple(value) -> list | None:
    """The description of a value that holds no other value, else None."""
    if value is None or isinstance(value, _SCALARS):
        return [type(value).__name__, repr(value)]
    if isinstance(value, bytes | bytearray):
        return ["bytes", hashlib.sha256(bytes(value)).hexdigest()]
    if isinstance(value, torch.Tensor):
        return tensor_description(value)
    if isinstance(value, np.ndarray) and value.dtype != object:
        array = np.ascontiguousarray(value)
        return ["ndarray", array.dtype.str, list(array.shape),
                hashlib.sha256(array.tobytes()).hexdigest()]  # fmt: skip
    if isinstance(value, np.generic):
        return ["numpy", str(value.dtype), repr(value.item())]
    if isinstance(value, _TORCH_NAMED):
        return [type(value).__name__, str(value)]
    if isinstance(value, torch.Generator):  # a forward that draws from it moves its state
        return ["torch.Generator", tensor_description(value.get_state())]
    if isinstance(value, types.ModuleType):
        return ["python-module", value.__name__]
    if isinstance(value, logging.Logger):  # a process-wide singleton, by name (as a module)
        return ["logging.Logger", value.name]
    if isinstance(value, torch.finfo | torch.iinfo):  # constants of a dtype
        return [type(value).__name__, str(value.dtype)]
    if isinstance(value, type) and not class_data(value):  # else followed: see _class
        return ["class", _qualified(value), class_code(value)]
    if isinstance(value, types.BuiltinFunctionType | types.BuiltinMethodType):
        owner = getattr(value, "__self__", None)
        bound = None if owner is None or isinstance(owner, types.ModuleType) else id(owner)
        if bound is None:  # torch.relu, math.exp: named; a bound C method: see _COMPOSITES
            return ["builtin", getattr(value, "__module__", None), value.__qualname__]
    return None


def _class(cls: type, inner) -> list:
    return ["class", _qualified(cls), class_code(cls), *_class_part(cls, inner)]


def _immutable(value, inner) -> list:
    """Immutable values of the standard library without a ``__dict__``, by their fields."""
    if isinstance(value, range | slice):
        return [type(value).__name__, inner([value.start, value.stop, value.step])]
    if isinstance(value, re.Pattern):
        return ["re.Pattern", inner(value.pattern), value.flags]
    if isinstance(value, decimal.Decimal):
        return ["decimal.Decimal", str(value), inner(getattr(value, "__dict__", None))]
    if isinstance(value, datetime.date | datetime.time):  # a datetime is a date
        zone = getattr(value, "tzinfo", None)
        naive = value if zone is None else value.replace(tzinfo=None)
        return [_qualified(type(value)), naive.isoformat(), getattr(value, "fold", 0),
                inner(zone), inner(getattr(value, "__dict__", None))]  # fmt: skip
    # a timedelta, a fixed-offset timezone, Ellipsis, NotImplemented: the repr is the value
    return [_qualified(type(value)), repr(value), inner(getattr(value, "__dict__", None))]


def _function(fn: types.FunctionType, inner) -> list:
    cells = []
    for cell in fn.__closure__ or ():
        try:
            cells.append(inner(cell.cell_contents))
        except ValueError:  # an empty cell
            cells.append(None)
    return ["function", fn.__module__, fn.__qualname__, code_fingerprint(fn),
            inner(fn.__defaults__), inner(fn.__kwdefaults__), cells]  # fmt: skip


def _random_state(value, inner) -> list:
    if isinstance(value, np.random.Generator):
        state = json.dumps(value.bit_generator.state, sort_keys=True, default=str)
        return ["numpy.Generator", state]
    if isinstance(value, np.random.RandomState):
        return ["numpy.RandomState", inner(value.get_state())]
    return ["random.Random", inner(value.getstate())]


_COMPOSITES: list[tuple[Any, Any]] = [
    (type, _class),
    (range | slice | re.Pattern | decimal.Decimal | datetime.date | datetime.time
     | datetime.timedelta | datetime.timezone | types.EllipsisType | types.NotImplementedType,
     _immutable),
    (list | tuple | collections.deque,
     lambda v, inner: [type(v).__name__, [inner(x) for x in v]]),
    (dict, lambda v, inner: [type(v).__name__, [[inner(k), inner(x)] for k, x in v.items()]]),
    (set | frozenset, lambda v, inner: [type(v).__name__, sorted(
        (inner(x) for x in v), key=lambda d: json.dumps(d, sort_keys=True))]),
    (np.ndarray, lambda v, inner: ["ndarray", list(v.shape), inner(v.tolist())]),
    (np.random.Generator | np.random.RandomState | random.Random, _random_state),
    (weakref.ref, lambda v, inner: ["weakref", inner(v())]),
    (functools.partial,
     lambda v, inner: ["partial", inner(v.func), inner(v.args), inner(v.keywords)]),
    (types.MethodType | types.BuiltinMethodType,
     lambda v, inner: ["method", inner(v.__self__), getattr(v, "__qualname__", None),
                       code_fingerprint(v)]),
    (types.FunctionType, _function),
]  # fmt: skip
