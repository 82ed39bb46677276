"""The counting namespace of tests/array_counting.py counts what it says it counts, once each, and says where."""

import inspect
import operator

import array_api_compat
import array_api_compat.numpy as compat_numpy
import array_api_strict
import numpy as np
import pytest
from array_counting import CountingNamespace, check_budget

from agpc import backend

DEVICE1 = array_api_strict.Device("device1")
BASES = {"strict": (array_api_strict, DEVICE1), "numpy": (compat_numpy, None)}


@pytest.fixture(params=list(BASES))
def namespace_device(request):
    base, device = BASES[request.param]
    return CountingNamespace(base, m=4, rows=(6,)), device


def _line_of(text):
    """"tests/test_array_counting.py:LINE function" of the caller's line containing ``text``."""
    caller = inspect.currentframe().f_back
    lines, first = inspect.getsourcelines(caller.f_code)
    offset = next(i for i, line in enumerate(lines) if text in line)
    return f"tests/test_array_counting.py:{first + offset} {caller.f_code.co_name}"


def test_array_namespace_of_a_counting_array_is_the_counting_namespace(namespace_device):
    xp, device = namespace_device
    x = xp.ones((3,), device=device)
    assert array_api_compat.array_namespace(x) is xp
    assert backend.array_namespace(x, xp.zeros((3,), device=device)) is xp
    assert backend.array_device(x) == x.device
    other = CountingNamespace(xp.base)
    with pytest.raises(TypeError, match="Multiple namespaces"):
        array_api_compat.array_namespace(x, other.ones((3,), device=device))


def _conversions(xp, device):
    """One of each host conversion: (kind, thunk)."""
    scalar = xp.asarray(1.5, device=device)
    integer = xp.asarray(3, dtype=xp.int64, device=device)
    vector = xp.ones((2,), device=device)
    return [
        ("__float__", lambda: float(scalar)),
        ("__bool__", lambda: bool(scalar)),
        ("__int__", lambda: int(integer)),
        ("__index__", lambda: operator.index(integer)),
        ("__complex__", lambda: complex(scalar)),
        ("__format__", lambda: f"{scalar:.2f}"),
        ("item", lambda: scalar.item()),
        ("__array__", lambda: np.asarray(vector)),
        ("__dlpack__", lambda: vector.__dlpack__()),
        ("to_device", lambda: vector.to_device(xp.host_device)),
    ]


@pytest.mark.parametrize("kind", [kind for kind, _ in _conversions(compat_numpy, None)])
def test_each_host_conversion_counts_once(namespace_device, kind):
    xp, device = namespace_device
    convert = dict(_conversions(xp, device))[kind]
    with xp.counting() as tally:
        try:
            convert()
        except (AttributeError, BufferError, RuntimeError) as error:
            # outside what the base allows (array_api_strict has no .item(), no DLPack off its CPU device):
            # still counted, then refused as the base refuses it
            assert xp.base is array_api_strict, error
    assert tally.count("host") == 1 and tally.by_operation("host") == {kind: 1}
    assert tally.count("syncs") == 1


def test_host_conversions_give_the_values(namespace_device):
    xp, device = namespace_device
    x = xp.asarray([[1.0, 2.0], [3.0, 4.0]], device=device)
    assert float(x[1, 0]) == 3.0 and int(xp.astype(x[0, 1], xp.int64)) == 2 and bool(x[0, 0] < x[1, 1])
    np.testing.assert_array_equal(np.asarray(x), [[1.0, 2.0], [3.0, 4.0]])
    np.testing.assert_array_equal(backend.to_numpy(x.mT), [[1.0, 3.0], [2.0, 4.0]])


def test_data_dependent_shapes_count_once_each(namespace_device):
    xp, device = namespace_device
    x = xp.asarray([1.0, -2.0, 3.0], device=device)
    mask = x > 0.0
    cases = [
        ("__getitem__[bool]", lambda: x[mask]),
        ("__setitem__[bool]", lambda: x.__setitem__(mask, 0.0)),
        ("nonzero", lambda: xp.nonzero(mask)),
        ("unique_values", lambda: xp.unique_values(x)),
        ("repeat[array]", lambda: xp.repeat(x, xp.asarray([1, 0, 2], dtype=xp.int64, device=device))),
    ]
    for name, run in cases:
        with xp.counting() as tally:
            run()
        assert tally.by_operation("data_dependent") == {name: 1}, name
        assert tally.count("host") == 0 and tally.count("syncs") == 1
    with xp.counting() as tally:  # integer-array and slice indexing have data-independent shapes
        x[xp.asarray([0, 2], dtype=xp.int64, device=device)]
        x[1:]
    assert tally.count("data_dependent") == 0 and tally.count("op") == 3  # asarray, two getitems


