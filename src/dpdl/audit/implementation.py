"""The implementation threat (MATH.md §10.5): does what the engine releases, bit for bit, leak
more than the mechanism it is accounted as?

The other threats audit the *mechanism* (canaries scored by the likelihood ratio of a real
Gaussian).  This one attacks the *arithmetic*, as an adversary who knows the code, the config,
the public initial model and every record but the target: each test is played through the
real engine's private step (:class:`~dpdl.engine.Simulator`, any noise mechanism), as a DP
game between a data set with the target (D) and without it (D'), and its guesses give a
Clopper-Pearson lower bound on ε (MATH.md §8), against the calibrated claim.

* ``lattice`` (the review's ``fp_lattice.py``): the old Box-Muller sampler's radius formed in
  float32 puts xi_j^2 + xi_{P+j}^2 on 2^-17 Z; the noise an attacker reads off the message
  under a hypothesis about the clipped sum sits on that lattice only under the true one.
* ``preimage`` (``fp_hardened.py``): under the old float32 arithmetic fl(fl(x + s xi) + a S)
  some messages have no float32 xi behind them; a hypothesis without a preimage at one
  coordinate is ruled out with certainty.
* ``record-play`` (grey-box, after Cebere, Erb, Desfontaines, Bellet & Fitzsimons 2026): the
  two worlds run with *identical* randomness, and the clipped sums entering the noise
  mechanism are compared: at the target's node they may differ by at most the declared
  sensitivity C, at every other node (and where the target was not sampled) by nothing; any
  difference there is a leak the accounting does not see (its μ per step is reported).

The game: a softmax regression on digits (d = 650), node 0 holds 7 records and the target
(D) or the 7 alone (D'), node 1 seven others, b = 7 = J_min so p = 1, one step at the σ that
the claimed (ε, δ) calibrates; ``trials`` games per world.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from dpdl.accounting.schedules import ShapeOptions, make_schedule
from dpdl.algorithms.dyn_d2p import (
    LocalStep,
    NodeBatch,
    NodeRecords,
    StepArguments,
    clipped_record_sums,
    local_update,
    make_node_generators,
    per_record_grads,
)
from dpdl.algorithms.per_sample import SENSITIVITY_MARGIN
from dpdl.algorithms.randomness import derive_key
from dpdl.audit.stats import epsilon_lower_bound, threshold_bounds
from dpdl.audit.trials import noise_mechanism
from dpdl.engine.simulator import NodeData, Simulator, StepOptions, stack_params
from dpdl.errors import require

__all__ = ["IMPLEMENTATION_TESTS", "ImplementationAudit", "TestResult", "audit_implementation"]

LR, CLIP = 0.1, 1.0
_LATTICE = 2.0**-17
_OTHERS, _NODE1 = 7, 7  # records of node 0 besides the target, and of node 1


@dataclass(frozen=True)
class TestResult:
    """One test: its DP game's counts and ε lower bound, or record-play's measurements."""

    name: str
    epsilon_lower: float
    refuted: bool
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ImplementationAudit:
    noise: str
    epsilon_claimed: float
    delta: float
    sigma: float
    trials: int
    confidence: float
    tests: tuple[TestResult, ...]

    @property
    def claim_refuted(self) -> bool:
        return any(t.refuted for t in self.tests)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["claim_refuted"] = self.claim_refuted
        return out


# --------------------------------------------------------------------------- the game
class _Game:
    """The one-step game of the module doc, with what the attacker computes in float64."""

    def __init__(self, noise: str, epsilon: float, delta: float, seed: int | None = None):
        from dpdl.data import load_dataset
        from dpdl.models import make_model

        data = load_dataset("digits", seed=0)
        pool = np.random.default_rng(1).permutation(len(data.x_train))[:20]
        self.x = torch.tensor(data.x_train[pool], dtype=torch.float32).reshape(20, -1)
        self.y = torch.tensor(data.y_train[pool], dtype=torch.int64)
        self.model = make_model("logreg", (64,), 10, seed=0)  # the public initial model
        self.x0 = torch.cat([p.detach().reshape(-1) for p in self.model.parameters()])
        schedule = make_schedule("const-d2p", epsilon=epsilon, delta=delta, steps=1,
                                 sample_rate=1.0, options=ShapeOptions(clip=CLIP),
                                 calibrate="pld")  # fmt: skip
        self.sigma = float(schedule.sigma[0])
        self.mechanism = noise_mechanism(noise)
        self.b = float(_OTHERS)
        # seeded games (a reproducible audit) key game t's streams from (seed, t)
        self.seed, self.games = seed, 0
        self._shifts: dict[bool, np.ndarray] = {}

    def node0(self, with_target: bool):
        count = _OTHERS + int(with_target)
        return self.x[:count], self.y[:count]

    def message(self, with_target: bool) -> np.ndarray:
        """Node 0's released x^{1/2} (float32 values, as float64) after one engine step."""
        inputs = [self.node0(with_target), (self.x[10 : 10 + _NODE1], self.y[10 : 10 + _NODE1])]
        j_max = max(len(y) for _, y in inputs)
        xs = torch.zeros((2, j_max, 64))
        ys = torch.zeros((2, j_max), dtype=torch.int64)
        mask = torch.zeros((2, j_max), dtype=torch.bool)
        for i, (x, y) in enumerate(inputs):
            xs[i, : len(y)], ys[i, : len(y)], mask[i, : len(y)] = x, y, True
        from dpdl.topology import make_topology

        seed = None if self.seed is None else derive_key("implementation game", self.seed,
                                                         self.games)  # fmt: skip
        self.games += 1
        sim = Simulator(self.model, NodeData.from_arrays(xs, ys, mask), make_topology("ring", 2),
                        lr=LR, expected_batch_size=self.b, seed=seed,
                        options=StepOptions(mechanism=self.mechanism))  # fmt: skip
        require(sim.sample_rate == 1.0, "the implementation game needs p = 1")
        sim.step(private=True, clip=CLIP, sigma=self.sigma, mix=False)
        return torch.cat([p[0].reshape(-1) for p in sim.params.values()]).double().numpy()

    def shift(self, with_target: bool) -> np.ndarray:
        """(lr / b) · node 0's clipped sum under a hypothesis, exactly (float64)."""
        if with_target not in self._shifts:
            self._shifts[with_target] = self._shift(with_target)
        return self._shifts[with_target]

    def _shift(self, with_target: bool) -> np.ndarray:
        x, y = self.node0(with_target)
        params = {k: v.detach().unsqueeze(0) for k, v in self.model.named_parameters()}
        batch = NodeBatch(x, y, torch.zeros(len(y), dtype=torch.int64), 1)
        grads = per_record_grads(self.model, params, batch)
        flat = torch.cat([g.reshape(len(y), -1) for g in grads.values()], 1).double()
        bound = CLIP * SENSITIVITY_MARGIN  # the attacker knows the code
        clipped = flat * torch.clamp(bound / flat.norm(dim=1, keepdim=True), max=1.0)
        return (LR / self.b * clipped.sum(0)).numpy()

    def engine_sum(self, with_target: bool) -> np.ndarray:
        """Node 0's clipped sum as the engine forms it in float32 (both nodes, one chunk)."""
        node0 = self.node0(with_target)
        x = torch.cat([node0[0], self.x[10 : 10 + _NODE1]])
        y = torch.cat([node0[1], self.y[10 : 10 + _NODE1]])
        node = torch.tensor([0] * len(node0[1]) + [1] * _NODE1)
        params = stack_params(self.model, 2, torch.device("cpu"))
        sums = clipped_record_sums(self.model, params, NodeBatch(x, y, node, 2), CLIP)
        return torch.cat([s[0].reshape(-1) for s in sums.values()]).numpy()


