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
