"""How often minibatch SEP / ADF move their inducing points (``agpc.inference.tied_steps.TIED_INDUCING_EVERY``): every
K-th step, by the mean of the K steps' gradients in Z, each move carrying the tied factor to the new points
(``posterior.moved_factor``). Per run: the steps a time budget holds, ms a step and the test NLL at the budget.

Data: the airline split of ``benchmarks/airline.py --vs-gpflow`` (all 2,048,097 training rows, the same 10,000 test
rows, features standardised on the training rows); ``--quick``: generated banana rows. Each run is
``GPClassifier(method, n_inducing=m, batch_size=batch, max_time=budget, plateau=None, random_state=seed)`` with the
library's period patched to K for it, one after another in this process, as a user runs it (nothing set).
ms a step: the fit's wall time (its k-means start included, under a second) over its steps. The record of 2026-12-01:
benchmarks/results/inducing_every.md.

    PYTHONPATH=.:benchmarks python benchmarks/inducing_every.py --every 1,4,8 --budgets 60 --seeds 0,1
    PYTHONPATH=.:benchmarks python benchmarks/inducing_every.py --methods sep --m 500 --every 1,4,8 --budgets 60 \\
        --seeds 0
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from _protocol import mean_se
from _runner import begin, end, header, options, parse, parse_list, patched, row


def airline_or_banana(args):
    """(X_train, y_train, X_test, y_test, what) of the run."""
    if args.quick:
        from agpc.datasets import make_banana

        X, y = make_banana(4000, random_state=0)
        return X[:3000], y[:3000], X[3000:], y[3000:], "generated banana, 3,000 training and 1,000 test rows"
    from airline import peer_split

    X_train, y_train, X_test, y_test, n = peer_split(Path(args.data_dir) / "airline2008.npz")
    return X_train, y_train, X_test, y_test, (f"airline, {X_train.shape[0]:,} training and {X_test.shape[0]:,} test "
                                              f"rows of {n:,}")


def one_run(method, every, budget, seed, m, batch, data):
    """The record of one fit with Z moved every ``every`` steps."""
    from agpc import GPClassifier
    from agpc.inference import tied_steps, training

    X_train, y_train, X_test, y_test = data
    steps = [0]

    def counting(original):
        def step(self, *args, **kwargs):
            out = original(self, *args, **kwargs)
            steps[0] += bool(out[0])
            return out
        return step

    model = GPClassifier(method=method, n_inducing=m, batch_size=batch, max_iter=100_000, max_time=budget,
                         random_state=seed, plateau=None)
    with patched(tied_steps, "TIED_INDUCING_EVERY", lambda original: every), \
            patched(training.Trainer, "step", counting), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        started = time.perf_counter()
        model.fit(X_train, y_train)
        wall = time.perf_counter() - started
    proba = np.clip(model.predict_proba(X_test)[:, 1], 1e-300, 1.0 - 1e-16)
    positive = y_test == model.classes_[1]
    nll = float(-np.mean(np.where(positive, np.log(proba), np.log1p(-proba))))
    return {"method": method, "every": every, "budget": budget, "seed": seed, "m": m, "batch": batch, "wall": wall,
            "steps": steps[0], "ms_per_step": 1000.0 * wall / max(steps[0], 1), "nll": nll}


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    p = options(__doc__, "banana 3,000 rows, m = 20, SEP, K = 1 and 4, 2 s", data_dir=True)
    p.add_argument("--methods", default=None, help="comma list of sep, adf (default sep)")
    p.add_argument("--every", default=None, help="comma list of periods K (default 1,4,8)")
    p.add_argument("--budgets", default=None, help="comma list of seconds (default 60)")
    p.add_argument("--seeds", default=None, help="comma list of seeds (default 0,1)")
    p.add_argument("--m", type=int, default=None, help="inducing points (default 200)")
    p.add_argument("--batch", type=int, default=None, help="minibatch rows (default 200)")
    args = parse(p, argv, full=dict(methods="sep", every="1,4,8", budgets="60", seeds="0,1", m=200, batch=200),
                 quick=dict(methods="sep", every="1,4", budgets="2", seeds="0", m=20, batch=200))
    methods = parse_list(args.methods, ("sep", "adf"), "method")
    periods, budgets = parse_list(args.every, convert=int), parse_list(args.budgets, convert=float)
    seeds = parse_list(args.seeds, convert=int)
    run = begin("Minibatch SEP / ADF moving Z every K steps: steps, ms a step and test NLL at a time budget", args,
                argv)
    X_train, y_train, X_test, y_test, what = airline_or_banana(args)
    print(f"Data: {what}; m = {args.m}, minibatches of {args.batch}\n")
    records = []
    for method in methods:
        for budget in budgets:
            for seed in seeds:
                for every in periods:
                    record = one_run(method, every, budget, seed, args.m, args.batch,
                                     (X_train, y_train, X_test, y_test))
                    records.append(record)
                    print(json.dumps(record), flush=True)
    header(["method", "m", "batch", "budget s", "K", "seeds", "steps (median)", "ms a step (median)", "test NLL (mean)",
            "NLL - K = 1, paired"], "lrrrrrrrrr", title="By period")
    for method in methods:
        for budget in budgets:
            ones = {r["seed"]: r for r in records if (r["method"], r["budget"], r["every"]) == (method, budget, 1)}
            for every in periods:
                mine = [r for r in records if (r["method"], r["budget"], r["every"]) == (method, budget, every)]
                paired = [r["nll"] - ones[r["seed"]]["nll"] for r in mine if r["seed"] in ones]
                diff, se, _ = mean_se(paired) if paired else (float("nan"), float("nan"), 0)
                row(method, args.m, args.batch, f"{budget:g}", every, len(mine),
                    f"{statistics.median(r['steps'] for r in mine):.0f}",
                    f"{statistics.median(r['ms_per_step'] for r in mine):.2f}",
                    f"{statistics.mean(r['nll'] for r in mine):.4f}",
                    "–" if not paired else f"{diff:+.4f}" + (f" ± {se:.4f}" if np.isfinite(se) else ""))
    end(run)


if __name__ == "__main__":
    main()
