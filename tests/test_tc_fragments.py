"""The tensor-core window kernels' fragment bookkeeping (staging order,
per-lane loads, mma fragment layouts of the PTX ISA, accumulators reused
as A fragments) mirrored in NumPy against dense attention
(scripts/tc_fragment_check.py): CPU, catches an index slip before a GPU
run does."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_tc_fragment_bookkeeping():
    spec = importlib.util.spec_from_file_location(
        'tc_fragment_check', ROOT / 'scripts' / 'tc_fragment_check.py')
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main()
