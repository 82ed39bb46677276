"""Writes go only where a user means them: every file agpc writes (``agpc fit --out``, ``predict --out``,
``save``, checkpoints, site files) goes through one atomic writer that refuses an existing target that is not
a regular file or a link to one (a FIFO, a device, a link into /proc) and any path under /proc, /sys or /dev,
and the command's or the fit's own input; an output that cannot be written fails before any training; the
temporary file beside the target has a short name, is removed on every exit Python sees, and one left by a
killed writer is removed by the next save of the same target."""

import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from agpc import GPClassifier, checkpoints
from agpc.cli import main
from agpc.datasets import make_banana
from helpers import write_csv

ROOT = Path(__file__).resolve().parent.parent
FIT_OPTIONS = ["--inducing", "5", "--max-iter", "2", "--random-state", "0", "--quiet"]
posix_only = pytest.mark.skipif(os.name != "posix", reason="FIFOs, device nodes and /proc are POSIX")


@pytest.fixture(scope="module")
def banana():
    return make_banana(120, random_state=0)


@pytest.fixture(scope="module")
def fitted(banana):
    return GPClassifier(n_inducing=5, max_iter=2, random_state=0).fit(*banana)


def one_error_line(status, err):
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and lines[0].startswith("agpc: error: "), err
    return lines[0]


# -- targets that are not regular files --------------------------------------------------------------

def _fifo(path):
    os.mkfifo(path)
    return lambda: stat.S_ISFIFO(os.lstat(path).st_mode)


def _link_to_standard_output(path):
    os.symlink("/proc/self/fd/1", path)
    return lambda: os.path.islink(path) and os.readlink(path) == "/proc/self/fd/1"


def _device_node(path):
    if os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a copy of /dev/null
    return lambda: stat.S_ISCHR(os.lstat(path).st_mode)


def _under_proc(path):
    return None  # (the path given is /proc/self/agpc-model: nothing there to keep)


TARGETS = {
    "a FIFO": _fifo,
    "a symlink to /proc/self/fd/1": _link_to_standard_output,
    "a device node (copy of /dev/null)": _device_node,
    "a path under /proc": _under_proc,
}


def make_target(tmp_path, kind):
    path = "/proc/self/agpc-model" if kind == "a path under /proc" else str(tmp_path / "target")
    still_there = TARGETS[kind](path)
    return path, still_there


@posix_only
@pytest.mark.parametrize("kind", list(TARGETS))
def test_fit_out_refuses_a_target_that_is_not_a_regular_file(tmp_path, banana, no_training, capsys, kind):
    data = write_csv(tmp_path / "d.csv", *banana)
    target, still_there = make_target(tmp_path, kind)  # (no_training: refused at the start, not after the fit)
    status = main(["fit", str(data), "--target", "label", *FIT_OPTIONS, "--out", target])
    line = one_error_line(status, capsys.readouterr().err)
    assert "agpc writes only regular files" in line
    assert still_there is None or still_there()


@posix_only
@pytest.mark.parametrize("kind", list(TARGETS))
@pytest.mark.parametrize("write", ["save", "checkpoint", "site file"])
def test_every_write_of_the_library_refuses_a_target_that_is_not_a_regular_file(tmp_path, fitted, banana,
                                                                                  no_training, kind, write):
    target, still_there = make_target(tmp_path, kind)
    with pytest.raises(ValueError, match="agpc writes only regular files"):
        if write == "save":
            fitted.save(target)
        elif write == "checkpoint":
            GPClassifier(n_inducing=5, max_iter=2, checkpoint_path=target, checkpoint_every=1).fit(*banana)
        else:
            checkpoints.save_site_chunk(target, np.ones(3), np.zeros(3))
    assert still_there is None or still_there()


def test_a_symlink_to_a_regular_file_is_written_through_and_kept(tmp_path, fitted):
    real = tmp_path / "models" / "v3.agpc"
    real.parent.mkdir()
    real.write_bytes(b"an older model")
    link = tmp_path / "current.agpc"
    link.symlink_to(real)
    fitted.save(link)
    assert link.is_symlink() and os.readlink(link) == str(real)
    np.testing.assert_array_equal(GPClassifier.load(real).classes_, fitted.classes_)


@pytest.mark.skipif(not os.path.isdir("/dev/shm") or not os.access("/dev/shm", os.W_OK), reason="no /dev/shm")
def test_dev_shm_a_file_system_of_regular_files_is_written(fitted):
    path = f"/dev/shm/agpc-test-{os.getpid()}.agpc"
    try:
        fitted.save(path)
        assert GPClassifier.load(path).n_features_in_ == 2
    finally:
        if os.path.exists(path):
            os.unlink(path)


