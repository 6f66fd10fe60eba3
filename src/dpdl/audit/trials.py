"""Audit trials through the real engine: many independent trainings at once (MATH.md §4, §8).

One *trial* is a whole private training of a small network of ``n`` nodes (node 0 holds the
canary in half of the trials).  T trials are stacked as T independent blocks of n nodes: a
single :func:`dpdl.algorithms.dyn_d2p.local_update` call runs steps 1-5 of Algorithm 1 for all
T·n nodes (every node with its own generator, fresh randomness per trial), and
:func:`dpdl.algorithms.dyn_d2p.push_sum_mix` mixes every block with the same P^k by putting
the trial index behind the node index.  Nothing of the mechanism is re-implemented here.

The audited model is a linear model without bias on ``features`` inputs with the squared-error
loss; coordinate 0 of the input is reserved for the canary (every ordinary record has x_0 = 0).

* **gradient canary**: x = e_0 with target y = 1e6.  Its gradient (w·x − y)·x has norm ≫ C_k
  for as long as |w_0| ≪ 1e6 (checked), so its clipped gradient is exactly −C_k e_0 at every
  step: the strongest white-box canary.  Ordinary records have zero gradient along e_0, so
  along e_0 the node's update is γ/b · (C_k · [canary sampled] − σ_k ξ_k).
* **input canary**: a mislabelled record: an ordinary record's features with x_0 = 1 and the
  target replaced by a wrong one (``INPUT_CANARY_TARGET``, the clean model predicts about 0
  there); its gradient is model dependent, as for any real record.

Scores (higher means "the canary was in"):

* ``messages`` -- a curious out-neighbour of node 0 that sees every message (P_j0 x_0^{k+½},
  P_j0 w_0) node 0 sends.  With n = 2 (the default) it is node 0's only neighbour, knows what
  it sent itself and so knows x_0^k; it recovers the update along e_0 at every step, s_k, and
  scores with the Neyman–Pearson log-likelihood ratio of the claimed mechanism,
  Σ_k log(1 − p + p·exp(μ_k s_k/σ_k − μ_k²/2)), μ_k = C_k/σ_k (σ_k the *claimed* noise).
  With n > 2 the harness gives the adversary x_0^k as well (white-box, all iterates).
* ``observer`` -- a coalition V of nodes other than node 0 (``observers``), each seeing only
  what it receives: the messages of its in-neighbours (never node 0's own messages unless 0
  is an in-neighbour) and knowing its own.  Along e_0 the network runs linear Gaussian gossip
  (MATH.md §9): the canary adds γ C_k / b to node 0's message at every step it is sampled, every
  node adds noise γ σ_k / b.  The score is the generalised-least-squares estimate of the
  canary's presence from V's view, V's own inputs removed (the Neyman–Pearson statistic when
  p = 1, where its privacy is exactly the view μ of ``schedule_view_mu``).
  An algorithm releasing several noisy messages per step (gradient tracking: the model and
  the tracker) has no exact linear view: its observers are given node 0's state (white box,
  as ``messages``) and score every release of node 0, each with its own claimed σ_k·factor.
* ``final`` -- only the final network average x̄: the gradient canary is scored by x̄_0, the
  input canary by minus its loss at x̄ (a black-box membership test).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch

from dpdl.accounting.schedules import PrivacySchedule
from dpdl.algorithms.dyn_d2p import (
    GAUSSIAN_RELEASE,
    LocalStep,
    NodeRecords,
    StepArguments,
    local_update,
    make_node_generators,
    noisy_update,
    push_sum_mix,
)
from dpdl.audit.legacy_noise import LEGACY_MECHANISMS
from dpdl.errors import DPDLError, require

__all__ = [
    "CANARIES",
    "THREATS",
    "GRADIENT_CANARY_TARGET",
    "INPUT_CANARY_TARGET",
    "AuditDesign",
    "run_one_run",
    "run_trials",
]

THREATS = ("messages", "final", "observer")
CANARIES = ("gradient", "input")
GRADIENT_CANARY_TARGET = 1e6
INPUT_CANARY_TARGET = 2.0
CANARY_NODE = 0


@dataclass(frozen=True)
class AuditDesign:
    """The audited network and its (public, adversary-known) data; not the randomness."""

    threat: str = "messages"
    canary: str = "gradient"
    nodes: int = 2
    topology: str = "exp"
    records_per_node: int = 8
    features: int = 8
    lr: float = 0.1
    data_seed: int = 0  # the adversary's data set: public by design, not a privacy secret
    observers: tuple[int, ...] = (1,)  # threat "observer": the curious nodes (not node 0)
    # gossip rounds per step, the first with the step's release, the others only mixing (an
    # algorithm's view: Muffliato's R rounds); round r of step k uses the graph P^{kR + r}
    rounds_per_step: int = 1
    # the noise's correlation across nodes (dpdl.algorithms.correlated): "independent" or
    # "pairwise" (DECOR, σ_pair = correlation_factor·σ_k); the trials draw it with the engine's
    # own mechanism and real pairwise keys, and the observers subtract the secrets they hold
    correlation: str = "independent"
    correlation_factor: float | None = None

    def validate(self) -> None:
        require(self.threat in THREATS, f"unknown threat {self.threat!r}; choose {THREATS}")
        require(isinstance(self.rounds_per_step, int) and self.rounds_per_step >= 1,
                f"rounds_per_step must be an integer >= 1, got {self.rounds_per_step!r}")
        require(self.canary in CANARIES, f"unknown canary {self.canary!r}; choose {CANARIES}")
        require(self.nodes >= 1, f"nodes must be >= 1, got {self.nodes}")
        require(
            not (self.threat == "messages" and self.nodes < 2),
            "threat 'messages' needs at least 2 nodes: a single node sends no messages",
        )
        require(
            not (self.threat == "messages" and self.canary == "input"),
            "the input-space canary is audited under the black-box 'final' threat only",
        )
        if self.threat == "observer":
            require(self.nodes >= 2, "threat 'observer' needs at least 2 nodes")
            require(self.canary == "gradient",
                    "threat 'observer' audits the gradient canary (its propagation is linear)")
            require(len(self.observers) >= 1, "threat 'observer' needs at least one observer")
            for v in self.observers:
                require(isinstance(v, int | np.integer) and 0 <= v < self.nodes,
                        f"observer {v!r} is not a node of 0..{self.nodes - 1}")  # fmt: skip
            require(CANARY_NODE not in self.observers,
                    f"the canary's node {CANARY_NODE} cannot be its own observer")
        from dpdl.algorithms.correlated import make_correlation

        make_correlation(self.correlation, self.correlation_factor)  # one line if unknown
        require(self.correlation in ("independent", "pairwise"),
                f"the audit's trials draw independent or pairwise (DECOR) noise, not "
                f"{self.correlation!r}")  # fmt: skip
        require(self.correlation == "independent" or self.threat == "observer",
                f"correlated noise ({self.correlation}) is audited under the 'observer' "
                f"threat, not {self.threat!r}")  # fmt: skip
        require(self.records_per_node >= 1, "records_per_node must be >= 1")
        require(self.features >= 2, "features must be >= 2 (coordinate 0 is the canary's)")
        require(math.isfinite(self.lr) and self.lr > 0, f"lr must be positive, got {self.lr}")


class _Model(torch.nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.linear = torch.nn.Linear(features, 1, bias=False)

    def forward(self, x):
        return self.linear(x).squeeze(-1)


def _dataset(design: AuditDesign) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """Ordinary records (n, J, d) and targets (n, J) with x_0 = 0; the canary (x, y)."""
    rng = np.random.default_rng(design.data_seed)
    n, J, d = design.nodes, design.records_per_node, design.features
    x = rng.normal(size=(n, J, d)) / math.sqrt(d - 1)
    x[..., 0] = 0.0
    w_true = rng.normal(size=d)
    w_true[0] = 0.0
    y = x @ w_true + 0.1 * rng.normal(size=(n, J))
    if design.canary == "gradient":
        canary_x = np.zeros(d)
        canary_x[0] = 1.0
        canary_y = GRADIENT_CANARY_TARGET
    else:
        canary_x = x[CANARY_NODE, 0].copy()
        canary_x[0] = 1.0
        canary_y = INPUT_CANARY_TARGET
    return x, y, canary_x, canary_y


def _mixing(topology, k: int):
    circ = topology.circulant(k)
    if circ is not None:
        return None, [(int(s), float(w)) for s, w in circ]
    return torch.as_tensor(np.asarray(topology.mixing_matrix(k), dtype=np.float64)), None


def _mix_blocks(params, weights, trials: int, nodes: int, P, circ):
    """push_sum_mix on T blocks of n nodes: node index first, trial index behind it."""
    by_node = {
        name: p.reshape(trials, nodes, *p.shape[1:]).transpose(0, 1) for name, p in params.items()
    }
    mixed, w = push_sum_mix(by_node, weights.reshape(trials, nodes).T, P, circulant=circ)
    params = {
        name: p.transpose(0, 1).reshape(trials * nodes, *p.shape[2:]) for name, p in mixed.items()
    }
    return params, w.T.reshape(trials * nodes)


def _log_likelihood_ratio(s: torch.Tensor, mu: float, sigma: float, p: float) -> torch.Tensor:
    """log[(1 − p) + p·exp(μ s/σ − μ²/2)]: one step of the claimed subsampled Gaussian."""
    z = mu * s / sigma - mu * mu / 2
    if p >= 1:
        return z
    return torch.logaddexp(torch.full_like(z, math.log1p(-p)), z + math.log(p))


#: The mechanisms an audit can run: the engine's own, and the old samplers kept to be refuted.
NOISE_MECHANISMS = {"exact": GAUSSIAN_RELEASE, **LEGACY_MECHANISMS}


def noise_mechanism(name: str):
    require(name in NOISE_MECHANISMS,
            f"unknown noise {name!r}; choose one of {', '.join(NOISE_MECHANISMS)}")  # fmt: skip
    return NOISE_MECHANISMS[name]


def run_trials(
    schedule: PrivacySchedule,
    design: AuditDesign,
    members: np.ndarray,
    *,
    noise_scale: float = 1.0,
    seed: int | None = None,
    noise: str = "exact",
    first_trial: int = 0,
    total_trials: int | None = None,
    on_step: Callable[[], None] | None = None,
) -> np.ndarray:
    """Train ``len(members)`` independent trials at once; return one score per trial.

    ``members[t]`` says whether trial t's canary node holds the canary.  The engine adds noise
    ``noise_scale · σ_k`` (``noise_scale`` < 1 stands in for an implementation that adds too
    little) while the scores use the claimed σ_k.  Each node of each trial draws from its own
    generator: ``make_node_generators`` over all ``total_trials · n`` nodes, this chunk's
    block starting at trial ``first_trial`` (``seed=None``: OS entropy, the default).
    ``noise`` names the mechanism audited (:data:`NOISE_MECHANISMS`: the engine's exact
    release, or one of the old floating-point samplers kept to be refuted).
    """
    design.validate()
    require(schedule.private, f"algorithm {schedule.algorithm!r} is not private: nothing to audit")
    require(
        math.isfinite(noise_scale) and noise_scale > 0,
        f"noise scale must be positive, got {noise_scale}",
    )
    from dpdl.topology import make_topology

    members = np.asarray(members, dtype=bool)
    T, n = members.size, design.nodes
    total = first_trial + T if total_trials is None else total_trials
    x, y, canary_x, canary_y = _dataset(design)
    J, d = design.records_per_node, design.features
    inputs = torch.zeros((T, n, J + 1, d), dtype=torch.float32)
    targets = torch.zeros((T, n, J + 1), dtype=torch.float32)
    mask = torch.zeros((T, n, J + 1), dtype=torch.bool)
    inputs[:, :, :J] = torch.as_tensor(x, dtype=torch.float32)
    targets[:, :, :J] = torch.as_tensor(y, dtype=torch.float32)
    mask[:, :, :J] = True
    inputs[:, CANARY_NODE, J] = torch.as_tensor(canary_x, dtype=torch.float32)
    targets[:, CANARY_NODE, J] = float(canary_y)
    mask[:, CANARY_NODE, J] = torch.as_tensor(members)
    inputs, targets, mask = (t.reshape(T * n, *t.shape[2:]) for t in (inputs, targets, mask))

    topology = make_topology(design.topology, n) if n >= 2 else None
    model = _Model(d)
    params = {"linear.weight": torch.zeros((T * n, 1, d), dtype=torch.float32)}
    weights = torch.ones(T * n, dtype=torch.float64)
    mechanism = noise_mechanism(noise)
    generators = make_node_generators(total * n, seed, first_node=first_trial * n, count=T * n)
    p = schedule.sample_rate
    b = p * J  # expected batch size of an ordinary node (the canary node: one more record)
    canary_rows = torch.arange(T) * n + CANARY_NODE
    score = torch.zeros(T, dtype=torch.float64)
    sent, inputs_along_0 = [], []  # (T, n) per step, along e_0: messages and own inputs
    spec = LocalStep(model, loss="squared_error", expected_batch_size=b, mechanism=mechanism)
    records = NodeRecords(inputs, targets, mask, generators, p)
    factors = schedule.release_factors
    white_box = design.threat == "messages" or len(factors) > 1
    pairs = _TrialPairs(design, T, seed, first_trial) if topology is not None else None
    require(pairs is None or not pairs.correlated or noise == "exact",
            f"correlated noise is drawn by the engine's exact release, not {noise!r}")
    if pairs is not None and pairs.correlated:
        # the white-box score of several releases takes each as σ_k alone, and the pairs of a
        # step of R rounds follow the engine's step graph, not round kR's: neither is played
        require(len(factors) == 1, "the audit plays correlated noise for one release per "
                "step; several releases are audited with independent noise")  # fmt: skip
        require(design.rounds_per_step == 1, "the audit plays correlated noise with one "
                "gossip round per step")  # fmt: skip
    held = []  # (T, n) per step: the pairwise secrets the observers hold, in honest inputs
    for k in range(schedule.steps):
        if pairs is not None and pairs.correlated:
            step_of = pairs.at_step(mechanism, topology, k, design.rounds_per_step, n,
                                    (float(schedule.sigma[k]) * factors[0] * noise_scale, d),
                                    float(schedule.clip[k]))  # fmt: skip
            spec = replace(spec, mechanism=step_of.mechanism)
        clip, sigma = float(schedule.clip[k]), float(schedule.sigma[k]) * factors[0]
        before = params["linear.weight"][canary_rows, 0, 0].double()
        whole_before = params["linear.weight"][:, 0, 0].double().reshape(T, n)
        for factor in factors[1:]:  # a further release: fresh sample, noise σ_k · factor
            u = noisy_update(spec, params, weights, records, StepArguments(
                private=True, clip=clip, sigma=sigma * factor * noise_scale, lr=design.lr))
            s = -u["linear.weight"][canary_rows, 0, 0].double() * b
            score += _log_likelihood_ratio(s, clip / (sigma * factor), sigma * factor, p)
        half = local_update(
            spec, params, weights, records,
            StepArguments(private=True, clip=clip, sigma=sigma * noise_scale, lr=design.lr),
            step=k,
        )  # fmt: skip
        if white_box:
            after = half.params["linear.weight"][canary_rows, 0, 0].double()
            s = (after - before) * (b / design.lr)
            score += _log_likelihood_ratio(s, clip / sigma, sigma, p)
        elif design.threat == "observer":
            message = half.params["linear.weight"][:, 0, 0].double().reshape(T, n)
            sent.append(message.numpy())
            inputs_along_0.append((message - whole_before).numpy())
            if pairs is not None and pairs.correlated:
                held.append(design.lr / b * step_of.held_by(design.observers, T, n))
        params = half.params
        for r in range(design.rounds_per_step if topology is not None else 0):
            if r and design.threat == "observer":  # a round without fresh noise or input
                message = params["linear.weight"][:, 0, 0].double().reshape(T, n)
                sent.append(message.numpy())
                inputs_along_0.append(np.zeros((T, n)))
                if held:
                    held.append(np.zeros((T, n)))
            P, circ = _mixing(topology, k * design.rounds_per_step + r)
            params, weights = _mix_blocks(params, weights, T, n, P, circ)
        if on_step is not None:
            on_step()
    w0 = params["linear.weight"][:, 0, 0]
    if design.canary == "gradient" and not bool((w0.abs() < GRADIENT_CANARY_TARGET / 10).all()):
        raise DPDLError(
            "the gradient canary's coordinate drifted too far for its clipped gradient to stay "
            "fixed: lower the learning rate"
        )
    if white_box:
        return score.numpy()
    if design.threat == "observer":
        return _observer_scores(topology, schedule, design, b, sent, inputs_along_0, held)
    total_w = weights.reshape(T, n).sum(dim=1)
    average = params["linear.weight"].reshape(T, n, d).double().sum(dim=1) / total_w[:, None]
    if design.canary == "gradient":
        return average[:, 0].numpy()
    prediction = average @ torch.as_tensor(canary_x, dtype=torch.float64)
    return (-((prediction - canary_y) ** 2)).numpy()


def _observer_scores(topology, schedule: PrivacySchedule, design: AuditDesign, b: float,
                     sent: list[np.ndarray], own: list[np.ndarray],
                     held: list[np.ndarray]) -> np.ndarray:  # fmt: skip
    """Per trial: the GLS estimate of the canary's presence (1: in, 0: out) from what the
    observers received along e_0, their own inputs and the pairwise secrets they hold in
    their neighbours' inputs subtracted (module doc)."""
    from dpdl.accounting.gossip import build_view, gls_weights

    K, n, R = schedule.steps, design.nodes, design.rounds_per_step
    view = build_view(topology.mixing_matrix, rounds=K * R, observers=design.observers)
    observed = np.stack([sent[t][:, j] for t, j in view.rows])  # (rows, T)
    V = list(view.observers)
    for t in range(K * R):
        observed -= view.matrix[:, t * n : (t + 1) * n][:, V] @ own[t][:, V].T
        if held:
            observed -= view.matrix[:, t * n : (t + 1) * n] @ held[t].T
    gain = design.lr / b
    c = sum(gain * float(schedule.clip[k]) * view.column(CANARY_NODE, k * R) for k in range(K))
    sigmas = np.asarray(schedule.sigma[:K], dtype=np.float64) * schedule.release_factors[0]
    if held:
        from dpdl.accounting.correlated import make_noise_model, unknown_noise_columns

        model = make_noise_model(design.correlation, design.correlation_factor)
        B = unknown_noise_columns(view, topology.mixing_matrix, model, gain * sigmas, R)
        w = gls_weights(B, c)
        return (w @ observed) / (w @ c)
    # the honest nodes' noises: fresh only in the first round of each step
    fresh = np.arange(K * R) % R == 0
    honest = (fresh[:, None] & ~np.isin(np.arange(n), V)[None, :]).ravel()
    scale = np.repeat(gain * np.repeat(sigmas, R), n)
    w = gls_weights(view.matrix[:, honest] * scale[honest], c)
    return (w @ observed) / (w @ c)


