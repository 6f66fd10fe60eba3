"""nn.Embedding on token ids (issue 40, item 6: a per-sample layer): the record dtype threaded
from the data to the engine (integer inputs stay int64), the book-keeping handler's exact
per-record norms and clipped sums against a brute-force torch.func reference (per-record
gradients, clip, sum), its refusals, and a bag-of-embeddings text classifier trained through
``dpdl.train``.  The recipe of docs/EXTENDING.md ("A per-sample layer") is this file."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

import dpdl
import dpdl.algorithms.per_sample as per_sample
from dpdl.algorithms.dyn_d2p import LOSSES, NodeBatch, clipped_record_sums, mean_batch_grads
from dpdl.algorithms.per_sample_layers import EmbeddingTerms, LinearTerms
from dpdl.data import stack_local_datasets
from dpdl.engine import NodeData, stack_params
from dpdl.errors import DPDLError
from dpdl.models import validate_model
from dpdl.training.inputs import check_eval_records

VOCAB, WIDTH, CLASSES = 12, 5, 3
MARGIN = 1 - 2.0**-12  # per_sample.SENSITIVITY_MARGIN: the bound every clip is applied at


pytestmark = pytest.mark.usefixtures("one_thread")


class BagOfEmbeddings(nn.Module):
    """Token ids (T,) -> embeddings -> mean over the tokens -> a linear classifier."""

    def __init__(self, vocab=VOCAB, width=WIDTH, classes=CLASSES, padding_idx=None):
        super().__init__()
        self.embed = nn.Embedding(vocab, width, padding_idx=padding_idx)
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        return self.head(self.embed(x).flatten(1, -2).mean(dim=1))


class TokenMixer(nn.Module):
    """Embeddings, a linear layer at every position, LayerNorm, mean, head: the embedding's
    output gradient differs per position."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.mix = nn.Linear(WIDTH, 6)
        self.norm = nn.LayerNorm(6)
        self.head = nn.Linear(6, CLASSES)

    def forward(self, x):
        return self.head(torch.tanh(self.norm(self.mix(self.embed(x)))).mean(dim=1))


def _token_batch(n, counts, record_shape, high=4, seed=0):
    """Token ids drawn from a few values (``high``): records repeat tokens."""
    g = torch.Generator().manual_seed(seed)
    R = int(sum(counts))
    inputs = torch.randint(0, high, (R, *record_shape), generator=g)
    targets = torch.randint(0, CLASSES, (R,), generator=g)
    node = torch.as_tensor(np.repeat(np.arange(n), counts))
    return NodeBatch(inputs, targets, node, n)


