"""DECOR's pairwise-cancelling noise as a component of the private step (issue 41).

References: exact arithmetic (a pair's two contributions are bitwise negations; a release
moves its centre by at most one grid step), and the laws' closed forms (variance σ² + deg
σ_pair² per coordinate, checked at several standard errors)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dpdl.algorithms.correlated import (
    INDEPENDENT,
    CorrelatedStep,
    DecorNoise,
    ZeroSumNoise,
    make_correlation,
    pair_secret,
    undirected_neighbours,
)
from dpdl.algorithms.dyn_d2p import GAUSSIAN_RELEASE, make_node_generators
from dpdl.algorithms.pairwise import HostedKeys
from dpdl.engine.simulator import NodeData, Simulator, StepOptions
from dpdl.errors import DPDLError

pytestmark = pytest.mark.usefixtures("one_thread")

D = 20_000  # coordinates: the variance checks' relative standard error is sqrt(2 / D) = 1 %


def _keys(n: int, blocks=((0, 2), (2, 3)), root=None) -> list[HostedKeys]:
    """Pairwise keys of n nodes hosted in blocks; only public keys exchanged."""
    hosted = [HostedKeys(first, count, root=root) for first, count in blocks]
    publics = [key for keys in hosted for key in keys.own_publics]
    assert len(publics) == n
    for keys in hosted:
        keys.learn_publics(publics)
    return hosted


def test_the_two_ends_of_an_edge_add_bitwise_negated_grid_gaussians():
    left, right = _keys(5)
    step = CorrelatedStep(3, 1, 0, ((1, 2),), left)
    zero = torch.zeros((1, D), dtype=torch.float64)
    s_12 = pair_secret(left, 1, 2, step, 2.5, zero)
    s_21 = pair_secret(right, 2, 1, step, 2.5, zero)
    assert torch.equal(s_12.neg(), s_21)  # the same bits but the sign
    assert bool(((s_12 + s_21) == 0).all())
    grid = 2.0 ** (math.frexp(2.5)[1] - 1 - 10)
    assert torch.equal(torch.round(s_12 / grid) * grid, s_12)  # on the release's grid
    # a standard Gaussian times 2.5 (std within 5 standard errors of 1 %)
    assert abs(float(s_12.mean())) < 5 * 2.5 / math.sqrt(D)
    assert abs(float(s_12.std()) / 2.5 - 1) < 5 * math.sqrt(1 / (2 * D))
    # another edge, another step or round: other values
    for other in (pair_secret(left, 1, 3, step, 2.5, zero),
                  pair_secret(left, 1, 2, CorrelatedStep(4, 1, 0, ((2,),), left), 2.5, zero),
                  pair_secret(left, 1, 2, CorrelatedStep(3, 2, 0, ((2,),), left), 2.5, zero)):
        assert float((other == s_12).double().mean()) < 0.01


def test_undirected_neighbours_of_a_directed_graph():
    P = np.eye(4) * 0.5
    P[1, 0] = P[2, 1] = P[3, 2] = P[0, 3] = 0.5  # the directed ring 0 -> 1 -> 2 -> 3 -> 0
    assert undirected_neighbours(P, range(4)) == ((1, 3), (0, 2), (1, 3), (0, 2))
    assert undirected_neighbours(P, [2]) == ((1, 3),)


def test_the_pairwise_sums_do_not_depend_on_which_process_hosts_a_node(h):
    """Two processes (nodes 0-1, 2-4) compute what one process hosting all five does."""
    neighbours = undirected_neighbours(h.RandomColumnStochastic(5, seed=1).mixing_matrix(0),
                                       range(5))  # fmt: skip
    whole = _keys(5, blocks=((0, 5),), root=b"r" * 32)[0]
    parts = _keys(5, root=b"r" * 32)
    together = DecorNoise(2.0).at_step(GAUSSIAN_RELEASE,
                                       CorrelatedStep(3, 3, 0, neighbours, whole))
    apart = [DecorNoise(2.0).at_step(GAUSSIAN_RELEASE, CorrelatedStep(
        3, 3, keys.first, neighbours[keys.first:keys.first + len(keys.pairs)], keys))
        for keys in parts]  # fmt: skip
    want = together.pair_sums(64, 1.5)  # an edge with both ends here drawn once
    assert torch.equal(torch.cat([part.pair_sums(64, 1.5) for part in apart]), want)
    alone = _keys(5, blocks=tuple((i, 1) for i in range(5)), root=b"r" * 32)  # every end draws
    singles = [DecorNoise(2.0).at_step(GAUSSIAN_RELEASE, CorrelatedStep(
        3, 3, i, neighbours[i:i + 1], keys)).pair_sums(64, 1.5) for i, keys in enumerate(alone)]
    assert torch.equal(torch.cat(singles), want)
    assert float(want.abs().min()) > 0


def _release(mechanism, generators, sums, sigma):
    noise = mechanism.start(generators, sums.shape[1], sigma)
    return mechanism.noisy_sums(noise, {"w": sums.clone()})["w"].double()


def test_decor_cancels_in_the_network_sum_and_adds_deg_pair_variance_per_node(h):
    n, sigma, factor = 5, 1.0, 3.0
    graph = h.RandomColumnStochastic(n, seed=1)
    neighbours = undirected_neighbours(graph.mixing_matrix(0), range(n))
    assert len({len(peers) for peers in neighbours}) > 1  # degrees differ
    keys = HostedKeys(0, n, root=b"k" * 32)
    keys.learn_publics(keys.own_publics)
    decor = DecorNoise(factor).at_step(GAUSSIAN_RELEASE,
                                       CorrelatedStep(0, 0, 0, neighbours, keys, clip=1.0))
    sums = torch.randn(n, D, generator=torch.Generator().manual_seed(0)) * 4  # any S_i
    plain = _release(GAUSSIAN_RELEASE, make_node_generators(n, 7), sums, sigma)
    correlated = _release(decor, make_node_generators(n, 7), sums, sigma)
    pairs = decor.pair_sums(D, sigma * factor)
    grid = 2.0 ** -11  # the grid of sigma = 1
    # same X_i (the same streams): the releases differ by the pairwise sums, to one grid step
    assert float((correlated - plain - pairs).abs().max()) <= grid * (1 + 1e-9)
    # the pairwise parts cancel over the network up to float64 rounding of each node's sum
    scale = float(pairs.abs().max())
    assert float(pairs.sum(dim=0).abs().max()) <= 8 * 2.0**-52 * scale
    # the network sums of the releases differ by the rounding to the grid alone
    assert float((correlated.sum(0) - plain.sum(0)).abs().max()) <= n * grid * (1 + 1e-9)
    # each node's message variance is sigma^2 + deg sigma_pair^2 (5 standard errors)
    for i, peers in enumerate(neighbours):
        want = sigma**2 + len(peers) * (sigma * factor) ** 2
        got = float((correlated[i] - sums[i].double()).var())
        assert abs(got / want - 1) < 5 * math.sqrt(2 / D), (i, got, want)


def _sim(h, correlation=INDEPENDENT, seed: int | None = 4, n: int = 6):
    data = NodeData.from_arrays(*h.tiny_data(n, [9, 7, 8, 9, 6, 7]))
    return Simulator(h.tiny_model(seed=2), data, h.ExpGraph(n), lr=0.3,
                     expected_batch_size=3.0, seed=seed,
                     options=StepOptions(correlation=correlation))


STEP = {"private": True, "clip": 1.0, "sigma": 0.5}


def _run(sim, steps: int = 3):
    for _ in range(steps):
        sim.step(**STEP)
    return {k: v.clone() for k, v in sim.params.items()}


def test_a_seeded_decor_run_is_reproducible_and_differs_from_independent(h):
    independent = _run(_sim(h))
    repeated = _run(_sim(h))
    assert all(torch.equal(a, b) for a, b in zip(independent.values(), repeated.values(),
                                                 strict=True))
    decor = _run(_sim(h, DecorNoise(2.0)))
    again = _run(_sim(h, DecorNoise(2.0)))
    assert all(torch.equal(a, b) for a, b in zip(decor.values(), again.values(), strict=True))
    other = _run(_sim(h, DecorNoise(3.0)))
    one_decor, one_independent = _run(_sim(h, DecorNoise(2.0)), 1), _run(_sim(h), 1)
    for name in decor:
        assert not torch.equal(decor[name], other[name])
        # after one step (same batches, same X_i): each node's model moved by the pairwise
        # part, (γ/b) σ_pair sqrt(deg) ≈ 0.14 a coordinate, while the network sums (which
        # the mixing keeps) agree to the releases' grid rounding and float32 arithmetic
        gap = (one_decor[name] - one_independent[name]).abs().max()
        assert float(gap) > 0.05
        total = (one_decor[name].double().sum(0) - one_independent[name].double().sum(0))
        assert float(total.abs().max()) < 2e-5


def test_the_independent_path_is_the_engines_mechanism_untouched(h):
    sim = _sim(h)
    assert sim.pairwise is None and "pairwise_keys" not in sim.state_dict()
    assert sim._step_mechanism(0, None) is GAUSSIAN_RELEASE


@pytest.mark.parametrize("correlation", [DecorNoise, ZeroSumNoise])
def test_a_resume_keeps_the_pairwise_keys_in_the_processs_own_checkpoint(h, correlation):
    first = _sim(h, correlation(2.0), seed=None)  # OS keys: nothing to rebuild them from
    _run(first, 1)
    saved = first.state_dict()
    assert len(saved["pairwise_keys"]) == 6
    assert saved["pairwise_keys"][0].dtype == torch.uint8
    second = _sim(h, correlation(2.0), seed=None)
    second.load_state_dict(saved)
    assert all(torch.equal(a, b) for a, b in zip(_run(first, 2).values(),
                                                 _run(second, 2).values(), strict=True))
    refused = _sim(h, DecorNoise(2.0))
    with pytest.raises(DPDLError, match="holds no pairwise keys"):
        refused.load_state_dict(_sim(h).state_dict())


def test_bad_correlations_are_refused_in_one_line(h):
    with pytest.raises(DPDLError, match=r"correlation_factor .* in \(0, 100\], got 0"):
        make_correlation("pairwise", 0)
    for name in ("pairwise", "neighbourhood-zero-sum"):  # far above σ_k, the centre's
        with pytest.raises(DPDLError, match=r"in \(0, 100\], got 101"):  # rounding grows
            make_correlation(name, 101)
    with pytest.raises(DPDLError, match="got None"):
        make_correlation("pairwise")
    with pytest.raises(DPDLError, match=r"correlation_factor \(2.0\) scales correlated noise"):
        make_correlation("independent", 2.0)
    with pytest.raises(DPDLError, match="unknown noise correlation 'zip'"):
        make_correlation("zip")
    assert make_correlation("independent") is INDEPENDENT


    class Another:  # any mechanism but the exact release (the audit's broken samplers)
        name, certified = "another", False

    data = NodeData.from_arrays(*h.tiny_data(6, [9, 7, 8, 9, 6, 7]))
    with pytest.raises(DPDLError, match="exact Gaussian release only, not 'another'"):
        Simulator(h.tiny_model(seed=2), data, h.ExpGraph(6), lr=0.3,
                  options=StepOptions(mechanism=Another(), correlation=DecorNoise(1.0)))


def test_a_registered_correlation_is_a_setting_of_its_own(monkeypatch):
    from dpdl.algorithms import correlated
    from dpdl.training.settings import PrivacySection, validate_config

    class Halved(correlated.IndependentNoise):  # any object with the protocol's fields
        name = "halved"

    monkeypatch.setattr(correlated, "CORRELATIONS", dict(correlated.CORRELATIONS))
    correlated.register_correlation("halved", lambda correlation_factor: Halved())
    privacy = validate_config(PrivacySection, {"correlation": "halved"})
    assert privacy.noise_correlation.describe() == {"name": "halved"}
    with pytest.raises(DPDLError, match="'halved' is registered already"):
        correlated.register_correlation("halved", lambda correlation_factor: Halved())


# ---------------------------------------------------------------- zero-sum shares (Zip-DL)


def _one_process_keys(n: int, root=b"z" * 32) -> HostedKeys:
    keys = HostedKeys(0, n, root=root)
    keys.learn_publics(keys.own_publics)
    return keys


@pytest.mark.parametrize("name", ["neighbourhood-zero-sum", "pairwise"])
def test_the_engines_correlated_noise_has_the_accountings_covariance(h, name):
    """The released noise of one step, S = 0, against σ²·M Mᵀ with M the sources matrix of
    ``dpdl.accounting.correlated``'s noise model of the same name (its own construction from
    the model's definition), entry by entry within 5 standard errors."""
    from dpdl.accounting.correlated import make_noise_model

    n, sigma, factor = 5, 1.0, 1.5
    P = h.RandomColumnStochastic(n, seed=1).mixing_matrix(0)
    neighbours = undirected_neighbours(P, range(n))
    step = CorrelatedStep(2, 2, 0, neighbours, _one_process_keys(n), clip=1.0)
    mechanism = make_correlation(name, factor).at_step(GAUSSIAN_RELEASE, step)
    noise = _release(mechanism, make_node_generators(n, 3), torch.zeros(n, D), sigma).numpy()
    M = make_noise_model(name, factor).sources(P).matrix
    want = sigma**2 * M @ M.T
    got = noise @ noise.T / D
    se = np.sqrt((np.outer(np.diag(want), np.diag(want)) + want**2) / D)
    assert np.all(np.abs(got - want) < 5 * se), (got, want)
    assert np.abs(want - np.diag(np.diag(want))).max() > 0.3  # the nodes' noise is correlated


