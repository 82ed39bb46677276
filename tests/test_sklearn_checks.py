"""scikit-learn's own estimator checks, for EP, SEP (which also has partial_fit), GFITC and SVI.

Checks that cannot apply are listed with the reason: the equivalence of integer weights and repeated rows, which
holds from one start only (docs/weights.md).
"""

import pytest
from sklearn.utils.estimator_checks import check_estimator

from agpc import GPClassifier

_START = ("the start (the k-means inducing points, the initial lengthscales) is read from the rows unweighted, so the "
          "data with repeated rows start elsewhere; from the same inducing points and kernel an integer weight is the "
          "repeated row (tests/test_weights.py, docs/weights.md)")
EXPECTED_FAILURES = {
    "ep": {"check_sample_weight_equivalence_on_dense_data": _START},
    "sep": {"check_sample_weight_equivalence_on_dense_data": _START},
    "gfitc": {"check_sample_weight_equivalence_on_dense_data": _START + "; and GFITC gives each copy of a repeated row "
              "a latent value of its own (the weighted row has one): the two meet as the FITC variance vanishes"},
    "svi": {"check_sample_weight_equivalence_on_dense_data": _START},
}


@pytest.mark.parametrize("method", ["ep", "sep", "gfitc", "svi"])
def test_check_estimator(method):
    # small m and few iterations: the checks fit dozens of times on tiny data
    # (GFITC runs EP to convergence before each step: a looser inner tolerance and fewer steps)
    settings = dict(max_iter=3, tol=1e-3) if method == "gfitc" else dict(max_iter=10)
    estimator = GPClassifier(method=method, n_inducing=5, random_state=0, **settings)
    results = check_estimator(estimator, expected_failed_checks=EXPECTED_FAILURES[method], on_fail=None)
    failed = [r for r in results if r["status"] == "failed"]
    assert not failed, "\n".join(f"{r['check_name']}: {r['exception']!r}" for r in failed)
