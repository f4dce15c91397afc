"""The numba kernel cache is cleared when any source file of the kernel package changes
(numba itself only checks the file that defines each kernel)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("numba")

import tiltlab._cpu_kernels as kernels  # noqa: E402
from tiltlab._cpu_kernels import _cache  # noqa: E402


@pytest.fixture
def package(tmp_path):
    src = Path(kernels.__file__).parent
    dst = tmp_path / "pkg"
    dst.mkdir()
    for path in src.glob("*.py"):
        shutil.copy(path, dst / path.name)
    (dst / "__pycache__").mkdir()
    return dst


def _fake_cache(folder):
    files = [
        folder / "__pycache__" / n for n in ("_scalar.vg-1.py311.nbi", "_scalar.vg-1.py311.1.nbc")
    ]
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
    assert (package / "__pycache__" / _cache.STAMP).is_file()