def test_zero_sum_shares_sum_to_zero_over_each_neighbourhood_and_cancel_in_the_network(h):
    n, scale = 5, 2.0
    neighbours = undirected_neighbours(h.RandomColumnStochastic(n, seed=1).mixing_matrix(0),
                                       range(n))  # fmt: skip
    step = CorrelatedStep(0, 0, 0, neighbours, _one_process_keys(n))
    from dpdl.algorithms.correlated import neighbourhood_shares

    for k, peers in enumerate(neighbours):
        shares = neighbourhood_shares(step, k, 1 + len(peers), 64, scale)
        assert shares.shape == (1 + len(peers), 64)
        assert float(shares.sum(0).abs().max()) <= 16 * 2.0**-52 * float(shares.abs().max())
    sums = make_correlation("neighbourhood-zero-sum", 1.0).at_step(
        GAUSSIAN_RELEASE, step).correlated_sums(64, scale)
    assert float(sums.sum(0).abs().max()) <= 64 * 2.0**-52 * float(sums.abs().max())
    assert float(sums.abs().min()) > 0
    # a node's own stream: another step, round or node gives other shares
    other = CorrelatedStep(1, 0, 0, neighbours, step.keys)
    assert not torch.equal(neighbourhood_shares(other, 0, 3, 64, scale),
                           neighbourhood_shares(step, 0, 3, 64, scale))


