"""float32 against float64 (issue 17 item 6): test NLL and time per training step, on the CPU.

Protocol, options and commands: benchmarks/README.md, section "float32.py".
"""

from __future__ import annotations

import time

import numpy as np
from _runner import begin, end, header, options, parse, row

from agpc import GPClassifier
from agpc.backend import jitter_floor
from agpc.datasets import make_airline_like, make_banana

SETTINGS = {
    "sep": dict(method="sep", batch_size=200),
    "ep (minibatch)": dict(method="ep", batch_size=200),
    "ep (batch)": dict(method="ep", batch_size=None),
    "svi": dict(method="svi", batch_size=200),
}


def data(name, n):
    if name == "banana":
        X, y = make_banana(2 * n, random_state=0)
    else:
        X, y = make_airline_like(2 * n, random_state=0)
        X = (X - X.mean(axis=0)) / X.std(axis=0)
    return X[:n], y[:n], X[n:], y[n:]


def fit_and_score(settings, X, y, X_test, y_test, *, m, max_iter, dtype, jitter):
    started = time.perf_counter()
    model = GPClassifier(n_inducing=m, max_iter=max_iter, random_state=0, dtype=dtype, jitter=jitter,
                         blas_threads=1, **settings).fit(X, y)
    elapsed = time.perf_counter() - started
    proba = np.asarray(model.predict_proba(X_test), dtype=np.float64)
    nll = float(-np.mean(np.log(proba[np.arange(len(y_test)), np.searchsorted(model.classes_, y_test)])))
    # time per step from the training history (one record an epoch, or an iteration in batch mode): the least
    # disturbed record's time over its steps (the machine is shared: other processes only ever add time)
    times, steps = np.asarray(model.history_["time"]), np.asarray(model.history_["n_steps"])
    per_step = np.diff(times) / np.maximum(np.diff(steps), 1)
    ms = 1e3 * (float(np.min(per_step)) if per_step.size else elapsed / max(1, int(steps[-1])))
    return nll, ms, int(steps[-1])


def main(argv=None):
    p = options(__doc__, "n = 1000, m = 20, 2 epochs")
    p.add_argument("--n", type=int, default=None, help="training rows, as many test rows (default 20000)")
    p.add_argument("--m", type=int, default=None, help="inducing points (default 100)")
    p.add_argument("--epochs", type=int, default=None, help="max_iter: epochs (minibatch) or iterations (batch); default 5")
    args = parse(p, argv, full=dict(n=20000, m=100, epochs=5), quick=dict(n=1000, m=20, epochs=2))
    started = begin("float32 against float64: test NLL and time per step (CPU, one BLAS thread)", args, argv)
    jitter32 = jitter_floor(np.zeros((args.m, 1), dtype=np.float32))
    print(f"n = {args.n} training and {args.n} test rows, m = {args.m}, batch 200, max_iter = {args.epochs}; "
          f"float32 jitter {jitter32:.2e} (100 m eps).\n")
    header(["data", "method", "NLL float64 (jitter 1e-6)", "NLL float64 (float32's jitter)", "NLL float32",
            "NLL float32 - float64 (same jitter)", "ms/step float64", "ms/step float32", "speed-up"])
    for name in ("banana", "airline-like"):
        X, y, X_test, y_test = data(name, args.n)
        for label, settings in SETTINGS.items():
            kw = dict(m=args.m, max_iter=args.epochs)
            default64, _, _ = fit_and_score(settings, X, y, X_test, y_test, dtype="float64", jitter=1e-6, **kw)
            nll64, ms64, _ = fit_and_score(settings, X, y, X_test, y_test, dtype="float64", jitter=jitter32, **kw)
            nll32, ms32, _ = fit_and_score(settings, X, y, X_test, y_test, dtype="float32", jitter=jitter32, **kw)
            row(name, label, f"{default64:.4f}", f"{nll64:.4f}", f"{nll32:.4f}", f"{nll32 - nll64:+.1e}", f"{ms64:.2f}",
                f"{ms32:.2f}", f"{ms64 / ms32:.2f}x")
    end(started)


if __name__ == "__main__":
    main()
