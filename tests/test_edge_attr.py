"""Raw edge attributes read through an EdgeAttrMap (pyg_dfgnn.ops.edge_attr):
on the CPU, the rows the map describes -- self-loops filled in place -- equal
the rows the convs formed before (PyG's add_self_loops semantics), and the
two products equal their definitions."""
import dataclasses

import pytest
import torch

from pyg_dfgnn.nn.conv.utils import resolve_graph
from pyg_dfgnn.ops.edge_attr import (
    EdgeAttrMap,
    csr_edge_attr,
    edge_attr_dots,
    edge_attr_sums,
)


def graph_with_loops(n=12, e=60, seed=0, input_loops=True):
    gen = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, e), generator=gen)
    ei[1, ei[1] == 3] = 4  # node 3: no incoming edge (empty fill)
    if input_loops:  # removed by the conv: their rows are read by no edge
        ei[:, :3] = torch.tensor([[0, 1, 2], [0, 1, 2]])
    else:
        ei = ei[:, ei[0] != ei[1]]
    return ei


FILLS = ['mean', 'add', 'sum', None, 2.5, 'tensor']


@pytest.mark.parametrize('fill', FILLS)
@pytest.mark.parametrize('input_loops', [False, True])
def test_map_rows_equal_pyg_filled_rows(fill, input_loops):
    n, dim = 12, 5
    ei = graph_with_loops(n, input_loops=input_loops)
    edge_attr = torch.randn(ei.size(1), dim, dtype=torch.float64)
    if fill == 'tensor':
        fill = torch.arange(dim, dtype=torch.float64)
    structure = resolve_graph(ei, n, n, ei.device, loops=n)
    emap = structure.edge_attr_map(ei, edge_attr, fill)
    assert emap is not None and emap.unused_rows == input_loops
    if input_loops:  # exactly the rows no CSR edge reads
        read = torch.zeros(ei.size(1), dtype=torch.bool)
        read[emap.index[emap.index < emap.num_input]] = True
        assert emap.unused_index.tolist() == (~read).nonzero().view(-1).tolist()
    else:
        assert emap.unused_index is None
    want = structure.edge_attr(ei, edge_attr, fill)  # PyG's rows, CSR order
    torch.testing.assert_close(csr_edge_attr(emap, edge_attr), want)
    # each row's loop entry and each edge's row, as the kernels read them
    rowptr = emap.rowptr.tolist()
    for i in range(n):
        lo, hi = rowptr[i], rowptr[i + 1]
        assert emap.edge_row[lo:hi].tolist() == [i] * (hi - lo)
        loops = [p for p in range(lo, hi) if emap.index[p] >= emap.num_input]
        assert emap.loop_pos[i].item() == (loops[0] if loops else -1)
        assert len(loops) == 1  # every row of this graph gets one loop
    assert emap.edge_row.dtype == torch.int32


def test_map_without_loops_is_the_permutation():
    ei = graph_with_loops(input_loops=False)
    edge_attr = torch.randn(ei.size(1), 3)
    structure = resolve_graph(ei, 12, 12, ei.device)
    emap = structure.edge_attr_map(ei, edge_attr)
    assert emap.fill == 'none'
    torch.testing.assert_close(csr_edge_attr(emap, edge_attr),
                               structure.edge_attr(ei, edge_attr))


@pytest.mark.parametrize('fill', ['min', 'max', 'mul'])
def test_other_fills_have_no_map(fill):
    ei = graph_with_loops()
    edge_attr = torch.randn(ei.size(1), 3)
    structure = resolve_graph(ei, 12, 12, ei.device, loops=12)
    assert structure.edge_attr_map(ei, edge_attr, fill) is None
    grad_fill = torch.ones(3, requires_grad=True)
    assert structure.edge_attr_map(ei, edge_attr, grad_fill) is None


def test_map_rejects_a_bipartite_aggregating_fill():
    ei = torch.tensor([[0, 1, 2], [5, 1, 0]])  # an edge into node 5 >= loops
    structure = resolve_graph(ei, 3, 6, ei.device, loops=3)
    with pytest.raises(ValueError, match='bipartite'):
        structure.edge_attr_map(ei, torch.randn(3, 2), 'mean')


