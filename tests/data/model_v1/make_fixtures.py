"""Build the version-1 model files that tests/test_persistence.py must keep loading.

Run once, with the agpc of the commit that introduced these fixtures (format version 1, before the schema
and feature names were added), from the repository root:

    PYTHONPATH=$PWD python tests/data/model_v1/make_fixtures.py

It writes, beside itself, a binary model (make_banana, EP) and a multiclass model (iris, multiclass EP), each
with few inducing points so the files stay a few KB, plus the inputs and the predicted probabilities that
this agpc computed for them. The test loads each model with today's agpc and compares its predictions with
the stored ones: the file format is a promise to users, so an old file must keep predicting the same.
Do not re-run this script to "fix" a failing test: the stored files are the point.
"""

import os

import numpy as np
from sklearn.datasets import load_iris

from agpc import GPClassifier
from agpc.datasets import make_banana

HERE = os.path.dirname(os.path.abspath(__file__))


def main(out=HERE):
    """Write the fixtures into ``out`` (default: beside this script; tests/data/model_v2 reuses it)."""
    X, y = make_banana(200, random_state=0)
    binary = GPClassifier(n_inducing=6, max_iter=20, random_state=0).fit(X, y)
    X_query = make_banana(20, random_state=1)[0]
    binary.save(os.path.join(out, "binary_banana.npz"))
    np.savez(os.path.join(out, "binary_banana_expected.npz"), X=X_query, proba=binary.predict_proba(X_query),
             classes=binary.classes_)

    iris = load_iris()
    X, y = iris.data, iris.target
    multiclass = GPClassifier(n_inducing=5, max_iter=20, random_state=0).fit(X, y)
    X_query = X[::10]
    multiclass.save(os.path.join(out, "multiclass_iris.npz"))
    np.savez(os.path.join(out, "multiclass_iris_expected.npz"), X=X_query, proba=multiclass.predict_proba(X_query),
             classes=multiclass.classes_)


if __name__ == "__main__":
    main()