# --------------------------------------------------------------------------- the attacks
def lattice_guess(game: _Game, message: np.ndarray, rng) -> bool:
    """True (the target is in) when more read-off pairs sit on the radius lattice under D."""
    s = LR * game.sigma / game.b
    scores = []
    for with_target in (True, False):
        xi = (game.x0.double().numpy() - game.shift(with_target) - message) / s
        pairs = xi.size // 2
        half = (xi.size + 1) // 2
        r2 = xi[:pairs] ** 2 + xi[half : half + pairs] ** 2
        u = r2[r2 < 6.25] / _LATTICE
        scores.append(float(np.mean(np.abs(u - np.round(u)) < 0.1)) if u.size else 0.0)
    if scores[0] == scores[1]:
        return bool(rng.random() < 0.5)
    return scores[0] > scores[1]


def _f32(values: np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=np.float64).astype(np.float32).astype(np.float64)


def has_preimage(game: _Game, message: np.ndarray, total: np.ndarray, window: int = 24) -> bool:
    """Whether every informative coordinate of ``message`` has a float32 xi with
    fl(fl(x0 + s32 xi) + a32 S) == message, either rounding of each add (a fused multiply-add
    or not), S the engine's float32 clipped sum under the hypothesis (``fp_hardened.py``)."""
    s = np.float64(np.float32(-LR * game.sigma / game.b))
    a = np.float64(np.float32(-LR / game.b))
    x = game.x0.double().numpy()
    centre = ((message - a * total - x) / s).astype(np.float32)
    ulp_m = np.spacing(np.abs(message.astype(np.float32))).astype(np.float64)
    ulp_xi = np.spacing(np.abs(centre)).astype(np.float64)
    informative = np.ceil(4 * ulp_m / (abs(s) * ulp_xi)) + 2 <= window
    found = np.zeros(message.shape, dtype=bool)
    candidate = centre.copy()
    for _ in range(window):
        candidate = np.nextafter(candidate, np.float32(-np.inf))
    for _ in range(2 * window + 1):
        xi = candidate.astype(np.float64)
        for fused in (True, False):
            y = _f32(x + s * xi) if fused else _f32(x + _f32(s * xi))
            found |= (_f32(y + a * total) == message) | (_f32(y + _f32(a * total)) == message)
        candidate = np.nextafter(candidate, np.float32(np.inf))
    return bool(found[informative].all())


