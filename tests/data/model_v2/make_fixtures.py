"""Build the version-2 model files that tests/test_persistence.py must keep loading: the models and queries of
tests/data/model_v1/make_fixtures.py (whose docstring says what they are), written by the agpc of the last
release that wrote format version 2 (commit 2ff73de: RBF kernels without priors, before kernel parameter tables
and kernel_prior). Run once, from a checkout of that commit:

    PYTHONPATH=$PWD python tests/data/model_v2/make_fixtures.py

Do not re-run it with a later agpc to "fix" a failing test: the stored files are the point.
"""

import os
import runpy

HERE = os.path.dirname(os.path.abspath(__file__))

if __name__ == "__main__":  # the same models and queries as version 1's fixtures, written here
    runpy.run_path(os.path.join(HERE, "..", "model_v1", "make_fixtures.py"))["main"](HERE)