def test_checkpoint_path_naming_the_memmapped_training_file_is_refused_before_training(tmp_path, banana,
                                                                                         no_training):
    X, y = banana
    path = tmp_path / "X.dat"
    X_disk = np.memmap(path, dtype=np.float64, mode="w+", shape=X.shape)
    X_disk[:] = X
    X_disk.flush()
    before = path.read_bytes()
    X_disk = np.memmap(path, dtype=np.float64, mode="r", shape=X.shape)
    with pytest.raises(ValueError, match="is the input file"):
        GPClassifier(n_inducing=5, max_iter=2, checkpoint_path=path, checkpoint_every=1).fit(X_disk, y)
    assert path.read_bytes() == before


@pytest.mark.parametrize("parameter", ["checkpoint_path", "site_directory"])
def test_an_empty_path_is_refused_before_training(banana, no_training, parameter):
    with pytest.raises(ValueError, match=rf"{parameter} must be None or a path \(a non-empty str"):
        GPClassifier(n_inducing=5, max_iter=2, checkpoint_every=1, **{"checkpoint_path": "x.ckpt",
                                                                     parameter: ""}).fit(*banana)


def test_a_path_with_a_nul_character_is_refused_in_agpcs_words(tmp_path, banana, fitted, no_training):
    """A hostile-input audit (2026-12-02): checkpoint_path="run\\x00.ckpt" was refused with the system's "embedded
    null byte", naming nothing; so was a save to such a path. The NUL is shown escaped."""
    path = str(tmp_path / "run\0.ckpt")
    with pytest.raises(ValueError, match=r"checkpoint_path .*run\\x00\.ckpt: a path holds no NUL character"):
        GPClassifier(n_inducing=5, max_iter=2, checkpoint_path=path, checkpoint_every=1).fit(*banana)
    with pytest.raises(ValueError, match=r"run\\x00\.ckpt: a path holds no NUL character"):
        fitted.save(path)


def test_resume_with_no_checkpoint_yet_is_one_value_error_before_training(tmp_path, banana, no_training):
    path = tmp_path / "run.ckpt"
    with pytest.raises(ValueError, match=r"resume=True: no checkpoint at .*run\.ckpt yet"):
        GPClassifier(n_inducing=5, max_iter=2, checkpoint_path=path, checkpoint_every=1).fit(*banana, resume=True)


# -- writability at the start ------------------------------------------------------------------------

@pytest.fixture
def read_only_directory(tmp_path):
    """A directory this process cannot create files in: mode 0555, or, for root (whom modes do not stop),
    the immutable attribute (chattr +i, where the file system has it); skipped where neither holds."""
    directory = tmp_path / "read-only"
    directory.mkdir()
    directory.chmod(0o555)
    immutable = False
    if os.access(directory, os.W_OK):  # root
        immutable = subprocess.run(["chattr", "+i", str(directory)], capture_output=True).returncode == 0 \
            if os.path.exists("/usr/bin/chattr") or os.path.exists("/bin/chattr") else False
    try:
        probe = directory / "probe"
        try:
            probe.write_bytes(b"")
        except OSError:
            yield directory
        else:
            probe.unlink()
            pytest.skip("no way to make a directory read-only for this process here")
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(directory)], check=True)
        directory.chmod(0o755)


def test_fit_out_into_a_read_only_directory_fails_before_training(tmp_path, banana, read_only_directory,
                                                                    monkeypatch, capsys):
    data = write_csv(tmp_path / "d.csv", *banana)
    monkeypatch.setattr(GPClassifier, "fit", lambda *args, **kwargs: pytest.fail("training started"))
    status = main(["fit", str(data), "--target", "label", *FIT_OPTIONS, "--out", str(read_only_directory / "m.agpc")])
    line = one_error_line(status, capsys.readouterr().err)
    assert f"cannot write in {read_only_directory}" in line
    assert os.listdir(read_only_directory) == []


# -- temporary files ---------------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["fit", "predict"])
def test_a_250_character_out_name_is_written(tmp_path, banana, fitted, capsys, command):
    data = write_csv(tmp_path / "d.csv", *banana)
    model = tmp_path / "m.agpc"
    fitted.save(model)
    out = tmp_path / ("o" * 246 + (".agpc" if command == "fit" else ".csv"))[:250]
    assert len(out.name) == 250
    argv = (["fit", str(data), "--target", "label", *FIT_OPTIONS] if command == "fit"
            else ["predict", str(model), str(data), "--target", "label"])
    assert main([*argv, "--out", str(out)]) == 0, capsys.readouterr().err
    assert out.stat().st_size > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["d.csv", "m.agpc", out.name])


def test_out_dash_is_refused_rather_than_written_as_a_file_named_dash(tmp_path, banana, monkeypatch, capsys):
    data = write_csv(tmp_path / "d.csv", *banana)
    monkeypatch.chdir(tmp_path)
    status = main(["fit", str(data), "--target", "label", *FIT_OPTIONS, "--out", "-"])
    assert "not to standard output" in one_error_line(status, capsys.readouterr().err)
    assert not (tmp_path / "-").exists()


