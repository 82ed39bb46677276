"""Hernandez-Lobato & Hernandez-Lobato (2016), Table 1 protocol, EP only, against scikit-learn: the settings of the
first UCI binary run in docs/results.md, now a preset of ``uci_binary.py`` (which has the protocol, the paper's numbers
and all methods).

Runs ``uci_binary.py --datasets pima,breast,sonar,ionosphere,australian,heart,crabs --methods
ep,sklearn-gpc,logreg --fractions 0.25 --m-of train --inducing kmeans --kernel-prior both`` followed by the
options given here, which override those defaults (``--inducing-fraction F`` is ``--fractions F``; ``agpc-ep``
is ``ep``). ``--kernel-prior both``: EP before (``ep-ml``, ``kernel_prior=None``) and after (``ep``, the default
priors) on the same splits, with issue 19's check at the end (``--kernel-prior auto`` for the default alone).

    PYTHONPATH=. python benchmarks/uci_binary_ep.py --methods ep,logreg --first-split 100   # seeds 100-119

    PYTHONPATH=. python benchmarks/uci_binary_ep.py --blas-threads 1
    PYTHONPATH=. python benchmarks/uci_binary_ep.py --quick
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import uci_binary  # noqa: E402

PRESET = ["--datasets", "pima,breast,sonar,ionosphere,australian,heart,crabs", "--methods", "ep,sklearn-gpc,logreg",
          "--fractions", "0.25", "--m-of", "train", "--inducing", "kmeans", "--kernel-prior", "both",
          "--title", "UCI binary classification, Hernandez-Lobato & Hernandez-Lobato (2016), Table 1 protocol (EP against scikit-learn)"]


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    argv = ["--fractions" if a == "--inducing-fraction" else a.replace("agpc-ep", "ep") for a in argv]
    if "--quick" in argv and "--datasets" not in argv:
        argv += ["--datasets", "crabs,heart", "--max-iter", "20", "--splits", "2"]
    return uci_binary.main(PRESET + argv)


if __name__ == "__main__":
    sys.exit(main())
