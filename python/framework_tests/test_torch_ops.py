"""``torch.ops.strata.lookup``, ``lookup_pooled`` and ``lookup_batch`` (strata.torch): results
against ``torch.index_select`` / ``embedding_bag`` / NumPy on random tables, ``opcheck``,
``torch.compile(fullgraph=True)`` with no graph break, errors, and a freed table used from a
compiled graph. Every output is allocated right after a NaN tensor of its size was freed, so an
element strata did not write would show (the allocator hands the same block back)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install 'strata[torch]')")
import torch._dynamo  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.library import opcheck  # noqa: E402

import strata  # noqa: E402
import strata.torch as st  # noqa: E402


def poison(*shape: int) -> None:
    """Frees a NaN tensor of ``shape``: the next float32 allocation of that size reuses its block."""
    del_me = torch.full(shape, float("nan"))
    del del_me


def dense(rng, rows=200, dim=16):
    vec = torch.from_numpy(rng.standard_normal((rows, dim)).astype(np.float32))
    return vec, strata.Table.from_array(vec)


def ragged(rng, bags, max_len):
    lens = rng.integers(0, max_len + 1, size=bags)
    return torch.from_numpy(np.concatenate([[0], np.cumsum(lens)]).astype(np.int64))


def test_lookup_matches_index_select(rng):
    vec, t = dense(rng)
    h = st.handle(t)
    assert st.handle(t) == h and st.handle(h) == h and st.table_of(h) is t
    for kdt in (torch.int32, torch.int64):
        keys = torch.from_numpy(rng.integers(0, 200, size=(7, 9))).to(kdt)
        poison(7, 9, 16)
        got = torch.ops.strata.lookup(h, keys)
        assert got.shape == (7, 9, 16) and got.dtype == torch.float32
        assert torch.equal(got, vec.index_select(0, keys.reshape(-1).long()).reshape(7, 9, 16))
    # strided keys, reduced output dtypes
    keys = torch.from_numpy(rng.integers(0, 200, size=(50, 2)))[:, 1]
    for dt in (torch.float16, torch.bfloat16):
        got = st.lookup(t, keys, dtype=dt)
        assert got.dtype == dt and torch.equal(got, vec[keys].to(dt))
    assert torch.ops.strata.lookup(h, torch.empty(0, dtype=torch.int64)).shape == (0, 16)


def test_keyed_table_with_misses(rng):
    keys = rng.choice(10**9, size=300, replace=False).astype(np.int64)
    vec = rng.standard_normal((300, 8)).astype(np.float32)
    t = strata.Table.from_array(vec, keys, default_value=-2.5)
    q = np.concatenate([rng.choice(keys, 40), [10**9 + 7, -1]])
    got = st.lookup(t, torch.from_numpy(q)).numpy()
    index = {int(k): i for i, k in enumerate(keys)}
    want = np.stack([vec[index[int(k)]] if int(k) in index else np.full(8, -2.5, np.float32) for k in q])
    np.testing.assert_array_equal(got, want)


def test_lookup_pooled_matches_embedding_bag(rng):
    vec, t = dense(rng, 120, 12)
    h = st.handle(t)
    offsets = ragged(rng, 30, 6)
    keys = torch.from_numpy(rng.integers(0, 120, size=int(offsets[-1])))
    w = torch.from_numpy(rng.uniform(0.1, 2.0, size=keys.shape).astype(np.float32))
    for mode, weights in (("sum", None), ("mean", None), ("sum", w)):
        poison(30, 12)
        got = torch.ops.strata.lookup_pooled(h, keys, offsets, weights, mode)
        want = F.embedding_bag(keys, vec, offsets, mode=mode, include_last_offset=True, per_sample_weights=weights)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # sqrtn: the weighted sum with w / sqrt(sum w^2) per bag
    scale = torch.zeros_like(w)
    for b in range(30):
        seg = slice(int(offsets[b]), int(offsets[b + 1]))
        n = (w[seg] ** 2).sum().sqrt()
        if n > 0:
            scale[seg] = w[seg] / n
    want = F.embedding_bag(keys, vec, offsets, mode="sum", include_last_offset=True, per_sample_weights=scale)
    torch.testing.assert_close(st.lookup_pooled(t, keys, offsets, w, "sqrtn"), want, rtol=1e-5, atol=1e-5)
    k2 = torch.from_numpy(rng.integers(0, 120, size=(9, 4)))
    torch.testing.assert_close(st.lookup_pooled(t, k2, pooling="mean"), F.embedding_bag(k2, vec, mode="mean"))


def test_lookup_batch_equals_single_ops(rng):
    vec_a, a = dense(rng, 100, 8)
    vec_b, b = dense(rng, 50, 4)
    ka = torch.from_numpy(rng.integers(0, 100, size=(5, 3)))
    offsets = ragged(rng, 6, 4)
    kb = torch.from_numpy(rng.integers(0, 50, size=int(offsets[-1])))
    wb = torch.rand(kb.shape)
    poison(5, 3, 8)
    got = torch.ops.strata.lookup_batch([st.handle(a), st.handle(b), st.handle(a)], [ka, kb, ka.reshape(-1)],
                                        [None, offsets, None], [None, wb, None], ["none", "mean", "none"])
    assert len(got) == 3
    assert torch.equal(got[0], vec_a[ka])
    assert torch.equal(got[1], st.lookup_pooled(b, kb, offsets, wb, "mean"))
    want = torch.zeros(6, 4)
    for i in range(6):  # weighted mean: sum(w * row) / sum(w), zeros for an empty bag
        seg = slice(int(offsets[i]), int(offsets[i + 1]))
        if seg.stop > seg.start:
            want[i] = (wb[seg, None] * vec_b[kb[seg]]).sum(0) / wb[seg].sum()
    torch.testing.assert_close(got[1], want, rtol=1e-5, atol=1e-5)
    assert torch.equal(got[2], vec_a[ka.reshape(-1)])
    assert st.lookup_batch([], []) == []


def test_opcheck(rng):
    _, t = dense(rng, 64, 8)
    h = st.handle(t)
    keys = torch.from_numpy(rng.integers(0, 64, size=(4, 5)))
    offsets = torch.tensor([0, 3, 3, 9, 20])
    w = torch.rand(20)
    samples = [
        (torch.ops.strata.lookup.default, (h, keys, None)),
        (torch.ops.strata.lookup.default, (h, keys.int(), torch.float16)),
        (torch.ops.strata.lookup_pooled.default, (h, keys.reshape(-1), offsets, w, "sqrtn", None)),
        (torch.ops.strata.lookup_pooled.default, (h, keys, None, None, "mean", torch.bfloat16)),
        (torch.ops.strata.lookup_batch.default,
         ([h, h], [keys, keys.reshape(-1)], [None, offsets], [None, None], ["none", "sum"], None)),
    ]
    for op, args in samples:
        result = opcheck(op, args)
        assert set(result.values()) == {"SUCCESS"}, (op, result)


def test_compile_fullgraph_no_graph_break(rng):
    vec_a, a = dense(rng, 100, 8)
    vec_b, b = dense(rng, 40, 8)

    def model(ka, kb, offsets):
        plain = st.lookup(a, ka)
        pooled = st.lookup_pooled(b, kb, offsets, None, "sum")
        both = st.lookup_batch([a, b], [ka, kb], [None, offsets], None, ["none", "mean"])
        return plain.sum(1) + pooled + both[0].mean(1) + both[1]

    def reference(ka, kb, offsets):
        pooled = F.embedding_bag(kb, vec_b, offsets, mode="sum", include_last_offset=True)
        mean = F.embedding_bag(kb, vec_b, offsets, mode="mean", include_last_offset=True)
        return vec_a[ka].sum(1) + pooled + vec_a[ka].mean(1) + mean

    ka = torch.from_numpy(rng.integers(0, 100, size=(6, 3)))
    offsets = ragged(rng, 6, 5)
    kb = torch.from_numpy(rng.integers(0, 40, size=int(offsets[-1])))
    explain = torch._dynamo.explain(model)(ka, kb, offsets)
    assert explain.graph_count == 1 and explain.graph_break_count == 0, explain.break_reasons
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    for bags in (6, 11, 3):  # new shapes run the same graph (dynamic shapes)
        ka = torch.from_numpy(rng.integers(0, 100, size=(bags, 3)))
        offsets = ragged(rng, bags, 5)
        kb = torch.from_numpy(rng.integers(0, 40, size=int(offsets[-1])))
        torch.testing.assert_close(compiled(ka, kb, offsets), reference(ka, kb, offsets), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(compiled(ka, kb, offsets), model(ka, kb, offsets), rtol=1e-5, atol=1e-5)


def test_errors_carry_strata_message(rng):
    _, t = dense(rng, 10, 4)
    h = st.handle(t)
    with pytest.raises(TypeError, match="keys: dtype float32"):
        torch.ops.strata.lookup(h, torch.ones(3))
    with pytest.raises(TypeError, match="dtype"):
        torch.ops.strata.lookup(h, torch.tensor([1]), torch.int32)
    with pytest.raises(ValueError, match="offsets"):
        torch.ops.strata.lookup_pooled(h, torch.tensor([1, 2]), torch.tensor([1, 2]), None, "sum")
    with pytest.raises(ValueError, match="pooling"):
        torch.ops.strata.lookup_pooled(h, torch.tensor([[1, 2]]), None, None, "max")
    with pytest.raises(ValueError, match="weights|poolings"):
        st.lookup_batch([h], [torch.tensor([1])], weights=[])
    strict = strata.Table.from_array(np.ones((3, 2), np.float32), np.array([5, 6, 7]), missing="error")
    with pytest.raises(LookupError, match="8"):
        st.lookup(strict, torch.tensor([5, 8]))
    with pytest.raises(ValueError, match="handle 999999"):
        torch.ops.strata.lookup(999999, torch.tensor([1]))


def test_freed_table_raises_from_compiled_graph(rng):
    vec, t = dense(rng, 30, 4)
    h = st.handle(t)
    compiled = torch.compile(lambda k: torch.ops.strata.lookup(h, k) * 2, fullgraph=True)
    keys = torch.tensor([3, 1, 4])
    assert torch.equal(compiled(keys), vec[keys] * 2)
    t.close()
    with pytest.raises(ValueError, match=f"handle {h}: the table is closed"):
        compiled(keys)  # the same graph (no retrace): the op finds the table closed
    del t
    import gc

    gc.collect()
    with pytest.raises(ValueError, match=f"handle {h} names no table"):
        compiled(keys)
    with pytest.raises(Exception, match="names no table"):  # a new shape: traced again, the fake impl raises
        compiled(torch.tensor([1, 2, 3, 4, 5]))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_current_stream(rng):
    vec, t = dense(rng, 100, 8)
    keys = torch.from_numpy(rng.integers(0, 100, size=64)).cuda()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        got = torch.compile(lambda k: st.lookup(t, k), fullgraph=True)(keys)
    s.synchronize()
    assert got.is_cuda and torch.equal(got.cpu(), vec[keys.cpu()])


def test_import_error_names_the_extra():
    code = "import sys; sys.modules['torch'] = None\ntry:\n import strata.torch\nexcept ImportError as e: print(e)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "pip install 'strata[torch]'" in out


def test_no_gradients_into_tables(rng):
    vec, t = dense(rng, 20, 4)
    keys, offsets = torch.tensor([1, 2, 3]), torch.tensor([0, 1, 3])
    assert not st.lookup(t, keys).requires_grad
    w = torch.rand(3, requires_grad=True)
    pooled = st.lookup_pooled(t, keys, offsets, w, "sum")
    torch.testing.assert_close(pooled.detach(), F.embedding_bag(keys, vec, offsets, mode="sum", include_last_offset=True,
                                                                per_sample_weights=w.detach()))
    with pytest.raises(RuntimeError, match="no autograd formula"):
        pooled.sum().backward()