def _nodes_params(model, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {name: p + 0.3 * torch.randn(p.shape, generator=g)
            for name, p in stack_params(model, n, torch.device("cpu")).items()}  # fmt: skip


def torch_func_grads(model, params, batch):
    """Every record's gradient at its node's parameters, in float64: torch.func's ``grad`` of
    a one-record functional call, ``vmap``-ed over the records (autograd's own embedding
    backward, dense)."""
    wide = {name: p.double().index_select(0, batch.node) for name, p in params.items()}

    def record_loss(p, x, y):
        out = functional_call(model, p, (x.unsqueeze(0),))
        return LOSSES["cross_entropy"](out, y.unsqueeze(0)).sum()

    return vmap(grad(record_loss))(wide, batch.inputs, batch.targets)


def reference_clipped_sums(model, params, batch, clip):
    """The brute force: per-record gradients, each clipped to ``clip`` alone, summed per
    node, float64."""
    grads = torch_func_grads(model, params, batch)
    norms = torch.sqrt(sum(g.flatten(1).square().sum(1) for g in grads.values()))
    factors = (clip * MARGIN / norms).clamp(max=1.0)
    out = {}
    for name, g in grads.items():
        total = torch.zeros((batch.n_nodes, *g.shape[1:]), dtype=torch.float64)
        out[name] = total.index_add_(0, batch.node, g * factors.view(-1, *[1] * (g.dim() - 1)))
    return out, norms


CASES = {
    "bag": (lambda: BagOfEmbeddings(), (7,)),
    "bag-padding-idx": (lambda: BagOfEmbeddings(padding_idx=0), (7,)),
    "bag-2d-records": (lambda: BagOfEmbeddings(), (2, 4)),
    "bag-one-token": (lambda: BagOfEmbeddings(), (1,)),
    "token-mixer": (lambda: TokenMixer(), (6,)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_embedding_clipped_sums_equal_the_torch_func_reference(case):
    build, shape = CASES[case]
    torch.manual_seed(0)
    model = build()
    n, counts = 4, [3, 0, 5, 2]  # uneven batches and a node that sampled nothing
    batch = _token_batch(n, counts, shape, seed=1)
    params = _nodes_params(model, n)
    plan = per_sample.book_keeping_plan(model, shape, params, torch.int64)
    assert plan.problems == [] and isinstance(plan.layers[0], EmbeddingTerms)
    _, norms = reference_clipped_sums(model, params, batch, 1.0)
    for clip in (float(norms.median()), float(norms.max()) * 2):  # some clipped; none
        want, _ = reference_clipped_sums(model, params, batch, clip)
        got = clipped_record_sums(model, params, batch, clip, method="book-keeping")
        for name in want:
            torch.testing.assert_close(got[name].double(), want[name], atol=1e-6, rtol=1e-5)
            assert torch.equal(got[name][1], torch.zeros_like(got[name][1]))
        # "auto" reads the model with book-keeping: the same numbers, bit for bit
        auto = clipped_record_sums(model, params, batch, clip)
        assert all(torch.equal(auto[name], got[name]) for name in got)
    if "padding" in case:  # the padding row's gradient is zero, as autograd's
        assert torch.equal(got["embed.weight"][:, 0], torch.zeros_like(got["embed.weight"][:, 0]))


def test_per_record_norms_are_exact_repeated_tokens_summed_before_squaring():
    """The handler's squared norm of each record is that of its dense gradient (torch.func):
    a repeated token's gradients are summed into one row, then squared; a record of one token
    six times has the squared norm of the summed gradient, not the sum of its positions'."""
    torch.manual_seed(0)
    model = TokenMixer().double()
    batch = _token_batch(1, [5], (6,), high=3, seed=2)
    batch.inputs[0] = 2  # one token, six times
    params = {name: p.double() for name, p in _nodes_params(model, 1).items()}
    dense = torch_func_grads(model, params, batch)["embed.weight"]
    # the embedding's inputs and output gradients, as book-keeping's hooks see them
    kept = {}

    def leaf(module, args, out):
        kept["a"], kept["g"] = args[0], out.detach().requires_grad_(True)
        return kept["g"]

    handle = model.embed.register_forward_hook(leaf)
    out = functional_call(model, {name: p[0] for name, p in params.items()}, (batch.inputs,))
    handle.remove()
    g = torch.autograd.grad(LOSSES["cross_entropy"](out, batch.targets).sum(), kept["g"])[0]
    layer = EmbeddingTerms(model.embed, "embed.weight", None, (6,), (6, WIDTH))
    sq, terms = layer.terms(kept["a"], g)
    torch.testing.assert_close(sq, dense.flatten(1).square().sum(1), atol=1e-14, rtol=1e-12)
    summed, apart = g[0].sum(0).square().sum(), g[0].square().sum()
    torch.testing.assert_close(sq[0], summed, atol=1e-14, rtol=1e-12)
    assert abs(float(summed - apart)) > 1e-3 * float(apart)  # the two really differ here
    assert int(terms.index[0, 0]) == 2 and not bool(terms.rows[0, 1:].any())


@pytest.mark.parametrize("records_per_chunk", [1, 3, 1000, "units of two"])
def test_chunks_units_and_the_sgp_sums_change_no_number(records_per_chunk, monkeypatch):
    """Chunks that split a node's records over units (a node's rows added per unit; "units of
    two": chunks of up to eight records in units of two, several of a node, regrouped by node
    where the sums are not private), and the non-private step's unit sums, against the
    references."""
    torch.manual_seed(0)
    model = BagOfEmbeddings(padding_idx=1)
    n, counts = 5, [4, 1, 7, 0, 3]
    batch = _token_batch(n, counts, (5,), high=6, seed=3)
    params = _nodes_params(model, n, seed=4)
    plan = per_sample.book_keeping_plan(model, (5,), params, torch.int64)
    if records_per_chunk == "units of two":
        monkeypatch.setattr(per_sample, "plan_chunks", lambda counts, *args, **kwargs:
                            per_sample._grouped(per_sample._split(counts, 2), 1.0, 8, 0.0)[1])
    else:
        monkeypatch.setattr(per_sample, "CHUNK_BYTES", records_per_chunk * plan.bytes_per_record)
    _, norms = reference_clipped_sums(model, params, batch, 1.0)
    clip = float(norms.median())
    want, _ = reference_clipped_sums(model, params, batch, clip)
    got = clipped_record_sums(model, params, batch, clip, method="book-keeping")
    for name in want:
        torch.testing.assert_close(got[name].double(), want[name], atol=1e-6, rtol=1e-5)
    grads = torch_func_grads(model, params, batch)

    def weighted(weights):
        return {name: torch.zeros((n, *g.shape[1:]), dtype=torch.float64).index_add_(
            0, batch.node, g * weights.view(-1, *[1] * (g.dim() - 1)))
            for name, g in grads.items()}  # fmt: skip

    # the non-private step (batched path: < 4 records a node): each unit's sum, then its weight
    mean = mean_batch_grads(model, params, batch)
    want = weighted(1.0 / batch.counts.clamp_min(1).double()[batch.node])
    for name in want:
        torch.testing.assert_close(mean[name].double(), want[name], atol=1e-6, rtol=1e-5)
    # weights that differ within a node: the SparseRows sums, units regrouped by node
    weights = torch.rand(batch.size, generator=torch.Generator().manual_seed(5))
    got = per_sample.clipped_sums_by_node(plan, model, params, batch, None,
                                          loss_fn=LOSSES["cross_entropy"], weights=weights)
    want = weighted(weights.double())
    for name in want:
        torch.testing.assert_close(got[name].double(), want[name], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(("option", "words"), [
    ({"max_norm": 1.0}, "max_norm"),
    ({"sparse": True}, "sparse=True"),
    ({"scale_grad_by_freq": True}, "scale_grad_by_freq"),
])  # fmt: skip
def test_embedding_options_the_engine_cannot_train_are_refused_in_one_line(option, words):
    model = nn.Sequential(nn.Embedding(VOCAB, WIDTH, **option), nn.Flatten(), nn.Linear(WIDTH, 2))
    with pytest.raises(DPDLError, match=words) as err:
        validate_model(model)
    assert "\n" not in str(err.value) and "'0' (Embedding)" in str(err.value)
    validate_model(nn.Sequential(nn.Embedding(VOCAB, WIDTH, padding_idx=0), nn.Flatten(),
                                 nn.Linear(WIDTH, 2)))  # padding_idx is supported


def test_the_record_dtype_is_threaded_from_the_data():
    """Integer inputs stay int64 (token ids), real ones become float32 as before; nodes that
    mix them, and real-valued evaluation inputs for integer records, are refused."""
    ids = np.array([[[1, 2], [3, 0]], [[4, 4], [0, 0]]], dtype=np.int32)
    y, mask = np.zeros((2, 2), dtype=np.int64), np.array([[True, True], [True, False]])
    assert NodeData.from_arrays(ids, y, mask).inputs.dtype == torch.int64
    assert NodeData.from_arrays(ids.astype(np.float64), y, mask).inputs.dtype == torch.float32
    X, _, _ = stack_local_datasets([(ids[0], y[0]), (ids[1], y[1])])
    assert X.dtype == np.int64
    with pytest.raises(DPDLError, match="integer records .token ids. on some nodes"):
        stack_local_datasets([(ids[0], y[0]), (ids[1].astype(np.float32), y[1])])
    with pytest.raises(DPDLError, match="real-valued inputs but the nodes' records are integ"):
        check_eval_records((torch.full((3, 2), 0.5), torch.zeros(3, dtype=torch.int64)), "eval",
                           record_shape=(2,), loss="cross_entropy", classes=2,
                           record_dtype=torch.int64)  # fmt: skip


# ------------------------------------------------------------------ through dpdl.train
def _topic_records(count, rng, length=8, signal=0.9):
    """An easy text task: class c's records draw each token from its own half of the
    vocabulary (tokens c * V/2 .. (c + 1) * V/2 - 1) with probability ``signal``, else from the
    whole vocabulary."""
    half = VOCAB // 2
    y = rng.integers(0, 2, count)
    own = y[:, None] * half + rng.integers(0, half, (count, length))
    noise = rng.integers(0, VOCAB, (count, length))
    x = np.where(rng.random((count, length)) < signal, own, noise)
    return x.astype(np.int64), y


def test_a_bag_of_embeddings_classifier_trains_through_dpdl_train(monkeypatch):
    """Four nodes of token-id records, Const-D2P at epsilon 8 with the seeded entropy: the run
    finishes, the model it trained has clipped sums equal to the brute-force reference, and
    its accuracy beats chance (1/2) by far.

    Why 0.8 is a sound threshold: the 400 evaluation records are balanced, so a model that
    ignores its input scores 0.5 +- 0.025 (one standard deviation), and 0.8 is 12 of them
    above; the task is nearly separable by a bag of embeddings (9 in 10 tokens come from the
    class's half of the vocabulary, so the majority half of 8 tokens names the class in
    ~99.9 % of the records), and the run reaches ~0.95-1.0 (its seed fixes the number)."""
    rng = np.random.default_rng(0)
    nodes = [_topic_records(100, rng) for _ in range(4)]
    eval_data = _topic_records(400, rng)
    torch.manual_seed(0)
    model = BagOfEmbeddings(classes=2)
    read = []  # the private steps read the embedding with its handler (book-keeping)
    terms = EmbeddingTerms.terms
    monkeypatch.setattr(EmbeddingTerms, "terms", lambda self, a, g: read.append(a.dtype)
                        or terms(self, a, g))  # fmt: skip
    result = dpdl.train(model, nodes, algorithm="const-d2p", epsilon=8.0, delta=1e-5,
                        batch_size=8, lr=0.5, steps=40, eval_every=40, eval_data=eval_data,
                        topology="ring", entropy="seed", seed=0)  # fmt: skip
    assert result.status == "ok" and read and set(read) == {torch.int64}
    accuracy = result.history[-1]["test_accuracy"]
    assert accuracy >= 0.8, accuracy
    # the clipped sums of the trained node models, on records of the nodes, are the reference
    trained = [dict(m.named_parameters()) for m in result.node_models]
    params = {name: torch.stack([p[name].detach() for p in trained]) for name in trained[0]}
    batch = NodeBatch(torch.as_tensor(np.concatenate([x[:3] for x, _ in nodes])),
                      torch.as_tensor(np.concatenate([y[:3] for _, y in nodes])),
                      torch.arange(4).repeat_interleave(3), 4)  # fmt: skip
    assert per_sample.book_keeping_plan(model, (8,), params, torch.int64).problems == []
    _, norms = reference_clipped_sums(model, params, batch, 1.0)
    clip = float(norms.median())
    want, _ = reference_clipped_sums(model, params, batch, clip)
    got = clipped_record_sums(model, params, batch, clip)
    for name in want:
        torch.testing.assert_close(got[name].double(), want[name], atol=1e-6, rtol=1e-5)
    assert [type(layer) for layer in per_sample.book_keeping_plan(
        model, (8,), params, torch.int64).layers] == [EmbeddingTerms, LinearTerms]  # fmt: skip