def test_an_interrupt_while_writing_leaves_no_temporary_file(tmp_path, fitted, monkeypatch):
    def interrupted(fh, **arrays):
        fh.write(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(np, "savez", interrupted)
    with pytest.raises(KeyboardInterrupt):
        fitted.save(tmp_path / "m.agpc")
    assert os.listdir(tmp_path) == []


KILLED_WHILE_SAVING = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    from agpc import GPClassifier

    model = GPClassifier.load(sys.argv[1])

    def killed(fh, **arrays):
        fh.write(b"partial")
        os.kill(os.getpid(), signal.SIGKILL)

    np.savez = killed
    model.save(sys.argv[2])
""")


@posix_only
def test_temporary_files_of_saves_killed_with_sigkill_do_not_pile_up(tmp_path, fitted):
    """Six saves killed while writing (SIGKILL: no Python code runs) each leave their temporary file; each save
    of the same target removes those whose process is gone."""
    source = tmp_path / "source" / "m.agpc"
    source.parent.mkdir()
    fitted.save(source)
    target = tmp_path / "out" / "m.agpc"
    target.parent.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    for _ in range(6):
        run = subprocess.run([sys.executable, "-c", KILLED_WHILE_SAVING, str(source), str(target)], env=env,
                             capture_output=True, timeout=120)
        assert run.returncode == -signal.SIGKILL, run.stderr
    left = [name for name in os.listdir(target.parent) if name.endswith(".tmp")]
    assert len(left) == 1  # the last killed save's: each removed those of the saves killed before it
    fitted.save(target)
    assert os.listdir(target.parent) == ["m.agpc"]


def test_a_full_disk_while_writing_names_the_file_and_leaves_the_old_one(tmp_path, fitted, monkeypatch):
    """A hostile-input audit (2026-12-02): a disk that filled while a model or a checkpoint was written raised the
    system's "[Errno 28] No space left on device", naming no file (the old file stayed whole, no temporary was
    left: both kept)."""
    import errno

    path = tmp_path / "m.agpc"
    fitted.save(path)
    before = path.read_bytes()

    def full(fh, **arrays):
        fh.write(b"partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checkpoints.np, "savez", full)
    with pytest.raises(OSError, match=rf"No space left on device: writing .*m\.agpc \(a file there is unchanged\)"):
        fitted.save(path)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["m.agpc"]


def _chattr(flag, path):
    """``chattr flag path`` (root, on a file system with inode flags), or skip the test."""
    try:
        done = subprocess.run(["chattr", flag, str(path)], capture_output=True)
    except FileNotFoundError:
        pytest.skip("no chattr")
    if done.returncode:
        pytest.skip(f"chattr {flag}: {done.stderr.decode(errors='replace').strip()}")


@pytest.mark.parametrize("flag, kind", [("+i", "immutable"), ("+a", "append-only")])
def test_a_checkpoint_file_that_cannot_be_replaced_is_refused_before_training(tmp_path, banana, flag, kind,
                                                                               no_training):
    """A hostile-input audit (2026-12-02): a checkpoint path naming a file marked immutable (or append-only) was
    found only at the first checkpoint, after the steps before it, with the system's "Operation not permitted".
    Now one ValueError before any step (``no_training``)."""
    path = tmp_path / "run.ckpt"
    path.write_bytes(b"")
    _chattr(flag, path)
    try:
        with pytest.raises(ValueError, match=rf"checkpoint_path .*run\.ckpt: the file there cannot be replaced \(it "
                                             rf"is marked {kind}, as lsattr shows\); name another path"):
            GPClassifier(n_inducing=5, max_iter=4, checkpoint_path=path, checkpoint_every=2).fit(*banana)
    finally:
        subprocess.run(["chattr", flag.replace("+", "-"), str(path)])
    assert checkpoints.check_writable(path) == str(path)  # (the flag removed)


@posix_only
def test_another_users_file_in_a_sticky_directory_is_refused_before_training(tmp_path, banana, monkeypatch,
                                                                            no_training):
    """In a sticky directory (/tmp) only a file's owner (or the directory's) may rename over it: another user's
    checkpoint or model file there was found only at the first write. The test is this process as another user
    (its effective uid pretended), the file and the directory the real user's."""
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o1777)
    path = folder / "run.ckpt"
    path.write_bytes(b"")
    monkeypatch.setattr(checkpoints.os, "geteuid", lambda: os.stat(path).st_uid + 4242)
    with pytest.raises(ValueError, match=r"the file there cannot be replaced \(it is another user's, in .*shared, "
                                         r"where only a file's owner may replace it: a sticky directory, as /tmp\)"):
        GPClassifier(n_inducing=5, max_iter=4, checkpoint_path=path, checkpoint_every=2).fit(*banana)
    with pytest.raises(ValueError, match="the file there cannot be replaced"):
        checkpoints.check_writable(path)
    folder.chmod(0o777)  # (not sticky: any user who may write in it may replace the file)
    assert checkpoints.check_writable(path) == str(path)
