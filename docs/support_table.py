"""Rewrite the support table of docs/methods.md from the method registry (``agpc.methods``).

Run ``python docs/support_table.py [PAGE]`` after registering or changing a method; tests/test_registry.py fails
while the page and the registry differ. (A script beside the page rather than ``python -m agpc.methods``: the
package imports agpc.methods first, and running an imported module again as ``__main__`` makes a second copy of
the registry.)"""
from agpc.methods import main

if __name__ == "__main__":
    main()
