"""The reconstruction attack on decentralized gradient descent, through the real engine
(El Mrini, Cyffers & Bellet 2024, §4; MATH.md §9).

Every node holds one record (x_u, y_u) and a softmax linear model with a bias; the network runs
T steps of SGP (non-private) or Dyn-D2P (private) with the engine's own ``local_update`` and
``push_sum_mix``, full batches (p = 1).  A message is x^{k+½} = x^k − γ·g^k: gossip whose
round-k input is −γ·g^k plus, at k = 0, the public initial model.  The coalition subtracts what
it knows (the initial model, its own updates) and, as in the paper, solves the knowledge
matrix for one *constant* update per honest node (exact while gradients change little, i.e.
for a small γ; the paper's Figure 4 shows the error growing with the learning rate).

From a node's gradient the record follows in closed form: for one record, the gradient of
the cross-entropy of softmax(W x + b) is ((p − e_y) xᵀ, p − e_y), so x = Wᵀ-part · b-part /
‖b-part‖² and y is the class whose bias gradient is negative.  Clipping scales both parts
alike and leaves that ratio intact: only the noise of a private run protects the record.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from dpdl.accounting.schedules import PrivacySchedule
from dpdl.algorithms.dyn_d2p import (
    LocalStep,
    NodeRecords,
    StepArguments,
    local_update,
    make_node_generators,
    push_sum_mix,
)
from dpdl.audit.reconstruct import (
    Reconstruction,
    knowledge_matrix,
    least_squares_attack,
    reconstructible,
)
from dpdl.errors import require

__all__ = ["attack_dgd", "record_from_gradient"]


def record_from_gradient(weight_grad: np.ndarray, bias_grad: np.ndarray) -> tuple[np.ndarray, int]:
    """(x, y) of the one record whose softmax-regression gradient is (weight_grad, bias_grad)."""
    norm = float(bias_grad @ bias_grad)
    x = weight_grad.T @ bias_grad / norm if norm > 0 else np.full(weight_grad.shape[1], math.nan)
    return x, int(np.argmin(bias_grad))


def _flat(params: dict[str, torch.Tensor]) -> np.ndarray:
    return torch.cat([p.reshape(len(p), -1) for p in params.values()], dim=1).double().numpy()


def attack_dgd(topology, inputs: np.ndarray, labels: np.ndarray, classes: int, *, rounds: int,
               coalition: Sequence[int], lr: float, schedule: PrivacySchedule | None = None,
               seed: int | None = None) -> Reconstruction:
    """Run T steps of decentralized gradient descent on one record per node and attack it.

    ``schedule``: None runs SGP (no clipping, no noise); a private schedule runs Dyn-D2P with
    its C_k and σ_k.  ``seed`` keys the nodes' noise streams (None: OS entropy).
    Returns the reconstruction of the records (``truth``/``estimate`` (n, d); the recovered
    labels and the true ones in ``extra``)."""
    inputs = np.asarray(inputs, dtype=np.float64)
    labels = np.asarray(labels)
    n, d = inputs.shape
    require(n == topology.n, f"{n} records for a topology of {topology.n} nodes")
    require(labels.shape == (n,) and int(labels.min()) >= 0 and int(labels.max()) < classes,
            f"labels must be {n} class indices in 0..{classes - 1}")  # fmt: skip
    require(math.isfinite(lr) and lr > 0, f"lr must be positive, got {lr!r}")
    require(schedule is None or schedule.private,
            "a schedule passed to the attack must be private (None runs SGP)")  # fmt: skip
    require(schedule is None or schedule.steps >= rounds,
            f"the schedule has {getattr(schedule, 'steps', 0)} steps for {rounds} rounds")
    model = torch.nn.Linear(d, classes, dtype=torch.float64)
    params = {"weight": torch.zeros((n, classes, d), dtype=torch.float64),
              "bias": torch.zeros((n, classes), dtype=torch.float64)}  # the public x^0
    weights = torch.ones(n, dtype=torch.float64)
    x = torch.as_tensor(inputs).unsqueeze(1)
    y = torch.as_tensor(labels, dtype=torch.long).unsqueeze(1)
    mask = torch.ones((n, 1), dtype=torch.bool)
    generators = make_node_generators(n, seed)
    start = _flat(params)
    messages, own_inputs = [], []
    for k in range(rounds):
        before = _flat(params)
        half = local_update(
            LocalStep(model), params, weights, NodeRecords(x, y, mask, generators, 1.0),
            StepArguments(private=schedule is not None, lr=lr,
                          clip=None if schedule is None else float(schedule.clip[k]),
                          sigma=None if schedule is None else float(schedule.sigma[k])),
            step=k,
        )  # fmt: skip
        sent = _flat(half.params)
        messages.append(sent)
        own_inputs.append(sent - before)
        params, weights = push_sum_mix(half.params, weights, topology.mixing_matrix(k))
    knowledge = knowledge_matrix(topology.mixing_matrix, rounds=rounds, coalition=coalition,
                                 contribution="every-round")  # fmt: skip
    view = knowledge.view
    observed = np.stack([messages[t][j] for t, j in view.rows])
    known = view.matrix[:, :n] @ start  # the public x^0 enters as round 0's input
    own = list(view.observers)
    for t in range(rounds):
        known += view.matrix[:, t * n : (t + 1) * n][:, own] @ own_inputs[t][own]
    updates = least_squares_attack(knowledge, observed - known)  # −γ·g per node, (n, D)
    grads = -updates / lr
    estimate = np.full_like(inputs, math.nan)
    guessed = np.full(n, -1)
    for u in np.flatnonzero(reconstructible(knowledge)):
        weight_grad = grads[u, : classes * d].reshape(classes, d)
        estimate[u], guessed[u] = record_from_gradient(weight_grad, grads[u, classes * d :])
    hit = reconstructible(knowledge)
    return Reconstruction(
        "dgd", view.observers, rounds, 0.0 if schedule is None else float(schedule.sigma[0]),
        hit, inputs, estimate,
        {"lr": lr, "algorithm": "sgp" if schedule is None else schedule.algorithm,
         "labels": [int(v) for v in labels],
         "recovered_labels": [int(v) if h else None for v, h in zip(guessed, hit, strict=True)],
         "labels_recovered": int(((guessed == labels) & hit).sum())},
    )  # fmt: skip
