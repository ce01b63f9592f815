"""Experiment configs in GraphGPS's YAML layout, loaded with PyYAML and
checked against a strict schema.

A config is a nested mapping (``dataset``, ``gt``, ``gnn``, ``optim``,
``train``, ``model``, ...). Every key a file or an override names must exist in
:data:`SCHEMA`; every value must have the declared type and, where the schema
lists them, one of the allowed choices. Anything else raises
:class:`ConfigError` naming the dotted key, e.g.
``ConfigError: unknown key 'gt.n_head' (did you mean 'gt.n_heads'?)``.
Keys a file leaves out take the schema's defaults.

GraphGPS keys that only make sense for features we do not have (``wandb``,
``model.edge_decoding``, ``gnn.agg``...) are accepted so GraphGPS configs load,
and have no effect.
"""
from __future__ import annotations

import copy
import difflib
import math
import os
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Tuple

import yaml


class ConfigError(ValueError):
    """A config file or override names an unknown key or holds a bad value."""


@dataclass(frozen=True)
class Field:
    """One leaf of the schema: a default, the accepted types, the choices."""
    default: Any
    types: Tuple[type, ...]
    choices: Optional[Tuple[Any, ...]] = None
    nullable: bool = False
    min: Optional[float] = None
    max: Optional[float] = None
    max_inclusive: bool = True
    help: str = ''
    #: ``(old, new)`` pairs: older spellings of a value, mapped on load
    #: (``train.capture: true`` -> ``'graphs'``). Matched by type and value,
    #: so that ``True`` does not catch ``1``.
    aliases: Tuple[Tuple[Any, Any], ...] = ()


def _f(default, types=None, choices=None, nullable=False, min=None, max=None,
       max_inclusive=True, help='', aliases=()):
    if types is None:
        types = (type(default), )
    elif not isinstance(types, tuple):
        types = (types, )
    return Field(default, types, None if choices is None else tuple(choices),
                 nullable, min, max, max_inclusive, help, tuple(aliases))


def _dropout(default=0.0, help=''):
    return _f(default, float, min=0.0, max=1.0, help=help)


#: Why ``gt.attn_impl: varlen`` is refused with attention dropout.
VARLEN_DROPOUT_ERROR = (
    "'gt.attn_impl' varlen with 'gt.attn_dropout' > 0 is refused: PyTorch's "
    "memory-efficient kernel with cu_seqlens drops other scores in its "
    "backward than in its forward, so the gradient is wrong "
    "(scripts/varlen_dropout_check.py); use 'auto' (varlen without dropout, "
    "padded with it) or 'padded'")
#: Why ``gt.attn_impl: varlen`` is refused under torch.compile.
VARLEN_COMPILE_ERROR = (
    "'gt.attn_impl' varlen does not compile (torch.compile fails in "
    "PyTorch's fake function of its backward): use 'auto' or 'padded' with "
    "train.capture=compile or train.compile_layers, or train.capture=graphs "
    "alone")
#: ``gt.attn_impl``: how the global attention runs (backend dfgnn).
GLOBAL_ATTN_IMPLS = ('auto', 'varlen', 'fused', 'padded')
LOCAL_LAYERS = ('DFGAT', 'DFGATv2', 'DFTransformer', 'DFAGNN', 'GINE', 'GCN',
                'None')
#: Local layers with attention dropout (``gt.local_attn_dropout``).
LOCAL_ATTN_LAYERS = ('DFGAT', 'DFGATv2', 'DFTransformer')
#: Local layers that take edge features (``dataset.edge_encoder``).
LOCAL_EDGE_LAYERS = ('DFGAT', 'DFGATv2', 'DFTransformer', 'GINE')
EDGE_ENCODERS = ('DummyEdge', 'LinearEdge', 'TypeDictEdge')
GLOBAL_LAYERS = ('Transformer', 'None')
#: ``train.capture``: eager, CUDA graphs, torch.compile.
CAPTURE_MODES = ('none', 'graphs', 'compile')
ACTIVATIONS = ('relu', 'gelu', 'elu', 'leaky_relu', 'prelu', 'silu', 'tanh')

