"""scikit-learn's own estimator checks.

Checks that cannot apply are listed with the reason; everything else must pass.
"""

from sklearn.utils.estimator_checks import check_estimator

from agpc import GPClassifier

EXPECTED_FAILURES = {}


def test_check_estimator():
    # small m and few iterations: the checks fit dozens of times on tiny data
    estimator = GPClassifier(n_inducing=5, max_iter=10, random_state=0)
    results = check_estimator(estimator, expected_failed_checks=EXPECTED_FAILURES, on_fail=None)
    failed = [r for r in results if r["status"] == "failed"]
    assert not failed, "\n".join(f"{r['check_name']}: {r['exception']!r}" for r in failed)