class _Threads:
    """An in-memory :class:`ShareChannel` between processes played by threads: each puts its
    outgoing shares in one mailbox and takes what it expects once all have put theirs."""

    def __init__(self, parties: int):
        import threading

        self.mailbox: dict = {}
        self.barrier = threading.Barrier(parties)

    def exchange(self, outgoing, expected, step):
        self.mailbox.update({pair: share.clone() for pair, share in outgoing.items()})
        self.barrier.wait()
        got = {pair: self.mailbox[pair] for pair in expected}
        self.barrier.wait()
        return got


def test_zero_sum_sums_do_not_depend_on_which_process_hosts_a_node(h):
    """Blocks 0-1 and 2-4 (threads exchanging the shares that cross) hold bitwise what one
    process hosting all five does; the shares that cross are exactly the cross edges'."""
    from concurrent.futures import ThreadPoolExecutor

    n = 5
    neighbours = undirected_neighbours(h.RandomColumnStochastic(n, seed=1).mixing_matrix(0),
                                       range(n))  # fmt: skip
    whole = ZeroSumNoise(2.0).at_step(GAUSSIAN_RELEASE, CorrelatedStep(
        3, 3, 0, neighbours, _keys(n, blocks=((0, n),), root=b"r" * 32)[0]))
    want = whole.correlated_sums(64, 1.5)
    channel = _Threads(2)
    parts = [ZeroSumNoise(2.0).at_step(GAUSSIAN_RELEASE, CorrelatedStep(
        3, 3, keys.first, neighbours[keys.first:keys.first + len(keys.pairs)], keys, channel))
        for keys in _keys(n, root=b"r" * 32)]  # fmt: skip
    with ThreadPoolExecutor(2) as pool:
        got = list(pool.map(lambda part: part.correlated_sums(64, 1.5), parts))
    assert torch.equal(torch.cat(got), want)
    crossing = {(k, i) for i in range(n) for k in neighbours[i] if (k < 2) != (i < 2)}
    assert set(channel.mailbox) == crossing and crossing
    lonely = ZeroSumNoise(2.0).at_step(GAUSSIAN_RELEASE, CorrelatedStep(
        3, 3, 0, neighbours[:2], _keys(n, root=b"r" * 32)[0]))
    with pytest.raises(DPDLError, match="need a channel"):
        lonely.correlated_sums(64, 1.5)