SCHEMA: Dict[str, Any] = {
    'out_dir': _f('results', help='where run folders go'),
    'metric_best': _f('accuracy-SBM',
                      choices=('accuracy-SBM', 'accuracy', 'mae')),
    'metric_agg': _f('argmax', choices=('argmax', 'argmin')),
    'seed': _f(0, min=0),
    'backend': _f('dfgnn', choices=('dfgnn', 'pyg'),
                  help='dfgnn: DF convs; pyg: their PyG twins'),
    'device': _f('auto', choices=('auto', 'cpu', 'cuda')),
    'num_threads': _f(0, min=0, help='torch CPU threads, 0 = default'),
    'name': _f(None, str, nullable=True,
               help='run name, default: config file stem'),
    'wandb': {
        'use': _f(False),
        'project': _f(None, str, nullable=True),
        'entity': _f(None, str, nullable=True),
    },
    'dataset': {
        'format': _f('SBM', str,
                     help="'SBM' (generated here) or 'PyG-<Dataset>'"),
        'name': _f('PATTERN', str),
        'dir': _f('data', help='root folder of generated/cached datasets'),
        'size': _f(None, int, nullable=True, min=1,
                   help='number of generated training graphs (SBM; '
                   'val/test scaled alike); null = the published 10k'),
        'gen_seed': _f(0, min=0, help='seed of the SBM generator'),
        'dfgnn_format': _f(True, help='apply ToDFGNNFormat as pre_transform'),
        'task': _f('graph', choices=('graph', )),
        'task_type': _f('classification',
                        choices=('classification', 'regression')),
        'transductive': _f(False),
        'split_mode': _f('standard', choices=('standard', )),
        'node_encoder': _f(True, choices=(True, ),
                           help='features are always linearly encoded'),
        'node_encoder_name': _f('LinearNode', str),
        'node_encoder_bn': _f(False),
        'edge_encoder': _f(False, help='encode edge features to '
                           'gt.dim_hidden and feed them to the local layer '
                           '(DFGAT, DFGATv2, DFTransformer: edge_dim; GINE); '
                           'off: GINE gets a DummyEdge, others none'),
        'edge_encoder_name': _f('DummyEdge', choices=EDGE_ENCODERS,
                                help='DummyEdge: one learned vector; '
                                'LinearEdge: Linear of edge_attr; '
                                'TypeDictEdge: embedding of integer types'),
        'edge_encoder_num_types': _f(None, int, nullable=True, min=1,
                                     help='TypeDictEdge types; null = '
                                     '1 + the largest in the data'),
        'edge_encoder_bn': _f(False),
        'sbm_edge_attr': _f('none', choices=('none', 'same_block'),
                            help='SBM only: same_block gives every edge '
                            'edge_attr 1 inside a block, 0 across'),
    },
    'posenc_LapPE': {
        'enable': _f(False),
        'eigen': {
            'laplacian_norm': _f('none', choices=('none', 'sym')),
            'eigvec_norm': _f('L2', choices=('L2', )),
            'max_freqs': _f(10, min=1),
        },
        'model': _f('DeepSet', choices=('DeepSet', )),
        'dim_pe': _f(16, min=1),
        'layers': _f(2, min=1),
        'n_heads': _f(4, min=1, help='unused (Transformer PE model)'),
        'raw_norm_type': _f('none', choices=('none', )),
    },
    'posenc_RWSE': {
        'enable': _f(False),
        'kernel': {
            'times_func': _f('range(1,17)', str,
                             help="random-walk steps, 'range(a,b)'"),
        },
        'model': _f('Linear', choices=('Linear', )),
        'dim_pe': _f(16, min=1),
        'raw_norm_type': _f('BatchNorm', choices=('BatchNorm', 'none')),
    },
    'train': {
        'mode': _f('custom', choices=('custom', )),
        'batch_size': _f(32, min=1),
        'eval_period': _f(1, min=1),
        'enable_ckpt': _f(True),
        'ckpt_period': _f(1, min=1),
        'num_workers': _f(0, min=0, help='DataLoader workers (loader pyg)'),
        'loader': _f('device', choices=('device', 'pyg'),
                     help='device: splits concatenated on the device, '
                     'batches built there (no host collation, no host '
                     'sync); pyg: torch_geometric DataLoader'),
        'capture': _f('none', choices=CAPTURE_MODES,
                      aliases=((False, 'none'), (True, 'graphs')),
                      help='training step captured, batches padded to a '
                      'few fixed shapes (loader device): graphs = one CUDA '
                      'graph per shape (torch.cuda.graphs, CUDA only); '
                      'compile = torch.compile (inductor; on CUDA '
                      "mode='reduce-overhead'); none = eager. false / true "
                      'are none / graphs'),
        'compile_layers': _f(False,
                             help='training runs each GPS layer through '
                             'torch.compile (inductor, default mode; one '
                             'compilation shared by the identical layers, '
                             'per padded batch shape): inductor fuses the '
                             "layers' glue (batch norms, residuals, FFN) "
                             'while the attention stays in our kernels; with '
                             'capture graphs the CUDA graphs replay the '
                             'fused kernels. Needs loader device; not with '
                             'capture compile (the whole step compiled)'),
        'windows_per_graph': _f(0, min=0,
                                help='staging windows of the fused kernels '
                                'per graph of a device batch (SMMF / PMF '
                                'blocks): 0 = enough for about two blocks per '
                                'SM, 1 = one per graph'),
        'ddp_batch': _f('global', choices=('global', 'per_rank'),
                        help='data parallel (torchrun): global = '
                        'batch_size is the batch of all ranks together '
                        '(each takes batch_size / world_size; the steps of '
                        'one process); per_rank = each rank takes '
                        'batch_size graphs per step (global batch x '
                        'world_size, steps per epoch / world_size, the LR '
                        'schedule still per epoch); alone: no difference'),
        'progress_bar': _f(True),
        'time_limit_s': _f(0.0, float, min=0.0,
                           help='stop after the epoch that passes this '
                           'many seconds (resumable where train.enable_ckpt'
                           '); 0 = none'),
    },
    'model': {
        'type': _f('GPSModel', choices=('GPSModel', )),
        'loss_fun': _f('weighted_cross_entropy',
                       choices=('weighted_cross_entropy', 'cross_entropy',
                                'l1')),
        'edge_decoding': _f('dot', str),
    },
    'gt': {
        'layer_type': _f('DFGAT+Transformer', str,
                         help='<local>+<global>'),
        'layers': _f(6, min=0),
        'n_heads': _f(4, min=1),
        'dim_hidden': _f(64, min=1),
        'dropout': _dropout(),
        'attn_dropout': _dropout(0.5, help='global attention'),
        'local_attn_dropout': _f(0.0, float, min=0.0, max=1.0,
                                 max_inclusive=False,
                                 help='attention dropout of the local '
                                 'DFGAT / DFGATv2 / DFTransformer conv'),
        'layer_norm': _f(False),
        'batch_norm': _f(True),
        'attn_impl': _f('auto', choices=GLOBAL_ATTN_IMPLS,
                        help="the global attention's kernel (backend "
                        "dfgnn): 'varlen' (PyTorch's memory-efficient "
                        "attention over each graph's nodes, CUDA), "
                        "'fused' (our op over the block-diagonal complete "
                        "graph), 'padded' (GraphGPS's padded "
                        "nn.MultiheadAttention); 'auto': varlen on CUDA "
                        "(while training with attention dropout: fused "
                        "for heads the kernels run as 4 * 2^k features, "
                        "else padded; "
                        "padded compiled), fused elsewhere. Backend pyg: "
                        "padded only"),
    },
    'gnn': {
        'head': _f('inductive_node', choices=('inductive_node', )),
        'layers_pre_mp': _f(0, min=0),
        'layers_post_mp': _f(3, min=1),
        'dim_inner': _f(64, min=1),
        'batchnorm': _f(True),
        'act': _f('relu', choices=ACTIVATIONS),
        'dropout': _dropout(),
        'agg': _f('mean', str),
        'normalize_adj': _f(False),
    },
    'optim': {
        'optimizer': _f('adamW', choices=('adam', 'adamW')),
        'base_lr': _f(0.001, float, min=0.0),
        'weight_decay': _f(1e-5, float, min=0.0),
        'max_epoch': _f(100, min=1),
        'scheduler': _f('cosine_with_warmup',
                        choices=('none', 'cosine_with_warmup')),
        'num_warmup_epochs': _f(5, min=0),
        'clip_grad_norm': _f(True),
        'clip_grad_norm_value': _f(1.0, float, min=0.0),
    },
}


