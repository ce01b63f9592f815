"""Finds or builds the CUDA kernels.

Order: a library named by ``$PYG_DFGNN_LIBRARY`` (a ``.so`` that an earlier
JIT build of the same sources produced, e.g. carried between device calls),
the extension prebuilt by ``setup.py`` (``pyg_dfgnn._C``), else a JIT
build of ``kernels/`` with :func:`torch.utils.cpp_extension.load` + ninja into
a cache directory (``$PYG_DFGNN_CACHE`` or ``~/.cache/pyg_dfgnn``). Either
registers the ``torch.ops.pyg_dfgnn`` ops. Without CUDA nothing is built and
the reference path runs; that is said once.
"""
import glob
import os
import sys
from pathlib import Path
from typing import Optional

import torch

# A source checkout (editable install) has kernels/ at the repository root; a
# wheel carries a copy as package data (setup.py's build_py).
_PACKAGE = Path(__file__).resolve().parents[1]
KERNEL_DIR = next((d for d in (_PACKAGE.parent / 'kernels', _PACKAGE / '_kernels')
                   if d.is_dir()), _PACKAGE.parent / 'kernels')
_state: Optional[bool] = None
_reason: str = ''


def kernel_sources():
    return sorted(glob.glob(str(KERNEL_DIR / '*.cpp'))) + sorted(
        glob.glob(str(KERNEL_DIR / '*.cu')))


def build(verbose: bool = False):
    """JIT-build and load the kernels (also used by CI to check they
    compile on a machine without a GPU)."""
    from torch.utils.cpp_extension import load
    cache = os.environ.get(
        'PYG_DFGNN_CACHE',
        os.path.join(os.path.expanduser('~'), '.cache', 'pyg_dfgnn'))
    os.makedirs(cache, exist_ok=True)
    print('pyg_dfgnn: compiling the CUDA kernels (first use only, ~1-2 min)'
          ' ...', file=sys.stderr, flush=True)
    return load(
        name='pyg_dfgnn_kernels', sources=kernel_sources(),
        # no -std: torch adds the standard its headers need (C++20 for 2.14)
        extra_cflags=['-O3'],
        # Fixed flags (ptxas's report too, seen only in verbose builds):
        # they are part of the build's identity, and a process with other
        # flags than the build's recompiles every unit (~190 s), silently.
        extra_cuda_cflags=['-O3', '-lineinfo', '--expt-relaxed-constexpr',
                           '-Xptxas=-v'],
        build_directory=cache, verbose=verbose, is_python_module=False)


def load_kernels() -> bool:
    """True once the ``torch.ops.pyg_dfgnn`` kernels are registered.

    Said once on stderr when they are not (no CUDA device, build failed)."""
    global _state, _reason
    if _state is not None:
        return _state
    _state = False
    if not torch.cuda.is_available():
        _reason = 'no CUDA device'
    else:
        library = os.environ.get('PYG_DFGNN_LIBRARY')
        try:
            if library:
                torch.ops.load_library(library)
            else:
                import pyg_dfgnn._C  # noqa: F401  (prebuilt by setup.py)
            _state = True
        except (ImportError, OSError) as e:
            if library:  # asked for by name: no silent rebuild
                raise RuntimeError(f'PYG_DFGNN_LIBRARY={library} does not '
                                   f'load: {e}') from e
            try:
                build()
                _state = True
            except Exception as e:  # compiler missing, build error, ...
                _reason = f'build failed: {e}'
    if not _state:
        print(f'pyg_dfgnn: CUDA kernels unavailable ({_reason}); using the '
              f'PyTorch reference path.', file=sys.stderr)
    return _state
