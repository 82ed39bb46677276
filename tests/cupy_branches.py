"""Which of agpc's CuPy branches a computation took, and whether it fell back to a generic array-API path, counted
by spies on the entry points themselves, so that CuPy stays CuPy (``is_cupy_namespace`` true): on a real GPU and on
the mocked CuPy (tests/cupy_mock.py) alike.

``watching_cupy_branches(monkeypatch, cupy_xp)`` patches, for the duration of the test:

- the CuPy branches: ``cupyx.scipy.linalg.solve_triangular`` (``backend.solve_triangular``),
  ``backend.factor_failure`` (``cholesky_or_nan``'s sync-free check of cuSOLVER's factor on the device, which does not
  raise on failure), ``backend._healthy_diagonal`` (that check, made by the sync-free and the checked factorisations
  alike), ``backend._cupy_row_dot_kernel`` (``row_dot``'s reduction kernel), ``cupyx.scipy.special.log_ndtr``,
  ``ndtr`` and ``erfcx`` (``backend._special``);
- the generic fallbacks (none may be taken on CuPy): ``backend._solve_triangular_generic`` (a dense solve),
  ``backend._log_ndtr_generic``, ``backend._inverse_mills_generic``, and the namespace's ``vecdot`` (array-api-compat's generic one on CuPy, which
  ``row_dot`` avoids);
- the factorisations, ``xp.linalg.cholesky`` of the namespace (each must be followed by a check of its diagonal).

Every patch goes through ``monkeypatch``, so it is undone when the test ends; the spies call the originals.
"""

from __future__ import annotations

import collections
import importlib

from agpc import backend

__all__ = ["CUPY_BRANCHES", "FACTORISATIONS", "GENERIC_PATHS", "watching_cupy_branches"]

CUPY_BRANCHES = ("cupyx.scipy.linalg.solve_triangular", "backend.factor_failure", "backend._healthy_diagonal",
                 "backend.row_dot kernel", "cupyx.scipy.special.log_ndtr", "cupyx.scipy.special.ndtr",
                 "cupyx.scipy.special.erfcx")
FACTORISATIONS = "xp.linalg.cholesky"
GENERIC_PATHS = ("backend._solve_triangular_generic", "backend._log_ndtr_generic", "backend._inverse_mills_generic",
                 "xp.vecdot")


def watching_cupy_branches(monkeypatch, cupy_xp):
    """A Counter of the calls of ``CUPY_BRANCHES`` and ``GENERIC_PATHS`` made from now to the end of the test, on
    the CuPy whose array namespace is ``cupy_xp`` (``array_api_compat.cupy`` or the mock's)."""
    linalg = importlib.import_module("cupyx.scipy.linalg")
    special = importlib.import_module("cupyx.scipy.special")
    calls = collections.Counter()

    def spy(owner, name, label):
        original = getattr(owner, name)

        def counted(*args, **kwargs):
            calls[label] += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, counted)

    spy(linalg, "solve_triangular", "cupyx.scipy.linalg.solve_triangular")
    spy(special, "log_ndtr", "cupyx.scipy.special.log_ndtr")
    spy(special, "ndtr", "cupyx.scipy.special.ndtr")
    spy(special, "erfcx", "cupyx.scipy.special.erfcx")
    spy(backend, "factor_failure", "backend.factor_failure")
    spy(backend, "_healthy_diagonal", "backend._healthy_diagonal")
    spy(cupy_xp.linalg, "cholesky", FACTORISATIONS)
    spy(backend, "_solve_triangular_generic", "backend._solve_triangular_generic")
    spy(backend, "_log_ndtr_generic", "backend._log_ndtr_generic")
    spy(backend, "_inverse_mills_generic", "backend._inverse_mills_generic")
    kernel = backend._cupy_row_dot_kernel

    def counted_kernel(cupy):
        made = kernel(cupy)

        def run(*args, **kwargs):
            calls["backend.row_dot kernel"] += 1
            return made(*args, **kwargs)

        return run

    monkeypatch.setattr(backend, "_cupy_row_dot_kernel", counted_kernel)
    spy(cupy_xp, "vecdot", "xp.vecdot")
    if hasattr(cupy_xp, "linalg") and hasattr(cupy_xp.linalg, "vecdot"):
        spy(cupy_xp.linalg, "vecdot", "xp.vecdot")
    return calls
