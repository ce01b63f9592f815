"""Test configuration: the ``cuda`` marker, skipped without a GPU."""
import pytest
import torch


def pytest_configure(config):
    config.addinivalue_line('markers',
                            'cuda: needs a CUDA GPU (skipped without one)')


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason='needs a CUDA GPU')
    for item in items:
        if 'cuda' in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def fresh_layer_compile(monkeypatch):
    """A fresh compiled-layer function (``train.compile_layers``) and dynamo
    state; yields dynamo's counters (``unique_graphs``: compilations
    since)."""
    import pyg_dfgnn.train.model as gps_model
    from torch._dynamo.utils import counters
    monkeypatch.setattr(gps_model, '_compiled_layer_forward', None)
    torch.compiler.reset()
    counters.clear()
    yield counters['stats']
    torch.compiler.reset()