class Config(dict):
    """A nested dict with attribute access (``cfg.gt.layers``)."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value

    def to_dict(self) -> Dict[str, Any]:
        return {k: v.to_dict() if isinstance(v, Config) else copy.deepcopy(v)
                for k, v in self.items()}

    def get_path(self, dotted: str) -> Any:
        node: Any = self
        for part in dotted.split('.'):
            node = node[part]
        return node


def _defaults(schema: Dict[str, Any]) -> Config:
    return Config({
        k: _defaults(v) if isinstance(v, dict) else copy.deepcopy(v.default)
        for k, v in schema.items()
    })


def default_config() -> Config:
    """The schema's defaults as a :class:`Config`."""
    return _defaults(SCHEMA)


def _unknown(key: str, candidates: Iterable[str]) -> ConfigError:
    leaf = key.rsplit('.', 1)[-1]
    close = difflib.get_close_matches(leaf, list(candidates), n=1)
    prefix = key.rsplit('.', 1)[0] + '.' if '.' in key else ''
    hint = f" (did you mean '{prefix}{close[0]}'?)" if close else ''
    return ConfigError(f"unknown key '{key}'{hint}")


def _coerce(key: str, value: Any, field: Field) -> Any:
    value = _canonical(value, field)
    if value is None:
        if field.nullable:
            return None
        raise ConfigError(f"'{key}' must not be null")
    # PyYAML reads '1e-5' (no dot) as a string: accept numeric strings for
    # float fields, as GraphGPS configs write them that way.
    if float in field.types and isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if float in field.types and isinstance(value, int) and not isinstance(
            value, bool):
        value = float(value)
    ok = isinstance(value, field.types)
    if ok and isinstance(value, bool) and bool not in field.types:
        ok = False  # bool is an int subclass; 'layers: true' is a mistake
    if not ok:
        names = ' or '.join(t.__name__ for t in field.types)
        raise ConfigError(f"'{key}' must be {names}, got "
                          f"{type(value).__name__} {value!r}")
    if field.choices is not None and value not in field.choices:
        raise ConfigError(f"'{key}' must be one of {list(field.choices)}, "
                          f"got {value!r}")
    if isinstance(value, float) and not math.isfinite(value) and (
            field.min is not None or field.max is not None):
        # (nan passes every comparison; inf is no learning rate)
        raise ConfigError(f"'{key}' must be a finite number, got {value!r}")
    if field.min is not None and value < field.min:
        raise ConfigError(f"'{key}' must be >= {field.min}, got {value!r}")
    if field.max is not None and (value > field.max or (
            value == field.max and not field.max_inclusive)):
        op = '<=' if field.max_inclusive else '<'
        raise ConfigError(f"'{key}' must be {op} {field.max}, got {value!r}")
    return value


