"""strata.pyg.FeatureStore: PyG's CRUD contract against a plain tensor, and NeighborLoader over a
FakeDataset graph through the strata store (static tables, then an HPS server table as backing)
and PyG's graph store, batch for batch equal to the in-memory loader, bit for bit.

PyPI has no pyg-lib or torch-sparse wheels for this torch, so both loaders get the same small
random neighbour sampler written here (``neighbor_sampler=``), seeded alike."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install 'strata[pyg]')")
pyg = pytest.importorskip("torch_geometric", reason="PyTorch Geometric is not installed (pip install 'strata[pyg]')")
from torch_geometric.datasets import FakeDataset  # noqa: E402
from torch_geometric.loader import NeighborLoader  # noqa: E402
from torch_geometric.sampler import BaseSampler, NodeSamplerInput, SamplerOutput  # noqa: E402
from torch_geometric.testing.graph_store import MyGraphStore  # noqa: E402

import strata  # noqa: E402
import strata.pyg  # noqa: E402


class RandomNeighbors(BaseSampler):
    """Up to ``k`` random in-neighbours per node and hop (NeighborLoader's meaning), from the
    graph's CSC, with its own generator: two samplers with one seed sample alike."""

    def __init__(self, edge_index, num_nodes, num_neighbors, seed):
        col = edge_index[1]
        self.perm = torch.argsort(col, stable=True)
        self.src = edge_index[0][self.perm]
        self.ptr = torch.zeros(num_nodes + 1, dtype=torch.int64)
        self.ptr[1:] = torch.cumsum(torch.bincount(col, minlength=num_nodes), 0)
        self.num_neighbors = num_neighbors
        self.gen = torch.Generator().manual_seed(seed)

    def sample_from_nodes(self, inputs: NodeSamplerInput, **kwargs) -> SamplerOutput:
        nodes = inputs.node.tolist()
        local = {v: i for i, v in enumerate(nodes)}
        rows, cols, edges = [], [], []
        frontier, counts_n, counts_e = list(nodes), [len(nodes)], []
        for k in self.num_neighbors:
            nxt, before = [], len(edges)
            for v in frontier:
                lo, hi = int(self.ptr[v]), int(self.ptr[v + 1])
                for j in torch.randperm(hi - lo, generator=self.gen)[:k].tolist():
                    u = int(self.src[lo + j])
                    if u not in local:
                        local[u] = len(nodes)
                        nodes.append(u)
                        nxt.append(u)
                    rows.append(local[u])
                    cols.append(local[v])
                    edges.append(int(self.perm[lo + j]))
            counts_n.append(len(nxt))
            counts_e.append(len(edges) - before)
            frontier = nxt
        t = lambda x: torch.tensor(x, dtype=torch.int64)  # noqa: E731
        return SamplerOutput(node=t(nodes), row=t(rows), col=t(cols), edge=t(edges), batch=None,
                             num_sampled_nodes=counts_n, num_sampled_edges=counts_e,
                             metadata=(inputs.input_id, inputs.time))

    def sample_from_edges(self, index, neg_sampling=None):
        raise NotImplementedError("node sampling only")


@pytest.fixture
def graph():
    torch.manual_seed(7)
    data = FakeDataset(num_graphs=1, avg_num_nodes=400, avg_degree=6, num_channels=24, num_classes=5)[0]
    assert data.x.dtype == torch.float32 and data.y.dtype == torch.int64
    return data


def loaders(data, store, seed=11, batch_size=32):
    gs = MyGraphStore()
    gs.put_edge_index(data.edge_index, edge_type=None, layout="coo", size=(data.num_nodes, data.num_nodes))
    seeds = torch.randperm(data.num_nodes, generator=torch.Generator().manual_seed(3))[:150]
    kw = dict(num_neighbors=[5, 3], input_nodes=seeds, batch_size=batch_size)
    memory = NeighborLoader(data, neighbor_sampler=RandomNeighbors(data.edge_index, data.num_nodes, [5, 3], seed), **kw)
    remote = NeighborLoader((store, gs), neighbor_sampler=RandomNeighbors(data.edge_index, data.num_nodes, [5, 3], seed),
                            **kw)
    return memory, remote


def assert_same_batches(memory, remote, count_calls):
    batches = 0
    for a, b in zip(memory, remote, strict=True):
        assert torch.equal(a.n_id, b.n_id) and torch.equal(a.edge_index, b.edge_index)
        assert a.x.dtype == b.x.dtype and torch.equal(a.x.view(torch.int32), b.x.view(torch.int32)), "bit for bit"
        assert torch.equal(a.y, b.y)
        batches += 1
    assert batches == 5
    assert count_calls() == batches, "one lookup_batch per batch"


@pytest.fixture
def counted(monkeypatch):
    calls = []
    real = strata._core.lookup_batch

    def spy(requests, *a, **k):
        calls.append(len(requests))
        return real(requests, *a, **k)

    monkeypatch.setattr(strata._core, "lookup_batch", spy)
    return calls


def test_neighbor_loader_static_tables(graph, counted):
    store = strata.pyg.FeatureStore()
    store.put_tensor(graph.x, group_name=None, attr_name="x", index=None)
    store.put_tensor(graph.y, group_name=None, attr_name="y", index=None)
    assert store.get_tensor_size(group_name=None, attr_name="x") == tuple(graph.x.shape)
    memory, remote = loaders(graph, store)
    counted.clear()
    assert_same_batches(memory, remote, lambda: len(counted))


def write_sparse(folder, keys, vectors):
    folder.mkdir()
    np.asarray(keys, np.int64).tofile(folder / "key")
    np.ascontiguousarray(vectors, np.float32).tofile(folder / "emb_vector")


def test_neighbor_loader_server_table(graph, counted, tmp_path):
    """x from an HPS server (volatile hash map over an LMDB store), the first half loaded from
    the sparse files, the second half put through the store (upserts into the server)."""
    n, dim = graph.x.shape
    half = n // 2
    write_sparse(tmp_path / "x", np.arange(half), graph.x[:half].numpy())
    ps = {"supportlonglong": True,
          "volatile_db": {"type": "hash_map", "num_partitions": 2, "initial_cache_rate": 1.0},
          "persistent_db": {"type": "rocks_db", "path": str(tmp_path / "store")},
          "models": [{"model": "gnn", "sparse_files": ["x"], "embedding_vecsize_per_table": [dim],
                      "default_value_for_each_table": [0.0], "maxnum_catfeature_query_per_table_per_sample": [1],
                      "deployed_device_list": [0], "max_batch_size": 4096}]}
    (tmp_path / "ps.json").write_text(json.dumps(ps))
    with strata.Server.open(tmp_path / "ps.json") as server:
        table = server.table("gnn", 0)
        store = strata.pyg.FeatureStore(tables={(None, "x"): table})
        assert store.get_tensor_size(group_name=None, attr_name="x") == (half, dim)
        store.put_tensor(graph.x[half:], group_name=None, attr_name="x", index=torch.arange(half, n))
        store.put_tensor(graph.y, group_name=None, attr_name="y", index=None)
        assert store.get_tensor_size(group_name=None, attr_name="x") == (n, dim)
        assert table.stats()["upserts"] > 0
        memory, remote = loaders(graph, store)
        counted.clear()
        assert_same_batches(memory, remote, lambda: len(counted))
        # an update through the store is what the next batch reads
        new = torch.from_numpy(np.random.default_rng(5).standard_normal((10, dim)).astype(np.float32))
        store.update_tensor(new, group_name=None, attr_name="x", index=torch.arange(100, 110))
        assert torch.equal(strata.lookup(table, torch.arange(100, 110)), new)
        # remove erases the rows put (or updated) through the store; the server's other rows stay
        assert store.remove_tensor(group_name=None, attr_name="x", index=None)
        assert len(table) == half - 10 and not table.closed
        assert torch.equal(strata.lookup(table, torch.tensor([half, n - 1, 105])), torch.zeros(3, dim))
        assert torch.equal(strata.lookup(table, torch.arange(99)), graph.x[:99])


def test_crud_against_a_tensor(rng):
    store = strata.pyg.FeatureStore()
    x = torch.from_numpy(rng.standard_normal((50, 6)).astype(np.float32))
    idx = torch.from_numpy(rng.permutation(200)[:50])
    store.put_tensor(x, group_name="paper", attr_name="x", index=idx)
    ref = torch.full((200, 6), float("nan"))
    ref[idx] = x
    q = idx[torch.from_numpy(rng.integers(0, 50, size=30))]
    assert torch.equal(store.get_tensor(group_name="paper", attr_name="x", index=q), ref[q])
    order = torch.sort(idx).values
    assert torch.equal(store.get_tensor(group_name="paper", attr_name="x", index=None), ref[order])
    # upsert: half of the rows replaced, new indices added
    y = torch.from_numpy(rng.standard_normal((30, 6)).astype(np.float32))
    idx2 = torch.cat([idx[:15], torch.arange(200, 215)])
    store.put_tensor(y, group_name="paper", attr_name="x", index=idx2)
    ref = torch.cat([ref, torch.full((15, 6), float("nan"))])
    ref[idx2] = y
    assert store.get_tensor_size(group_name="paper", attr_name="x") == (65, 6)
    everything = torch.sort(torch.unique(torch.cat([idx, idx2]))).values
    assert torch.equal(store.get_tensor(group_name="paper", attr_name="x", index=None), ref[everything])
    # slices are ranges of node indices
    dense = strata.pyg.FeatureStore()
    dense.put_tensor(x, group_name=None, attr_name="x", index=None)
    assert torch.equal(dense.get_tensor(group_name=None, attr_name="x", index=slice(3, 40, 4)), x[3:40:4])
    assert torch.equal(dense.get_tensor(group_name=None, attr_name="x", index=slice(None)), x)
    # non-float attributes stay tensors, with upserts too
    labels = torch.from_numpy(rng.integers(0, 9, size=50))
    dense.put_tensor(labels, group_name=None, attr_name="y", index=None)
    dense.put_tensor(torch.tensor([100, 101]), group_name=None, attr_name="y", index=torch.tensor([3, 60]))
    got = dense.get_tensor(group_name=None, attr_name="y", index=torch.tensor([3, 4, 60]))
    assert got.tolist() == [100, int(labels[4]), 101]
    # multi_get_tensor: one lookup_batch for every float attribute
    multi = dense.multi_get_tensor([(None, "x", torch.tensor([1, 2])), (None, "y", torch.tensor([0]))])
    assert torch.equal(multi[0], x[[1, 2]]) and multi[1].tolist() == [int(labels[0])]
    assert {(a.group_name, a.attr_name) for a in dense.get_all_tensor_attrs()} == {(None, "x"), (None, "y")}
    # errors: missing attributes and indices, bad puts
    with pytest.raises(KeyError, match="999"):
        dense.get_tensor(group_name=None, attr_name="x", index=torch.tensor([1, 999]))
    with pytest.raises(KeyError):
        dense.get_tensor(group_name=None, attr_name="nope", index=None)
    with pytest.raises(KeyError, match="77"):
        dense.get_tensor(group_name=None, attr_name="y", index=torch.tensor([77]))
    with pytest.raises(ValueError, match="one per row"):
        dense.put_tensor(x, group_name=None, attr_name="z", index=torch.arange(3))
    with pytest.raises(ValueError, match="features"):
        dense.put_tensor(torch.ones(2, 7), group_name=None, attr_name="x", index=torch.tensor([0, 1]))
    with pytest.raises(TypeError, match="keys: dtype float32"):
        dense.get_tensor(group_name=None, attr_name="x", index=torch.ones(2))
    assert dense.remove_tensor(group_name=None, attr_name="x", index=None)
    assert not dense.remove_tensor(group_name=None, attr_name="x", index=None)
    assert dense.get_tensor_size(group_name=None, attr_name="x") is None
    store.close()
    dense.close()


def test_import_error_names_the_extra():
    code = ("import sys; sys.modules['torch_geometric'] = None\n"
            "try:\n import strata.pyg\nexcept ImportError as e: print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "pip install 'strata[pyg]'" in out
