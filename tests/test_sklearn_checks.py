"""scikit-learn's own estimator checks, for EP, SEP (which also has partial_fit), GFITC and SVI.

Every check applies, the equivalence of integer weights and repeated rows too: a fit's start reads the rows counted
by their weights (``inducing.start_rows``), so the repeated rows and the weighted ones start alike, and every method's
weighted row is its repeated rows (docs/weights.md).
"""

import pytest
from sklearn.utils.estimator_checks import check_estimator

from agpc import GPClassifier

EXPECTED_FAILURES = {"ep": {}, "sep": {}, "gfitc": {}, "svi": {}}


@pytest.mark.parametrize("method", ["ep", "sep", "gfitc", "svi"])
def test_check_estimator(method):
    # small m and few iterations: the checks fit dozens of times on tiny data
    # (GFITC runs EP to convergence before each step: a looser inner tolerance and fewer steps)
    settings = dict(max_iter=3, tol=1e-3) if method == "gfitc" else dict(max_iter=10)
    estimator = GPClassifier(method=method, n_inducing=5, random_state=0, **settings)
    results = check_estimator(estimator, expected_failed_checks=EXPECTED_FAILURES[method], on_fail=None)
    failed = [r for r in results if r["status"] == "failed"]
    assert not failed, "\n".join(f"{r['check_name']}: {r['exception']!r}" for r in failed)