def _canonical(value: Any, field: Field) -> Any:
    for old, new in field.aliases:
        if type(value) is type(old) and value == old:
            return new
    return value


def canonical_value(key: str, value: Any) -> Any:
    """``value`` of the dotted ``key`` with an older spelling mapped to the
    current one (a checkpoint's ``train.capture: true`` -> ``'graphs'``);
    other values and unknown keys as they are."""
    node: Any = SCHEMA
    for part in key.split('.'):
        if not isinstance(node, dict) or part not in node:
            return value
        node = node[part]
    return _canonical(value, node) if isinstance(node, Field) else value


def _merge(cfg: Config, schema: Dict[str, Any], data: Any,
           prefix: str) -> None:
    if not isinstance(data, dict):
        raise ConfigError(f"'{prefix.rstrip('.') or '<root>'}' must be a "
                          f"mapping, got {type(data).__name__}")
    for k, v in data.items():
        key = f'{prefix}{k}'
        if not isinstance(k, str) or k not in schema:
            raise _unknown(key, schema.keys())
        if isinstance(schema[k], dict):
            _merge(cfg[k], schema[k], v, key + '.')
        else:
            cfg[k] = _coerce(key, v, schema[k])


def parse_override(text: str) -> Tuple[str, Any]:
    """``'gt.layers=3'`` -> ``('gt.layers', 3)`` (value parsed as YAML)."""
    if '=' not in text:
        raise ConfigError(f"override {text!r} must look like key=value")
    key, raw = text.split('=', 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {text!r} has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as e:
        raise ConfigError(f"override '{key}': cannot parse {raw!r}: {e}")
    return key, value


def _nest(key: str, value: Any) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    node = out
    parts = key.split('.')
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out


def _pyg_datasets() -> Tuple[str, ...]:
    from pyg_dfgnn.datasets import PYG_DATASETS
    return PYG_DATASETS


def validate(cfg: Config) -> Config:
    """Checks across keys (the per-key checks ran while merging)."""
    local, glob = split_layer_type(cfg.gt.layer_type)
    if local == 'None' and glob == 'None' and cfg.gt.layers > 0:
        raise ConfigError("'gt.layer_type' None+None has neither a local nor "
                          "a global model")
    if cfg.gt.dim_hidden != cfg.gnn.dim_inner:
        raise ConfigError(f"'gt.dim_hidden' ({cfg.gt.dim_hidden}) must match "
                          f"'gnn.dim_inner' ({cfg.gnn.dim_inner})")
    heads_needed = glob == 'Transformer' or local in ('DFGAT', 'DFGATv2',
                                                      'DFTransformer')
    if heads_needed and cfg.gt.dim_hidden % cfg.gt.n_heads:
        raise ConfigError(f"'gt.dim_hidden' ({cfg.gt.dim_hidden}) must be a "
                          f"multiple of 'gt.n_heads' ({cfg.gt.n_heads})")
    if cfg.backend == 'pyg' and cfg.gt.attn_impl not in ('auto', 'padded'):
        raise ConfigError(f"'gt.attn_impl' {cfg.gt.attn_impl!r} is for "
                          f"backend dfgnn; backend pyg runs GraphGPS's padded "
                          f"attention (leave it 'auto')")
    if cfg.gt.attn_impl == 'varlen' and cfg.gt.attn_dropout > 0:
        raise ConfigError(VARLEN_DROPOUT_ERROR)
    if cfg.gt.attn_impl == 'varlen' and compiles_layers(cfg):
        raise ConfigError(VARLEN_COMPILE_ERROR)
    if cfg.train.compile_layers:
        if cfg.train.loader != 'device':
            raise ConfigError("'train.compile_layers' needs 'train.loader' "
                              "device (its padded batches come in a few "
                              "shapes: one compilation each)")
        if canonical_value('train.capture', cfg.train.capture) == 'compile':
            raise ConfigError("'train.compile_layers' with 'train.capture' "
                              "compile: the step is compiled whole already "
                              "(use capture graphs or none)")
    if cfg.gt.layer_norm and cfg.gt.batch_norm:
        raise ConfigError("'gt.layer_norm' and 'gt.batch_norm' are exclusive")
    if cfg.gt.local_attn_dropout > 0 and local not in LOCAL_ATTN_LAYERS:
        raise ConfigError(f"'gt.local_attn_dropout' needs an attention local "
                          f"layer ({', '.join(LOCAL_ATTN_LAYERS)}); "
                          f"'gt.layer_type' has local model {local!r}")
    if cfg.name is not None and (
            not cfg.name or cfg.name in ('.', '..') or
            any(sep in cfg.name for sep in ('/', '\\', os.sep))):
        raise ConfigError(f"'name' must be a folder name inside 'out_dir' "
                          f"(no path separators), got {cfg.name!r}")
    ds = cfg.dataset
    if ds.edge_encoder and local not in LOCAL_EDGE_LAYERS:
        layers = ', '.join(LOCAL_EDGE_LAYERS)
        raise ConfigError(f"'dataset.edge_encoder' needs a local layer that "
                          f"takes edge features ({layers}); 'gt.layer_type' "
                          f"has local model {local!r}")
    fmt = cfg.dataset.format
    if fmt == 'SBM':
        if cfg.dataset.name not in ('PATTERN', 'CLUSTER'):
            raise ConfigError("'dataset.name' must be PATTERN or CLUSTER for "
                              f"format SBM, got {cfg.dataset.name!r}")
        if ds.edge_encoder and ds.edge_encoder_name != 'DummyEdge' and \
                ds.sbm_edge_attr == 'none':
            raise ConfigError(f"'dataset.edge_encoder_name' "
                              f"{ds.edge_encoder_name} needs edge features: "
                              f"generated SBM graphs have none unless "
                              f"'dataset.sbm_edge_attr' is set (same_block)")
    elif not fmt.startswith('PyG-') or fmt[len('PyG-'):] not in \
            _pyg_datasets():
        raise ConfigError(f"'dataset.format' must be 'SBM' or one of "
                          f"{['PyG-' + d for d in _pyg_datasets()]}, got "
                          f"{fmt!r}")
    elif ds.sbm_edge_attr != 'none':
        raise ConfigError("'dataset.sbm_edge_attr' only applies to "
                          f"'dataset.format' SBM, got {fmt!r}")
    elif ds.size is not None:  # (PyG's splits are read as they are)
        raise ConfigError(f"'dataset.size' only applies to 'dataset.format' "
                          f"SBM (generated graphs), got {fmt!r}; set it to "
                          f"null")
    enc = cfg.dataset.node_encoder_name.split('+')
    if enc[0] not in ('LinearNode', 'TypeDictNode') or any(
            e not in ('LapPE', 'RWSE') for e in enc[1:]) or len(
                set(enc[1:])) != len(enc[1:]):
        raise ConfigError("'dataset.node_encoder_name' must be LinearNode or "
                          "TypeDictNode, optionally +LapPE and/or +RWSE, got "
                          f"{cfg.dataset.node_encoder_name!r}")
    dim_pe = 0
    for pe in ('LapPE', 'RWSE'):
        if (pe in enc) != cfg[f'posenc_{pe}'].enable:
            raise ConfigError(f"'posenc_{pe}.enable' must be True exactly "
                              f"when 'dataset.node_encoder_name' has +{pe}")
        if cfg[f'posenc_{pe}'].enable:
            dim_pe += cfg[f'posenc_{pe}'].dim_pe
    if dim_pe >= cfg.gt.dim_hidden:
        raise ConfigError("'posenc_*.dim_pe' together must be smaller than "
                          "'gt.dim_hidden'")
    rwse_times(cfg.posenc_RWSE.kernel.times_func)
    regression = cfg.dataset.task_type == 'regression'
    if regression != (cfg.model.loss_fun == 'l1'):
        raise ConfigError("'model.loss_fun' must be l1 exactly when "
                          "'dataset.task_type' is regression")
    if regression != (cfg.metric_best == 'mae'):
        raise ConfigError("'metric_best' must be mae exactly when "
                          "'dataset.task_type' is regression")
    want_agg = 'argmin' if cfg.metric_best == 'mae' else 'argmax'
    if cfg.metric_agg != want_agg:
        raise ConfigError(f"'metric_agg' must be {want_agg} for metric "
                          f"{cfg.metric_best}")
    return cfg


def rwse_times(times_func: str) -> range:
    """``'range(1,17)'`` -> ``range(1, 17)`` (GraphGPS writes the RWSE
    steps as Python; only ``range(a,b)`` with ``1 <= a < b`` is accepted)."""
    import re
    m = re.fullmatch(r'\s*range\(\s*(\d+)\s*,\s*(\d+)\s*\)\s*', times_func)
    if not m or not 1 <= int(m.group(1)) < int(m.group(2)):
        raise ConfigError("'posenc_RWSE.kernel.times_func' must look like "
                          f"'range(1,17)', got {times_func!r}")
    return range(int(m.group(1)), int(m.group(2)))


def compiles_layers(cfg: Config) -> bool:
    """Whether training traces the GPS layers with torch.compile (the whole
    step, ``train.capture: compile``, or the layers alone,
    ``train.compile_layers``)."""
    return cfg.train.compile_layers or canonical_value(
        'train.capture', cfg.train.capture) == 'compile'


def pads_batches(cfg: Config) -> bool:
    """Whether training batches are padded to a few fixed shapes: for a
    captured step (CUDA graphs, torch.compile) or compiled layers, each
    shape captured / compiled once."""
    return cfg.train.compile_layers or canonical_value(
        'train.capture', cfg.train.capture) != 'none'


def split_layer_type(layer_type: str) -> Tuple[str, str]:
    """``'DFGAT+Transformer'`` -> ``('DFGAT', 'Transformer')``."""
    parts = layer_type.split('+')
    if len(parts) != 2:
        raise ConfigError("'gt.layer_type' must be '<local>+<global>' with "
                          f"local in {list(LOCAL_LAYERS)} and global in "
                          f"{list(GLOBAL_LAYERS)}, got {layer_type!r}")
    local, glob = parts
    if local not in LOCAL_LAYERS:
        raise ConfigError(f"'gt.layer_type': local model {local!r} must be "
                          f"one of {list(LOCAL_LAYERS)}")
    if glob not in GLOBAL_LAYERS:
        raise ConfigError(f"'gt.layer_type': global model {glob!r} must be "
                          f"one of {list(GLOBAL_LAYERS)}")
    return local, glob


def load_config(path: Optional[str] = None,
                overrides: Optional[List[str]] = None,
                data: Optional[Dict[str, Any]] = None) -> Config:
    """Loads ``path`` (YAML) and/or ``data`` over the defaults, applies the
    ``key=value`` ``overrides`` in order, and validates the result."""
    cfg = default_config()
    if path is not None:
        if os.path.isdir(path):
            raise ConfigError(f"config file {path!r} is a directory")
        if not os.path.isfile(path):
            raise ConfigError(f"config file {path!r} does not exist")
        with open(path, encoding='utf-8') as f:
            try:
                loaded = yaml.safe_load(f)
            except yaml.YAMLError as e:
                raise ConfigError(f"{path}: invalid YAML: {e}") from None
            except UnicodeDecodeError as e:
                raise ConfigError(f"{path}: not UTF-8 text ({e.reason} at "
                                  f"byte {e.start}); save it as UTF-8") \
                    from None
        if loaded is not None:
            _merge(cfg, SCHEMA, loaded, '')
    if data is not None:
        _merge(cfg, SCHEMA, data, '')
    for text in overrides or []:
        key, value = parse_override(text)
        _merge(cfg, SCHEMA, _nest(key, value), '')
    if cfg.name is None:  # (also after an empty 'name=' override)
        cfg.name = 'run' if path is None else \
            os.path.splitext(os.path.basename(path))[0]
    return validate(cfg)


def dump_config(cfg: Config) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)