def test_clip_counts_the_boolean_masks_of_array_api_compat_cupy(namespace_device):
    """array_api_compat's clip for CuPy does ``out[ia] = a[ia]`` per bound: a masked read and write each."""
    xp, device = namespace_device
    x = xp.asarray([1.0, -2.0, 3.0], device=device)
    for bounds, syncs in (({"min": 0.0}, 2), ({"min": 0.0, "max": 2.0}, 4), ({}, 0)):
        with xp.counting() as tally:
            xp.clip(x, **bounds)
        assert tally.count("data_dependent") == syncs, bounds
    plain = CountingNamespace(xp.base, cupy_syncs=False)
    with plain.counting() as tally:
        plain.clip(plain.asarray([1.0, -2.0], device=device), min=0.0)
    assert tally.count("data_dependent") == 0


def test_data_dependent_shapes_can_be_refused():
    xp = CountingNamespace(array_api_strict, data_dependent="raise")
    x = xp.asarray([1.0, -2.0])
    with xp.counting() as tally, pytest.raises(RuntimeError, match="depends on the data"):
        x[x > 0.0]
    assert tally.count("data_dependent") == 1


def test_every_kind_of_operation_counts_once(namespace_device):
    xp, device = namespace_device
    x = xp.ones((2, 3), device=device)
    cases = [
        ("__add__", lambda: x + 1.0), ("__radd__", lambda: 1.0 + x), ("__mul__", lambda: x * x),
        ("__neg__", lambda: -x), ("__lt__", lambda: x < 0.5), ("__pow__", lambda: x ** 2),
        ("__matmul__", lambda: x @ x.mT), (".mT", lambda: x.mT), (".T", lambda: x.T),
        ("__getitem__", lambda: x[0, :]), ("__setitem__", lambda: x.__setitem__((0, 1), 2.0)),
        ("exp", lambda: xp.exp(x)), ("sum", lambda: xp.sum(x, axis=0)),
        ("linalg.diagonal", lambda: xp.linalg.diagonal(x)),
    ]
    if x.device != xp.host_device:  # a move between two devices is an operation, not a host conversion
        cases.append(("to_device", lambda: x.to_device(array_api_strict.Device("device2"))))
    for name, run in cases:
        with xp.counting() as tally:
            run()
        expected = {name: 1, ".mT": 1} if name == "__matmul__" else {name: 1}
        assert tally.by_operation("op") == expected, name
        assert tally.count("host") == 0, name
    with xp.counting() as tally:  # in place: one operation, the same proxy, the new values
        y = x
        y += 1.0
    assert y is x and tally.by_operation("op") == {"__iadd__": 1} and float(x[1, 1]) == 2.0
    with xp.counting() as tally:  # metadata and dtype queries are not operations
        _ = (x.shape, x.dtype, x.ndim, x.size, x.device, xp.finfo(x.dtype).eps, xp.isdtype(x.dtype, "real floating"))
    assert tally.events == []


def test_uploads_are_arrays_made_from_host_data(namespace_device):
    xp, device = namespace_device
    with xp.counting() as tally:
        x = xp.asarray([1.0, 2.0], device=device)
        xp.asarray(np.zeros(3), device=device)
        xp.asarray(x, copy=True)  # from a device array: not an upload
    assert tally.count("upload") == 2 and tally.count("op") == 3


def test_a_numpy_array_does_not_mix_with_a_device_array():
    """NumPy on the left defers to the proxy, and the strict base refuses a host array (as CuPy does)."""
    xp = CountingNamespace(array_api_strict)
    x = xp.ones((2,), device=DEVICE1)
    with xp.counting() as tally, pytest.raises(TypeError):
        np.ones(2) + x
    assert tally.count("host") == 0


def test_cubic_operations_are_told_from_row_products():
    """m = 4, rows of 6: (4 x 4)(4 x 4) is O(m^3), (6 x 4)(4 x 4) and (4 x 6)(6 x 4) are O(rows m^2)."""
    xp = CountingNamespace(array_api_strict, m=4, rows=(6,))
    rng = np.random.default_rng(0)
    square = xp.asarray(rng.normal(size=(4, 4)) + 4.0 * np.eye(4))
    spd = square @ square.mT
    block = xp.asarray(rng.normal(size=(6, 4)))
    small = xp.asarray(rng.normal(size=(3, 3)) + 3.0 * np.eye(3))
    stack = xp.stack([spd, spd])
    cases = [
        ("m3", lambda: square @ square), ("m3", lambda: xp.matmul(square, square)), ("m3", lambda: stack @ spd),
        ("m3", lambda: xp.linalg.cholesky(spd)), ("m3", lambda: xp.linalg.inv(square)),
        ("m3", lambda: xp.linalg.eigh(spd)), ("m3", lambda: xp.linalg.solve(square, square)),
        ("rows_m2", lambda: block @ square), ("rows_m2", lambda: xp.matmul(block.mT, block)),
        ("rows_m2", lambda: xp.linalg.solve(square, block.mT)),
        ("few_rhs_solve", lambda: xp.linalg.solve(square, block[:2, :].mT)),
        ("few_rhs_solve", lambda: xp.linalg.solve(square, block[0, :])),
        (None, lambda: square @ block[0, :]), (None, lambda: small @ small),
        (None, lambda: xp.linalg.cholesky(small @ small.mT)),
        (None, lambda: block @ block.mT[:, :3]),
    ]
    for kind, run in cases:
        with xp.counting() as tally:
            run()
        counts = tally.counts()
        found = [k for k in ("m3", "rows_m2", "few_rhs_solve") if counts[k]]
        assert found == ([] if kind is None else [kind]) and sum(counts[k] for k in found) == (kind is not None), kind
    with pytest.raises(ValueError, match="include m"):
        CountingNamespace(array_api_strict, m=4, rows=(4, 6))