def test_products_equal_their_definitions():
    n, dim, heads = 12, 4, 3
    ei = graph_with_loops()
    edge_attr = torch.randn(ei.size(1), dim, dtype=torch.float64)
    structure = resolve_graph(ei, n, n, ei.device, loops=n)
    emap = structure.edge_attr_map(ei, edge_attr, 'mean')
    x = structure.edge_attr(ei, edge_attr, 'mean')
    row = structure.graph.row
    node_mat = torch.randn(n, heads, dim, dtype=torch.float64)
    dots = edge_attr_dots(emap, edge_attr, node_mat)
    torch.testing.assert_close(
        dots, torch.einsum('ehd,ed->eh', node_mat[row], x))
    shared = node_mat[:1]
    torch.testing.assert_close(edge_attr_dots(emap, edge_attr, shared),
                               torch.einsum('hd,ed->eh', shared[0], x))
    weight = torch.randn(emap.num_edges, heads, dtype=torch.float64)
    want = torch.zeros(n, heads, dim, dtype=torch.float64).index_add(
        0, row, weight.unsqueeze(-1) * x.unsqueeze(1))
    torch.testing.assert_close(edge_attr_sums(emap, edge_attr, weight), want)


def test_shape_errors():
    ei = graph_with_loops(input_loops=False)
    structure = resolve_graph(ei, 12, 12, ei.device)
    edge_attr = torch.randn(ei.size(1), 3)
    emap = structure.edge_attr_map(ei, edge_attr)
    with pytest.raises(ValueError, match='node_mat'):
        edge_attr_dots(emap, edge_attr, torch.randn(5, 2, 3))
    with pytest.raises(ValueError, match='edge_weight'):
        edge_attr_sums(emap, edge_attr, torch.randn(3, 2))
    with pytest.raises(ValueError, match='edge_attr'):
        edge_attr_sums(emap, edge_attr[1:], torch.randn(emap.num_edges, 2))
    with pytest.raises(ValueError, match="'edge_attr' must have shape"):
        structure.edge_attr_map(ei, edge_attr[1:])
    assert isinstance(emap, EdgeAttrMap)
    # a map built by hand: a fill the kernels do not know, a constant
    # fill without its row
    with pytest.raises(ValueError, match="'fill' must be"):
        dataclasses.replace(emap, fill='max')
    looped = resolve_graph(ei, 12, 12, ei.device, loops=12)
    const = looped.edge_attr_map(ei, edge_attr, 0.5)
    assert const.fill == 'const'
    const = dataclasses.replace(const, fill_row=None)
    with pytest.raises(ValueError, match="needs its 'fill_row'"):
        edge_attr_dots(const, edge_attr, torch.randn(12, 2, 3))


@pytest.mark.parametrize('fill_value', [None, 'mean', 'add', 0.5])
def test_projection_reference_is_lin_of_the_filled_rows(fill_value):
    """edge_attr_project's CPU path: W x_p of the CSR rows PyG forms (the
    rows reordered, loops filled), with the gradients of that product."""
    from pyg_dfgnn.nn.conv.utils import clear_graph_cache, resolve_graph
    from pyg_dfgnn.ops.edge_attr import edge_attr_project
    clear_graph_cache()
    g = torch.Generator().manual_seed(0)
    ei = torch.randint(0, 40, (2, 300), generator=g)
    ei[:, 0] = 5  # an input self-loop (replaced by the fill)
    loops = None if fill_value is None else 40
    structure = resolve_graph(ei, 40, 40, ei.device, loops=loops)
    x = torch.randn(300, 6, generator=g, requires_grad=True)
    w = torch.randn(12, 6, generator=g, requires_grad=True)
    emap = structure.edge_attr_map(ei, x, fill_value)
    got = edge_attr_project(emap, x, w)
    want = structure.edge_attr(ei, x, fill_value) @ w.t()
    torch.testing.assert_close(got, want)
    gy = torch.randn(got.shape, generator=g)
    for a, b in zip(torch.autograd.grad(got, (x, w), gy),
                    torch.autograd.grad(want, (x, w), gy)):
        torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match='weight'):
        edge_attr_project(emap, x, w[:, :5])


def test_edge_terms_link_drops_a_hand_over_at_the_end_of_the_pass():
    # What a linked sums' backward hands over lives for one backward pass:
    # taken by the dots' backward in it, or dropped when it ends.
    from pyg_dfgnn.ops.edge_attr import EdgeTermsLink

    link = EdgeTermsLink()
    seen = []

    class Hands(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t * 2

        @staticmethod
        def backward(ctx, g):
            link.hand(g, g)
            seen.append(link.handed is not None)
            return g * 2

    class Takes(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t + 1

        @staticmethod
        def backward(ctx, g):
            seen.append(link.take() is not None)
            return g

    a = torch.ones(3, requires_grad=True)
    Hands.apply(a).sum().backward()  # nothing takes it
    assert seen == [True] and link.handed is None
    Takes.apply(Hands.apply(a)).sum().backward()  # Takes runs first
    assert seen == [True, False, True] and link.handed is None
    seen.clear()
    Hands.apply(Takes.apply(a)).sum().backward()  # Takes runs after Hands
    assert seen == [True, True] and link.handed is None