def preimage_guess(game: _Game, message: np.ndarray, rng, totals) -> bool:
    """In if only D's sum has a preimage, out if only D''s does, a coin otherwise."""
    with_ok = has_preimage(game, message, totals[True])
    without_ok = has_preimage(game, message, totals[False])
    if with_ok != without_ok:
        return with_ok
    return bool(rng.random() < 0.5)


def _game_test(name: str, game: _Game, trials: int, guess, confidence: float,
               delta: float, epsilon: float) -> TestResult:  # fmt: skip
    """``trials`` games per world; ``guess(message, rng)`` says in (True) or out."""
    rng = np.random.default_rng(game.seed)
    members = np.repeat([True, False], trials)
    said = np.array([guess(game.message(bool(m)), rng) for m in members])
    bounds = threshold_bounds(said.astype(float), members, [0.5], confidence)
    eps_lb = epsilon_lower_bound(bounds, delta)
    detail = {"said_in_given_in": int(said[members].sum()), "trials_per_world": trials,
              "said_in_given_out": int(said[~members].sum())}  # fmt: skip
    return TestResult(name, eps_lb, eps_lb > epsilon, detail)


# --------------------------------------------------------------------------- record-play
class _Recording:
    """A noise mechanism that records the clipped sums it is given, then defers to another."""

    def __init__(self, inner):
        self.inner, self.name, self.certified = inner, inner.name, inner.certified
        self.sums: list[np.ndarray] = []

    def start(self, *args, **kwargs):
        return self.inner.start(*args, **kwargs)

    def noisy_sums(self, noise, sums):
        self._keep(sums)
        return self.inner.noisy_sums(noise, sums)

    def noisy_step(self, noise, x, sums, step_size, out):
        self._keep(sums)
        return self.inner.noisy_step(noise, x, sums, step_size, out)

    def _keep(self, sums) -> None:
        m = next(iter(sums.values())).shape[0]
        self.sums.append(torch.cat([s.reshape(m, -1) for s in sums.values()], 1).double().numpy())