def test_where_each_count_comes_from():
    xp = CountingNamespace(array_api_strict)
    x = xp.ones((3,))
    with xp.counting() as tally:
        float(xp.sum(x))  # the line to find
        backend.log_ndtr(x)
    here = _line_of("# the line to find")
    assert tally.by_site("host") == {here: 1}
    assert tally.by_site("op")[here] == 1
    sites = tally.by_site("op")
    assert sum(n for site, n in sites.items() if site.startswith("agpc/backend.py")) == tally.count("op") - 1
    # charged to the caller: the standard-only log Phi's operations all come from this test's line
    charged = tally.by_site("op", skip=("agpc/backend.py",))
    assert charged[_line_of("backend.log_ndtr(x)")] == tally.count("op") - 1
    assert " < " in next(iter(tally.by_site("op", depth=2)))


def test_folding_counts_a_helper_call_as_one_operation():
    xp = CountingNamespace(array_api_strict)
    x = xp.ones((3,))

    def chain(v):
        return xp.exp(v * 2.0 + 1.0)

    with xp.counting() as tally:
        chain(x)
        y = x + 1.0
        chain(y)
        chain(x)  # same line as nothing else: a separate call from a separate line
    folded = tally.folded(["chain"])
    assert tally.count("op") == 10
    assert folded.by_operation("op") == {"chain": 3, "__add__": 1}


def test_budget_check_names_the_kind_and_the_sites():
    xp = CountingNamespace(array_api_strict)
    x = xp.ones((3,))
    with xp.counting() as tally:
        for _ in range(3):
            bool(x[0] > 0.0)
    check_budget(tally, {"host": 3, "syncs": 3, "op": 6})
    with pytest.raises(AssertionError, match=r"the loop is over its budget: host 3 > 2") as error:
        check_budget(tally, {"host": 2, "op": 6}, label="the loop")
    assert "test_budget_check_names_the_kind_and_the_sites" in str(error.value)
    with pytest.raises(ValueError, match="unknown budget kinds"):
        check_budget(tally, {"hosts": 2})


def test_nothing_is_recorded_outside_a_tally():
    xp = CountingNamespace(array_api_strict)
    x = xp.ones((3,))
    float(xp.sum(x))
    tally = xp.start()
    float(xp.sum(x))
    assert xp.stop() is tally and tally.counts()["op"] == 1 and tally.count("host") == 1
    float(xp.sum(x))
    assert tally.count("op") == 1


def _module_at(path, source):
    """Import ``source`` as a module from the file ``path`` (its frames then carry that file name)."""
    import importlib.util

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"probe_{abs(hash(str(path)))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_test_command_works_in_a_clone_folder_named_agpc(tmp_path):
    """Issue 25, item 8: a clone of the repository is a folder named agpc, above the package's own agpc/ and above
    tests/. Call sites are named from the anchor nearest the file (tests/..., agpc/...), whatever folders lie
    above the checkout: two tests failed there when ``_short_path`` tried the anchor agpc before tests."""
    clone = tmp_path / "work" / "agpc"
    library = _module_at(clone / "agpc" / "inference" / "probe_library.py",
                         "def log_phi(xp, x):\n    return xp.exp(x) + 1.0\n")
    tests = _module_at(clone / "tests" / "test_probe.py",
                       "def step(xp, x, library):\n    float(xp.sum(x))\n    return library.log_phi(xp, x)\n")
    xp = CountingNamespace(array_api_strict)
    x = xp.ones((3,))
    with xp.counting() as tally:
        tests.step(xp, x, library)
    assert tally.by_site("host") == {"tests/test_probe.py:2 step": 1}
    assert tally.by_site("op") == {"tests/test_probe.py:2 step": 1, "agpc/inference/probe_library.py:2 log_phi": 2}
    # what the step budgets do: charge the library's operations to the test line that called it
    charged = tally.by_site("op", skip=("agpc/inference/probe_library.py",))
    assert charged == {"tests/test_probe.py:2 step": 1, "tests/test_probe.py:3 step": 2}