class _TrialPairs:
    """The pairwise keys of a chunk of stacked trials (trial t's node i is row t·n + i; each
    trial its own keys, edges only inside a trial) and each step's correlated mechanism."""

    def __init__(self, design: AuditDesign, trials: int, seed: int | None, first_trial: int):
        from dpdl.algorithms.correlated import make_correlation
        from dpdl.algorithms.pairwise import HostedKeys

        self.correlation = make_correlation(design.correlation, design.correlation_factor)
        self.correlated = self.correlation.pairwise_keys
        self.keys = None
        if self.correlated:
            root = None if seed is None else int(seed) * 1_000_003 + first_trial
            self.keys = HostedKeys(0, trials * design.nodes, root=root)
            self.keys.learn_publics(self.keys.own_publics)

    def at_step(self, mechanism, topology, k: int, rounds_per_step: int, n: int,
                noise: tuple[float, int], clip: float):  # fmt: skip
        """Step k's mechanism, and what the observers hold of it; ``noise`` (σ the engine
        adds, the model's width d), ``clip`` the step's bound."""
        from dpdl.algorithms.correlated import CorrelatedStep, undirected_neighbours

        local = undirected_neighbours(topology.mixing_matrix(k * rounds_per_step), range(n))
        trials = len(self.keys.pairs) // n
        neighbours = tuple(tuple(t * n + j for j in local[i])
                           for t in range(trials) for i in range(n))  # fmt: skip
        step = CorrelatedStep(k, k * rounds_per_step, 0, neighbours, self.keys, clip=clip)
        return _PairStep(self.correlation.at_step(mechanism, step), step, local,
                         self.correlation.correlation_factor * noise[0], noise[1])


