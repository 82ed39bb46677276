"""scikit-learn's own estimator checks, for EP, SEP (which also has partial_fit), GFITC and SVI.

Checks that cannot apply are listed with the reason: the sample-weight checks where the method (or, for EP, its
multiclass passes: the checks' data have three classes) refuses weights with a ValueError (docs/weights.md).
"""

import pytest
from sklearn.utils.estimator_checks import check_estimator

from agpc import GPClassifier

_REFUSED = "refuses sample_weight with a ValueError (docs/weights.md: the methods and paths that take weights)"
_MULTICLASS = "the check's data have three classes; multiclass EP refuses sample_weight (docs/weights.md)"
_WEIGHT_CHECKS = ("check_sample_weights_pandas_series", "check_sample_weights_not_an_array",
                  "check_sample_weights_list", "check_sample_weights_shape", "check_sample_weights_not_overwritten",
                  "check_sample_weight_equivalence_on_dense_data", "check_class_weight_classifiers")
EXPECTED_FAILURES = {
    "ep": {name: _MULTICLASS for name in ("check_sample_weights_list", "check_sample_weight_equivalence_on_dense_data",
                                          "check_class_weight_classifiers")},
    "sep": {name: _MULTICLASS.replace("multiclass EP", "multiclass SEP") for name in
            ("check_sample_weights_list", "check_sample_weight_equivalence_on_dense_data",
             "check_class_weight_classifiers")},
    "gfitc": {name: _REFUSED for name in _WEIGHT_CHECKS},
    # SVI's weighted ELBO: an integer weight is the repeated row exactly from the same start (tests/test_weights.py),
    # but the start is read from the rows unweighted: the k-means inducing points and the default kernel (and its
    # prior's centres) of the repeated rows are another start, so another model after any step
    "svi": {"check_sample_weight_equivalence_on_dense_data": "the start (k-means inducing points, default kernel) is "
                                                             "read from the rows unweighted: repeated rows start "
                                                             "elsewhere (docs/weights.md)"},
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
