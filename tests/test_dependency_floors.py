"""The dependency floors in pyproject.toml and environment.yml have what the code uses, and say the same.

agpc transposes with the array API standard's ``.mT`` attribute (the readable spelling, and the one the
standard names). NumPy arrays have ``.mT`` from NumPy 2.0 and CuPy arrays from CuPy 14, so the floors are
``numpy>=2`` and ``cupy-cuda12x>=14`` (or ``cupy-cuda13x>=14``): on NumPy 1.26 or CuPy 13 the first kernel
evaluation would raise AttributeError. Everything else agpc uses from NumPy directly (``np.asarray``,
``np.unique``, ``np.lib.format.open_memmap``, ...) exists in 1.26, and the array API functions that are
new in NumPy 2 (``vecdot``, ``unique_values``, ``asarray(copy=)``) come through array-api-compat's
namespace, which provides them on older NumPy too: ``.mT`` is what sets the NumPy floor.

A NumPy 2 floor moves the floors of the compiled libraries with it: a wheel built against NumPy 1.x
cannot be imported under NumPy 2, and the first releases built against NumPy 2 are listed in
``FIRST_BUILT_FOR_NUMPY_2`` (from each project's release notes).
"""

import pathlib
import re

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.version import Version

try:
    import tomllib
except ImportError:  # Python 3.10: pytest itself depends on tomli there
    import tomli as tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
GPU_ENVIRONMENT = "gpu_tests/environment-gpu.yml"  # (the top level holds one environment file: the GPU one sits beside run_on_gpu.sh)

# NumPy / CuPy attributes of arrays or namespaces that appear only from these versions.
NUMPY_2_ARRAY_ATTRIBUTES = (".mT",)
NUMPY_2_ONLY_FUNCTIONS = ("vecdot", "matrix_transpose", "unique_values", "unique_counts", "unique_inverse",
                          "unique_all", "astype", "concat", "permute_dims", "pow", "isdtype", "cumulative_sum",
                          "cumulative_prod", "trapezoid", "unstack", "bitwise_invert", "acos", "atan2")
CUPY_FLOOR_FOR_MT = Version("14")
FIRST_BUILT_FOR_NUMPY_2 = {"scipy": Version("1.13"), "matplotlib": Version("3.8.4"), "pyarrow": Version("16"),
                           "scikit-learn": Version("1.4.2"), "pandas": Version("2.2.2")}
CUPY_PACKAGES = ("cupy-cuda12x", "cupy-cuda13x")


def _pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _pyproject_requirements():
    """Every requirement of pyproject.toml: (where, Requirement), where = "dependencies" or "extra NAME"."""
    project = _pyproject()["project"]
    out = [("dependencies", Requirement(text)) for text in project["dependencies"]]
    for extra, texts in project.get("optional-dependencies", {}).items():
        out += [(f"extra {extra}", Requirement(text)) for text in texts]
    return out


def _floor(requirement):
    """The lower bound of a ``>=`` requirement (the only kind of bound these files use)."""
    floors = [Version(spec.version) for spec in requirement.specifier if spec.operator == ">="]
    assert len(floors) == 1, f"{requirement}: expected one '>=' floor"
    return floors[0]


def _floors():
    """{package: floor} over pyproject.toml; a package named twice must have one floor (checked here).
    Requirements for another Python (a marker false here, e.g. zarr 2.18 for Python 3.10) are not this
    interpreter's floors and are left out."""
    floors = {}
    for where, requirement in _pyproject_requirements():
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        name, floor = requirement.name.lower(), _floor(requirement)
        assert floors.get(name, floor) == floor, f"{name} has two floors in pyproject.toml ({where}: {floor})"
        floors[name] = floor
    return floors


def _environment_floors():
    """{package: floor} of environment.yml and environment-gpu.yml (conda names; commented lines do not count)."""
    floors = {}
    for name in ("environment.yml", GPU_ENVIRONMENT):
        for line in (ROOT / name).read_text().splitlines():
            match = re.match(r"^\s*-\s+([A-Za-z0-9_.\-]+)(\[[^\]]*\])?\s*>=\s*([0-9.]+)\s*(#.*)?$", line)
            if match:
                floors[match.group(1).lower()] = Version(match.group(3))
    return floors


def _conda_dependencies(name):
    """The conda package lines of an environment file (pip's section left out), as written."""
    return [entry for entry in yaml.safe_load((ROOT / name).read_text())["dependencies"] if isinstance(entry, str)]


def _agpc_sources():
    return {path: path.read_text() for path in sorted((ROOT / "agpc").rglob("*.py"))}


def _uses_numpy_2_features():
    """(file, feature) for each NumPy-2 / CuPy-14 feature the code uses."""
    uses = []
    for path, text in _agpc_sources().items():
        code = "\n".join(line.split("#", 1)[0] for line in text.splitlines())  # comments do not count
        for attribute in NUMPY_2_ARRAY_ATTRIBUTES:
            if re.search(re.escape(attribute) + r"\b", code):
                uses.append((path.name, attribute))
        for function in NUMPY_2_ONLY_FUNCTIONS:
            if re.search(r"\bnp\.(linalg\.)?" + function + r"\b", code):  # NumPy itself, not the xp namespace
                uses.append((path.name, "np." + function))
    return uses


