"""GraphGPS-style training: configs, the GPS model, the runner."""
from pyg_dfgnn.train.config import (Config, ConfigError, default_config,
                                    load_config)

__all__ = ['Config', 'ConfigError', 'default_config', 'load_config', 'train',
           'bench_e2e', 'build_model']


def __getattr__(name):  # heavy modules load on first use
    if name == 'train':
        from pyg_dfgnn.train.runner import train
        return train
    if name == 'build_model':
        from pyg_dfgnn.train.model import build_model
        return build_model
    if name == 'bench_e2e':
        from pyg_dfgnn.train.bench import bench_e2e
        return bench_e2e
    raise AttributeError(name)