def test_a_seeded_zero_sum_run_is_reproducible_and_keeps_the_network_sum(h):
    runs = [_run(_sim(h, ZeroSumNoise(2.0)), 1) for _ in range(2)]
    independent = _run(_sim(h), 1)
    for name in independent:
        assert torch.equal(runs[0][name], runs[1][name])
        assert float((runs[0][name] - independent[name]).abs().max()) > 0.05
        # the shares are off the release's grid (their mean is subtracted), so each node's
        # release may round to the neighbouring cell: one grid step (2^-11 at σ = 0.5) times
        # γ/b = 0.1 per node at most, plus float32 arithmetic
        total = runs[0][name].double().sum(0) - independent[name].double().sum(0)
        assert float(total.abs().max()) < 6 * 2.0**-11 * 0.1 * (1 + 1e-6) + 2e-5


def test_zero_sum_noise_is_refused_where_it_cannot_be_carried_or_audited(h):
    from dpdl.audit.trials import AuditDesign

    with pytest.raises(DPDLError, match="neighbourhood-zero-sum noise needs .* got -1"):
        make_correlation("neighbourhood-zero-sum", -1)
    with pytest.raises(DPDLError, match="draw independent or pairwise .* not 'neighbourhood"):
        AuditDesign(threat="observer", correlation="neighbourhood-zero-sum",
                    correlation_factor=1.0).validate()