def test_the_code_uses_mT_so_the_floors_are_numpy_2_and_cupy_14():
    uses = _uses_numpy_2_features()
    assert uses, "no NumPy-2 feature left: the floors could go back to numpy>=1.26 and cupy>=13 (update this test)"
    floors = _floors()
    assert floors["numpy"] >= Version("2"), f"numpy floor {floors['numpy']} but agpc uses {sorted(set(uses))}"
    cupy = {name: floors[name] for name in CUPY_PACKAGES if name in floors}
    assert "cupy-cuda12x" in cupy, "the gpu extra must name cupy-cuda12x"
    for name, floor in cupy.items():
        assert floor >= CUPY_FLOOR_FOR_MT, f"{name}>={floor}: CuPy arrays have .mT only from CuPy 14"


def test_the_gpu_extras_cover_cuda_12_and_13():
    extras = _pyproject()["project"]["optional-dependencies"]
    assert [Requirement(text).name for text in extras["gpu"]] == ["cupy-cuda12x"]
    assert [Requirement(text).name for text in extras["gpu-cuda13"]] == ["cupy-cuda13x"]
    readme, install = (ROOT / "README.md").read_text(), (ROOT / "docs" / "install.md").read_text()
    assert "agpc[gpu-cuda13]" in readme, "the README must name the CUDA 13 extra"
    assert "agpc[gpu-cuda13]" in install and "cupy-cuda13x" in install, "docs/install.md must document the CUDA 13 extra"


@pytest.mark.parametrize("package", sorted(FIRST_BUILT_FOR_NUMPY_2))
def test_compiled_dependencies_have_a_floor_that_imports_under_numpy_2(package):
    floors = _floors()
    if floors["numpy"] < Version("2"):
        pytest.fail("the NumPy floor is below 2 but .mT needs 2: see the test above")
    assert floors[package] >= FIRST_BUILT_FOR_NUMPY_2[package], (
        f"{package}>={floors[package]} was built against NumPy 1.x and does not import under numpy>=2; "
        f"the first release built against NumPy 2 is {FIRST_BUILT_FOR_NUMPY_2[package]}")


def test_the_gpu_installs_bring_the_cuda_libraries():
    """A machine with only the NVIDIA driver must run agpc[gpu]: cupy-cuda12x alone imports, but
    ``import cupyx.scipy.linalg`` then fails to find libcublasLt and kernels fail to compile without NVRTC. CuPy's
    ``[ctk]`` extra brings NVIDIA's CUDA library wheels (CuPy's install guide), and conda-forge's ``cupy`` package
    (not ``cupy-core``) the conda builds of the same; both GPU extras and environment-gpu.yml say so, uncommented."""
    extras = _pyproject()["project"]["optional-dependencies"]
    for extra, package in (("gpu", "cupy-cuda12x"), ("gpu-cuda13", "cupy-cuda13x")):
        (requirement,) = [Requirement(text) for text in extras[extra]]
        assert requirement.name == package and "ctk" in requirement.extras, f"{extra}: {requirement}"
    cpu, gpu = _conda_dependencies("environment.yml"), _conda_dependencies(GPU_ENVIRONMENT)
    cupy = [entry for entry in gpu if re.match(r"cupy\b", entry)]
    assert cupy == ["cupy>=14"], f"environment-gpu.yml must ask for conda-forge's cupy (with its CUDA libraries): {cupy}"
    assert set(gpu) - set(cpu) == {"cupy>=14"} and set(cpu) <= set(gpu), "environment-gpu.yml = environment.yml + cupy"
    assert not any("cupy" in entry for entry in cpu)
    install = (ROOT / "docs" / "install.md").read_text()
    for text in ("agpc[gpu]", "agpc[gpu-cuda13]", GPU_ENVIRONMENT, "NVIDIA driver", "DeviceUnavailableError"):
        assert text in install, f"the GPU section of docs/install.md must say {text!r}"
    readme = (ROOT / "README.md").read_text()
    for text in ("agpc[gpu]", "agpc[gpu-cuda13]", GPU_ENVIRONMENT, "NVIDIA driver", "docs/install.md"):
        assert text in readme, f"the README's install section must say {text!r}"


def test_pyproject_and_environment_yml_agree():
    pip_floors = _floors()
    conda_floors = _environment_floors()
    conda_names = {"cupy": "cupy-cuda12x"}  # conda-forge's cupy is one package for every CUDA version
    assert "numpy" in conda_floors and "cupy" in conda_floors, "environment.yml must pin numpy and the cupy line"
    disagree = {}
    for conda_name, floor in conda_floors.items():
        name = conda_names.get(conda_name, conda_name)
        if name in pip_floors and pip_floors[name] != floor:
            disagree[conda_name] = (str(floor), str(pip_floors[name]))
    assert not disagree, f"environment.yml vs pyproject.toml floors differ: {disagree}"
    missing = sorted(set(pip_floors) - set(conda_floors) - {"cupy-cuda12x", "cupy-cuda13x", "setuptools"})
    assert not missing, f"pyproject.toml names packages environment.yml does not: {missing}"
