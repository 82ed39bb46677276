"""Build the SVI checkpoint that tests/test_checkpoint.py must keep resuming: written by the agpc whose SVI held
q(u) = N(mean, chol chol^T) in u-space (the state keys ``mean`` and ``chol``; commit e933aff, before q(u) was held
whitened). Run once, from a checkout of that commit:

    PYTHONPATH=$PWD python tests/data/svi_checkpoint_unwhitened/make_fixture.py

It writes ``svi.ckpt`` (the checkpoint of a finished minibatch SVI fit: its last step is a checkpoint, so a resume
takes no step and its model is the one at the checkpoint) and ``expected.npz`` (the training rows, query rows, the
fit's parameters as JSON, and that model's ``predict_proba`` and latent mean and variance at the query rows).
Do not re-run it with a later agpc to "fix" a failing test: the stored files are the point.
"""

import json
import os

import numpy as np

from agpc import GPClassifier
from agpc.datasets import make_banana

HERE = os.path.dirname(os.path.abspath(__file__))
# 160 rows in minibatches of 40: 4 steps an epoch, 3 epochs, a checkpoint every 6 steps (the last at step 12)
PARAMS = dict(method="svi", n_inducing=6, batch_size=40, max_iter=3, random_state=0, checkpoint_every=6)


def main(folder=HERE):
    X, y = make_banana(160, random_state=11)
    X_query, _ = make_banana(25, random_state=12)
    path = os.path.join(folder, "svi.ckpt")
    model = GPClassifier(**PARAMS, checkpoint_path=path).fit(X, y)
    mean, var = model.predict_latent(X_query)
    np.savez(os.path.join(folder, "expected.npz"), X=X, y=y, X_query=X_query, params=np.asarray(json.dumps(PARAMS)),
             proba=model.predict_proba(X_query), latent_mean=mean, latent_var=var)


if __name__ == "__main__":
    main()
