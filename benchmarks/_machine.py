"""Machine facts printed first by every benchmark (house rule): CPUs, BLAS, NumPy, OPENBLAS_CORETYPE."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA_DIR = PROJECT_ROOT / ".." / "shared" / "data"


def machine_lines():
    """Markdown bullet lines describing the machine and the BLAS in effect *now*."""
    import numpy as np

    lines = [
        f"- CPUs: {os.cpu_count()} (os.cpu_count); usable by this process: "
        f"{len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else 'n/a'}",
        f"- CPU model: {_cpu_model()}",
        f"- Python {platform.python_version()}, NumPy {np.__version__}",
        f"- OPENBLAS_CORETYPE = {os.environ.get('OPENBLAS_CORETYPE', '(not set)')!s}",
    ]
    try:
        from threadpoolctl import threadpool_info

        for info in threadpool_info():
            if info.get("user_api") == "blas":
                lines.append(
                    f"- BLAS: {info.get('internal_api')} {info.get('version')}, "
                    f"kernel/architecture {info.get('architecture', '?')}, "
                    f"threads {info.get('num_threads')}, threading layer {info.get('threading_layer', '?')} "
                    f"({Path(info.get('filepath', '?')).name})"
                )
            elif info.get("user_api") == "openmp":
                lines.append(f"- OpenMP: {info.get('internal_api')}, threads {info.get('num_threads')} "
                             f"({Path(info.get('filepath', '?')).name})")
    except ImportError:
        lines.append("- BLAS: threadpoolctl not installed, cannot report")
    lines.append(f"- agpc source: {source_fingerprint()}")
    try:
        load = os.getloadavg()
        lines.append(f"- load average at start (1/5/15 min): {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}")
    except OSError:
        pass
    return lines


def _cpu_model():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def print_machine(title, argv=None):
    print(f"## {title}\n")
    print(f"Command: `{' '.join(['python'] + (argv if argv is not None else sys.argv))}`\n")
    for line in machine_lines():
        print(line)
    print(flush=True)


def load_line():
    """One line with the current load average (other processes perturb timings on a small machine)."""
    try:
        load = os.getloadavg()
    except OSError:
        return ""
    return f"Load average at end (1/5/15 min): {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}."


def source_fingerprint():
    """sha256 (first 12 hex digits) of the agpc/*.py files and their newest modification time.

    The library may change between runs; this names the version a table was measured with.
    """
    import datetime
    import hashlib

    files = sorted((PROJECT_ROOT / "agpc").rglob("*.py"))
    if not files:
        return "not found"
    digest = hashlib.sha256()
    for f in files:
        digest.update(str(f.relative_to(PROJECT_ROOT)).encode())
        digest.update(f.read_bytes())
    newest = max(f.stat().st_mtime for f in files)
    when = datetime.datetime.fromtimestamp(newest).strftime("%Y-%m-%d %H:%M:%S")
    return f"sha256 {digest.hexdigest()[:12]} over {len(files)} files, newest modified {when}"


def limit_blas(threads):
    """Limit BLAS/OpenMP pools to ``threads`` (None or 0: leave them as configured); returns the limiter,
    to be kept alive for the run. Import every numerical library first: threadpoolctl sees only loaded pools."""
    if not threads:
        return None
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=threads)
