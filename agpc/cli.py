"""The ``agpc`` command. ``agpc demo`` trains and evaluates on built-in data and prints the figures."""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

__all__ = ["main"]


def _nll(proba, y, classes):
    idx = np.searchsorted(classes, y)
    return float(-np.mean(np.log(np.clip(proba[np.arange(len(y)), idx], 1e-300, None))))


def _run(name, model, X_train, y_train, X_test, y_test, extra=""):
    t0 = time.perf_counter()
    model.fit(X_train, y_train)
    seconds = time.perf_counter() - t0
    proba = model.predict_proba(X_test)
    error = float(np.mean(model.classes_[np.argmax(proba, axis=1)] != y_test))
    nll = _nll(proba, y_test, model.classes_)
    print(
        f"| {name:<28} | {len(y_train):>6} | {model.inducing_points_.shape[0]:>4} | {error:>6.3f} | "
        f"{nll:>6.3f} | {seconds:>7.2f} | {extra}"
    )


def demo(args):
    from .classifier import GPClassifier
    from .datasets import banana_bayes_error, load_breast_cancer, make_banana, split_standardised

    print("agpc demo: binary EP with inducing points (seed 000), NumPy backend")
    print(f"| {'data':<28} | {'n':>6} | {'m':>4} | {'error':>6} | {'NLL':>6} | {'fit s':>7} | note")
    print(f"|{'-' * 30}|{'-' * 8}|{'-' * 6}|{'-' * 8}|{'-' * 8}|{'-' * 9}|------")
    X, y = make_banana(2000, random_state=0)
    Xt, yt = make_banana(10000, random_state=1)
    _run(
        "banana (synthetic, 2-D)",
        GPClassifier(n_inducing=args.inducing, max_iter=args.max_iter, random_state=0),
        X, y, Xt, yt,
        extra=f"Bayes error {banana_bayes_error():.3f}",
    )
    _run(
        "breast cancer (sklearn, 30-D)",
        GPClassifier(n_inducing=args.inducing, max_iter=args.max_iter, random_state=0),
        *split_standardised(*load_breast_cancer(), train_fraction=0.9, random_state=0),
        extra="90/10 split",
    )
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="agpc", description="Scalable Gaussian process classification")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="train and evaluate on built-in data, print error / NLL / time")
    p.add_argument("--inducing", type=int, default=50, help="number of inducing points (default 50)")
    p.add_argument("--max-iter", type=int, default=250, help="EP iterations (default 250)")
    p.set_defaults(func=demo)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