@pytest.mark.parametrize("name", ["pairwise", "neighbourhood-zero-sum"])
def test_a_centre_beyond_the_rounding_margin_is_refused_before_anything_is_released(h, name):
    """‖S_i + c_i‖ ≤ 2.7e11 C (MATH §10.6): here the correlated part (std 100·σ, σ = 1) over
    20 000 coordinates has norm ~3e4, and C = 1e-8 puts the bound at 2.7e3."""
    n = 5
    neighbours = undirected_neighbours(h.RandomColumnStochastic(n, seed=1).mixing_matrix(0),
                                       range(n))  # fmt: skip
    sums = torch.zeros(n, D)
    for clip, refused in ((1e-8, True), (1.0, False)):
        step = CorrelatedStep(0, 0, 0, neighbours, _one_process_keys(n), clip=clip)
        mechanism = make_correlation(name, 100.0).at_step(GAUSSIAN_RELEASE, step)
        noise = mechanism.start(make_node_generators(n, 3), D, 1.0)
        if refused:
            with pytest.raises(DPDLError, match=r"correlated centre has norm .* C, above "
                                                r"2.7e\+11 C: .* nothing is released"):
                mechanism.noisy_sums(noise, {"w": sums.clone()})
        else:
            assert mechanism.noisy_sums(noise, {"w": sums.clone()})["w"].abs().max() > 0
    without = CorrelatedStep(0, 0, 0, neighbours, _one_process_keys(n))  # no clip: refused
    mechanism = make_correlation(name, 1.0).at_step(GAUSSIAN_RELEASE, without)
    with pytest.raises(DPDLError, match="needs the step's clip bound, got None"):
        mechanism.noisy_sums(mechanism.start(make_node_generators(n, 3), 8, 1.0),
                             {"w": torch.zeros(n, 8)})
