"""End-to-end training speed and accuracy, backend ``dfgnn`` vs ``pyg``.

Same as ``python -m pyg_dfgnn bench-e2e``::

    python benchmarks/e2e.py --cfg configs/pattern-gps.yaml --epochs 5
    python benchmarks/e2e.py --cfg configs/pattern-gps.yaml --epochs 2 \
        dataset.size=64 gt.layers=2          # quick CPU smoke run

Both backends train the same config for the same epochs on the same generated
graphs; the table shows per-epoch training time, graphs/s and validation
metric side by side, and ``benchmarks/results/e2e-<config>-<device>.json``
keeps both histories and the summary (median epoch time without the warm-up
epoch, speed-up, metric difference).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pyg_dfgnn.__main__ import main  # noqa: E402

if __name__ == '__main__':
    sys.exit(main(['bench-e2e', *sys.argv[1:]]))
