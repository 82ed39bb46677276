"""Active learning by BALD (Houlsby et al. 2011) against random picks, on agpc's banana data set: each round fits
the default GPClassifier on the labelled rows and labels one more pool row, the one of largest
``predict_uncertainty(...).epistemic`` (BALD) or one at random. Prints the test NLL and accuracy after each number
of picks in ``report_at``, over seeds. Run: python docs/examples/active_learning.py [n_seeds]"""
import sys

import numpy as np
from sklearn.metrics import log_loss

from agpc import GPClassifier
from agpc.datasets import make_banana


def run(strategy, seed, n_start=4, n_picks=40, n_pool=500, n_test=1000, max_iter=50, report_at=(10, 20, 40)):
    """{picks: (test NLL, test accuracy)} of one run."""
    rng = np.random.default_rng(seed)
    X, y = make_banana(n_pool + n_test, random_state=seed)
    pool, X_test, y_test, scores = np.arange(n_pool), X[n_pool:], y[n_pool:], {}
    labelled = [*rng.choice(pool[y[:n_pool] < 0], n_start // 2), *rng.choice(pool[y[:n_pool] > 0], n_start // 2)]
    for picks in range(n_picks + 1):
        model = GPClassifier(max_iter=max_iter, random_state=0).fit(X[labelled], y[labelled])
        if picks in report_at:
            scores[picks] = (log_loss(y_test, model.predict_proba(X_test)), model.score(X_test, y_test))
        rest = np.setdiff1d(pool, labelled)
        bald = model.predict_uncertainty(X[rest]).epistemic
        labelled.append(rest[np.argmax(bald)] if strategy == "bald" else rng.choice(rest))
    return scores


def main(seeds=range(5), **options):
    results = {strategy: [run(strategy, seed, **options) for seed in seeds] for strategy in ("bald", "random")}
    print("picks  strategy  test NLL (mean +- sd over seeds)  accuracy  seeds where BALD's NLL is lower")
    for picks in results["bald"][0]:
        nll = {s: np.array([r[picks][0] for r in runs]) for s, runs in results.items()}
        for s, runs in results.items():
            wins = f"{np.sum(nll['bald'] < nll['random'])}/{len(seeds)}" if s == "bald" else ""
            print(f"{picks:5d}  {s:8s}  {nll[s].mean():.3f} +- {nll[s].std():.3f}{'':17s}"
                  f"{np.mean([r[picks][1] for r in runs]):.3f}     {wins}")
    return results


if __name__ == "__main__":
    main(seeds=range(int(sys.argv[1]) if len(sys.argv) > 1 else 5))
