"""Where the compiled kernels are cached (a per-user folder, never inside the package) and
how the cache is kept in step with the sources (numba itself only checks the file that
defines each kernel)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("numba")

import tiltlab  # noqa: E402
import tiltlab._cpu_kernels as kernels  # noqa: E402
from tiltlab._cpu_kernels import _cache  # noqa: E402

ROOT = Path(tiltlab.__file__).resolve().parent.parent
PACKAGE = Path(tiltlab.__file__).resolve().parent
CACHE_FILES = ("*.nbi", "*.nbc", "*" + _cache.STAMP)


@pytest.fixture
def package(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "numba-cache"))
    src = Path(kernels.__file__).parent
    dst = tmp_path / "pkg"
    dst.mkdir()
    for path in src.glob("*.py"):
        shutil.copy(path, dst / path.name)
    return dst


def _fake_cache(folder):
    cache = _cache.cache_folder(folder)
    cache.mkdir(parents=True, exist_ok=True)
    files = [cache / n for n in ("_scalar.vg-1.py311.nbi", "_scalar.vg-1.py311.1.nbc")]
    for f in files:
        f.write_bytes(b"compiled")
    return files


def test_unchanged_sources_keep_the_cache(package):
    _cache.refresh_cache.__wrapped__(package)  # first sight: stamp written
    files = _fake_cache(package)
    assert _cache.refresh_cache.__wrapped__(package) is False
    assert all(f.exists() for f in files)


def test_a_changed_helper_clears_the_cache(package):
    _cache.refresh_cache.__wrapped__(package)
    files = _fake_cache(package)
    helper = package / "_vmath.py"
    helper.write_text(helper.read_text() + "\n# changed\n")
    assert _cache.refresh_cache.__wrapped__(package) is True
    assert not any(f.exists() for f in files)
    # the new fingerprint is kept: the next process keeps its fresh cache
    again = _fake_cache(package)
    assert _cache.refresh_cache.__wrapped__(package) is False
    assert all(f.exists() for f in again)


def test_fingerprint_depends_on_every_file(package):
    before = _cache.fingerprint(package)
    (package / "_rows.py").write_text("# other\n")
    assert _cache.fingerprint(package) != before


def test_missing_stamp_clears_old_kernels(package):
    files = _fake_cache(package)  # kernels from before the fingerprint existed
    assert _cache.refresh_cache.__wrapped__(package) is True
    assert not any(f.exists() for f in files)
    assert (_cache.cache_folder(package) / _cache.STAMP).is_file()


def test_kernels_cached_inside_the_package_by_older_versions_are_removed(package):
    legacy = package / "__pycache__"
    legacy.mkdir()
    files = [legacy / n for n in ("_scalar.vg-1.py311.nbi", "_scalar.vg-1.py311.1.nbc")]
    files.append(legacy / _cache.STAMP)
    for f in files:
        f.write_bytes(b"compiled")
    keep = legacy / "_scalar.cpython-311.pyc"
    keep.write_bytes(b"bytecode")
    _cache.refresh_cache.__wrapped__(package)
    assert not any(f.exists() for f in files)
    assert keep.exists()


def test_the_cache_root_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setattr("numba.core.config.CACHE_DIR", "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    if sys.platform.startswith("linux"):
        assert _cache.cache_root() == tmp_path / "xdg" / "tiltlab" / "numba"
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "given"))
    assert _cache.cache_root() == (tmp_path / "given").resolve()


def _compile_in_a_new_process(env):
    """Compile and run one cached kernel of the package in a fresh interpreter."""
    code = textwrap.dedent(
        """
        from tiltlab._cpu_kernels import _vmath
        assert _vmath.vexp(0.0) == 1.0
        """
    )
    full = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "PYTHONPATH")}
    full.update(env, PYTHONPATH=str(ROOT), NUMBA_NUM_THREADS="1")
    subprocess.run([sys.executable, "-c", code], check=True, env=full, timeout=600)


def _cache_files(folder):
    return [p for pattern in CACHE_FILES for p in Path(folder).rglob(pattern)]


def test_compiled_kernels_go_to_the_user_cache_folder_not_the_package(tmp_path):
    if not sys.platform.startswith("linux"):
        pytest.skip("the XDG location is the Linux one")
    _compile_in_a_new_process({"XDG_CACHE_HOME": str(tmp_path / "xdg"), "HOME": str(tmp_path)})
    assert _cache_files(PACKAGE) == []
    written = _cache_files(tmp_path / "xdg" / "tiltlab" / "numba")
    assert any(p.suffix == ".nbi" for p in written)
    assert any(p.name == _cache.STAMP for p in written)


@pytest.mark.slow  # a compile in a new process; the default location's runs in the push tier
def test_with_numba_cache_dir_the_stamp_is_written_where_numba_caches(tmp_path):
    from numba.core.caching import UserProvidedCacheLocator

    given = tmp_path / "given"
    _compile_in_a_new_process({"NUMBA_CACHE_DIR": str(given), "HOME": str(tmp_path)})
    # where numba itself caches a function of the package under NUMBA_CACHE_DIR
    sub = UserProvidedCacheLocator.get_suitable_cache_subpath(
        str(PACKAGE / "_cpu_kernels" / "x.py")
    )
    folder = given / sub
    assert (folder / _cache.STAMP).is_file()
    assert any(folder.glob("_vmath.*.nbi"))
    assert _cache_files(PACKAGE) == []


def test_other_functions_keep_numbas_own_locators(tmp_path, monkeypatch):
    from numba.core import caching

    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))

    before = list(caching.CompileResultCacheImpl._locator_classes)

    @_cache.jit()
    def f(x):  # pragma: no cover - compiled
        return x + 1

    assert f(1) == 2
    assert caching.CompileResultCacheImpl._locator_classes == before
    assert any(tmp_path.rglob("*.nbi"))  # cached where the package's kernels are