@dataclass
class _PairStep:
    mechanism: object
    step: object
    local: tuple[tuple[int, ...], ...]
    pair_sigma: float  # σ_pair = f·σ of the step, as the engine draws it
    width: int  # d: the engine draws every coordinate of an edge's secret, the exact path's
    # further bits after the d words, so the same d reads the same value

    def held_by(self, observers, trials: int, n: int) -> np.ndarray:
        """(T, n) along e_0: Σ_v s_vj over the observers v adjacent to honest j (the secret
        enters j's noisy sum as s_jv = −s_vj; its update as −(γ/b)·s_jv), as v re-derives
        it from the edge's key."""
        from dpdl.algorithms.correlated import pair_secret

        out = np.zeros((trials, n))
        zero = torch.zeros((1, self.width), dtype=torch.float64)
        for v in observers:
            for j in self.local[v]:
                if j in observers:
                    continue
                for t in range(trials):
                    s = pair_secret(self.step.keys, t * n + v, t * n + j, self.step,
                                    self.pair_sigma, zero)  # fmt: skip
                    out[t, j] += float(s[0, 0])
        return out


def run_one_run(
    schedule: PrivacySchedule,
    design: AuditDesign,
    included: np.ndarray,
    *,
    noise_scale: float = 1.0,
    seed: int | None = None,
    noise: str = "exact",
    on_step: Callable[[], None] | None = None,
) -> np.ndarray:
    """ONE training run with m gradient canaries on node 0; return one score per canary.

    Canary c is the record x = e_c, y = 1e6 (its own reserved coordinate: the m canaries'
    clipped gradients are orthogonal), held by node 0 when ``included[c]``.  The ordinary
    records live on the remaining ``features − 1`` coordinates.  Scores as in
    :func:`run_trials`, one per canary coordinate.  Only the one-run bound of Steinke, Nasr &
    Jagielski applies to these scores (they come from one run, not independent trials).
    """
    design.validate()
    require(design.canary == "gradient", "a one-run audit uses gradient canaries")
    require(design.threat != "observer", "the observer threat is audited with independent "
            "trials (--trials), not one run")
    require(schedule.private, f"algorithm {schedule.algorithm!r} is not private: nothing to audit")
    require(
        math.isfinite(noise_scale) and noise_scale > 0,
        f"noise scale must be positive, got {noise_scale}",
    )
    from dpdl.topology import make_topology

    included = np.asarray(included, dtype=bool)
    m, n, J = included.size, design.nodes, design.records_per_node
    require(m >= 1, "a one-run audit needs at least one canary")
    x, y, _, _ = _dataset(design)
    d = m + design.features - 1
    inputs = torch.zeros((n, J + m, d), dtype=torch.float32)
    targets = torch.zeros((n, J + m), dtype=torch.float32)
    mask = torch.zeros((n, J + m), dtype=torch.bool)
    inputs[:, :J, m:] = torch.as_tensor(x[..., 1:], dtype=torch.float32)
    targets[:, :J] = torch.as_tensor(y, dtype=torch.float32)
    mask[:, :J] = True
    # The engine's padded layout: a node's real records come first, so the included canaries
    # fill the slots after the ordinary records (a canary is known by its coordinate).
    held = torch.as_tensor(np.flatnonzero(included))
    inputs[CANARY_NODE, J + torch.arange(held.numel()), held] = 1.0
    targets[CANARY_NODE, J:] = GRADIENT_CANARY_TARGET
    mask[CANARY_NODE, J : J + held.numel()] = True

    topology = make_topology(design.topology, n) if n >= 2 else None
    model = _Model(d)
    params = {"linear.weight": torch.zeros((n, 1, d), dtype=torch.float32)}
    weights = torch.ones(n, dtype=torch.float64)
    generators = make_node_generators(n, seed)
    mechanism = noise_mechanism(noise)
    p = schedule.sample_rate
    b = p * J
    score = torch.zeros(m, dtype=torch.float64)
    require(len(schedule.release_factors) == 1, "a one-run audit plays one release per step")
    for k in range(schedule.steps):
        clip = float(schedule.clip[k])
        sigma = float(schedule.sigma[k]) * schedule.release_factors[0]
        before = params["linear.weight"][CANARY_NODE, 0, :m].double()
        half = local_update(
            LocalStep(model, loss="squared_error", expected_batch_size=b, mechanism=mechanism),
            params, weights, NodeRecords(inputs, targets, mask, generators, p),
            StepArguments(private=True, clip=clip, sigma=sigma * noise_scale, lr=design.lr),
            step=k,
        )  # fmt: skip
        if design.threat == "messages":
            after = half.params["linear.weight"][CANARY_NODE, 0, :m].double()
            score += _log_likelihood_ratio(
                (after - before) * (b / design.lr), clip / sigma, sigma, p
            )
        if topology is not None:
            P, circ = _mixing(topology, k)
            params, weights = _mix_blocks(half.params, weights, 1, n, P, circ)
        else:
            params = half.params
        if on_step is not None:
            on_step()
    canary_w = params["linear.weight"][:, 0, :m]
    if not bool((canary_w.abs() < GRADIENT_CANARY_TARGET / 10).all()):
        raise DPDLError(
            "a gradient canary's coordinate drifted too far for its clipped gradient to stay "
            "fixed: lower the learning rate"
        )
    if design.threat == "messages":
        return score.numpy()
    return (canary_w.double().sum(dim=0) / weights.sum()).numpy()