def record_play(noise: str, sigma: float, trials: int, *, nodes: int = 4,
                records: int = 12, rate: float = 0.5) -> TestResult:  # fmt: skip
    """Neighbouring runs with identical streams through ``local_update`` (an MLP, ``nodes``
    nodes, Poisson rate ``rate``): the measured distance of the clipped sums entering the
    noise against the declared sensitivity C at the target's node when it was sampled, and
    against 0 everywhere else."""
    from dpdl.data import load_dataset
    from dpdl.models import make_model

    data = load_dataset("digits", seed=0)
    x = torch.tensor(data.x_train[: nodes * records + 1], dtype=torch.float32).reshape(-1, 64)
    y = torch.tensor(data.y_train[: nodes * records + 1], dtype=torch.int64)
    model = make_model("mlp", (64,), 10, seed=0)
    worst_ratio, worst_other, sampled = 0.0, 0.0, 0
    for trial in range(trials):
        sums = {}
        for with_target in (True, False):
            recorder = _Recording(noise_mechanism(noise))
            inputs, targets, mask = _record_play_data(x, y, nodes, records, with_target)
            params = stack_params(model, nodes, torch.device("cpu"))
            local_update(LocalStep(model, expected_batch_size=rate * records,
                                   mechanism=recorder),
                         params, torch.ones(nodes, dtype=torch.float64),
                         NodeRecords(inputs, targets, mask, make_node_generators(nodes, trial),
                                     rate),
                         StepArguments(private=True, clip=CLIP, sigma=sigma, lr=LR),
                         step=0)  # fmt: skip
            sums[with_target] = recorder.sums[0]
        target_in = bool(make_node_generators(nodes, trial)[0].words(records + 1)[records]
                         < np.uint64(int(rate * 2.0**64)))  # fmt: skip
        diff = np.linalg.norm(sums[True] - sums[False], axis=1)
        sampled += target_in
        worst_ratio = max(worst_ratio, float(diff[0]) / CLIP if target_in else 0.0)
        others = diff[1:] if target_in else diff
        worst_other = max(worst_other, float(others.max()))
    refuted = worst_ratio > 1.0 or worst_other > 0.0
    detail = {"trials": trials, "target_sampled": sampled,
              "max_distance_over_declared_sensitivity": worst_ratio,
              "max_distance_elsewhere": worst_other,
              "mu_elsewhere_per_step": worst_other / sigma}  # fmt: skip
    return TestResult("record-play", 0.0, refuted, detail)


def _record_play_data(x, y, nodes, records, with_target):
    j_max = records + 1
    inputs = torch.zeros((nodes, j_max, 64))
    targets = torch.zeros((nodes, j_max), dtype=torch.int64)
    mask = torch.zeros((nodes, j_max), dtype=torch.bool)
    for i in range(nodes):
        lo = i * records
        inputs[i, :records], targets[i, :records] = x[lo : lo + records], y[lo : lo + records]
        mask[i, :records] = True
    if with_target:  # the target: the last record, on node 0
        inputs[0, records], targets[0, records], mask[0, records] = x[-1], y[-1], True
    return inputs, targets, mask


# --------------------------------------------------------------------------- the audit
IMPLEMENTATION_TESTS = ("lattice", "preimage", "record-play")


def audit_implementation(noise: str = "exact", *, epsilon: float = 1.0, delta: float = 1e-5,
                         trials: int = 100, confidence: float = 0.95,
                         tests=IMPLEMENTATION_TESTS, seed: int | None = None,
                         ) -> ImplementationAudit:  # fmt: skip
    """Every test of the module doc against the engine with mechanism ``noise``; ``seed``
    makes the games reproducible (the default draws every stream's key from the OS)."""
    require(trials >= 2, f"the implementation audit needs at least 2 trials, got {trials}")
    unknown = sorted(set(tests) - set(IMPLEMENTATION_TESTS))
    require(not unknown, f"unknown implementation test(s) {unknown}; choose from "
            f"{', '.join(IMPLEMENTATION_TESTS)}")  # fmt: skip
    game = _Game(noise, epsilon, delta, seed)
    per_test_confidence = 1 - (1 - confidence) / len(tests)  # Bonferroni over the tests
    results = []
    if "lattice" in tests:
        results.append(_game_test("lattice", game, trials, lambda m, r: lattice_guess(game, m, r),
                                  per_test_confidence, delta, epsilon))  # fmt: skip
    if "preimage" in tests:
        totals = {w: game.engine_sum(w) for w in (True, False)}
        results.append(_game_test(
            "preimage", game, trials, lambda m, r: preimage_guess(game, m, r, totals),
            per_test_confidence, delta, epsilon))  # fmt: skip
    if "record-play" in tests:
        results.append(record_play(noise, game.sigma, max(2, trials // 10)))
    return ImplementationAudit(noise, float(epsilon), float(delta), game.sigma, int(trials),
                               float(confidence), tuple(results))  # fmt: skip
