"""The task cache: reuse, invalidation, read-only data folders, damaged entries."""

import os
import stat

import pytest
import torch

from fedkit_core.contract.data import CLASSIFICATION, Split, TaskData
from fedkit_core.tasks import cache
from fedkit_core.tasks.files import DataWarning


def make_data() -> TaskData:
    split = Split(
        torch.arange(2 * 3 * 4 * 4, dtype=torch.uint8).view(2, 3, 4, 4), torch.tensor([0, 1])
    )
    return TaskData(
        kind=CLASSIFICATION,
        class_names=["a", "b"],
        sites={"s1": {"train": split}},
        has_sites=False,
        shot_groups={"head": [0], "medium": [], "tail": [1]},
    )


@pytest.fixture
def data_dir(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "x.png").write_bytes(b"12345")
    return folder


def counting_build():
    calls = []

    def build():
        calls.append(1)
        return make_data()

    return build, calls


def test_second_load_reads_the_cache_from_the_user_cache(data_dir, private_cache):
    build, calls = counting_build()
    first = cache.cached("t", 1, data_dir, [data_dir / "x.png"], {"size": 4}, build)
    second = cache.cached("t", 1, data_dir, [data_dir / "x.png"], {"size": 4}, build)
    assert len(calls) == 1
    assert list((private_cache / "tasks").glob("t-*.pt"))
    assert not (data_dir / cache.DATA_CACHE_DIR).exists()  # the data folder is not written
    assert torch.equal(first.sites["s1"]["train"].images, second.sites["s1"]["train"].images)
    assert torch.equal(second.sites["s1"]["train"].targets, torch.tensor([0, 1]))
    assert second.sites["s1"]["train"].targets.dtype == torch.int64  # stored as uint8
    assert (second.class_names, second.has_sites) == (["a", "b"], False)
    assert second.shot_groups == {"head": [0], "medium": [], "tail": [1]}
    assert second.normalizer == first.normalizer and first.normalizer is not None


def test_changed_files_options_or_version_rebuild(data_dir):
    build, calls = counting_build()
    files = [data_dir / "x.png"]
    cache.cached("t", 1, data_dir, files, {"size": 4}, build)
    cache.cached("t", 1, data_dir, files, {"size": 8}, build)
    cache.cached("t", 2, data_dir, files, {"size": 4}, build)
    (data_dir / "x.png").write_bytes(b"123456")  # size (and mtime) change
    cache.cached("t", 1, data_dir, files, {"size": 4}, build)
    assert len(calls) == 4
    cache.cached("t", 1, data_dir, files, {"size": 4}, build)
    assert len(calls) == 4


def test_read_only_data_folder_uses_the_user_cache(data_dir, private_cache):
    build, calls = counting_build()
    data_dir.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP)
    try:
        cache.cached("t", 1, data_dir, [data_dir / "x.png"], {}, build, "data")
        cache.cached("t", 1, data_dir, [data_dir / "x.png"], {}, build, "data")
        assert not (data_dir / cache.DATA_CACHE_DIR).exists()  # untouched, even for root
    finally:
        data_dir.chmod(0o755)
    assert len(calls) == 1
    assert list((private_cache / "tasks").glob("t-*.pt"))


def test_damaged_entry_is_rebuilt_with_a_warning(data_dir):
    build, calls = counting_build()
    cache.cached("t", 1, data_dir, [data_dir / "x.png"], {}, build, "data")
    (entry,) = (data_dir / cache.DATA_CACHE_DIR).glob("t-*.pt")
    entry.write_bytes(b"not a torch file")
    with pytest.warns(DataWarning, match="unreadable cache entry"):
        data = cache.cached("t", 1, data_dir, [data_dir / "x.png"], {}, build, "data")
    assert len(calls) == 2 and data.num_classes == 2


def test_disabled_cache_always_builds(data_dir, private_cache):
    build, calls = counting_build()
    for _ in range(2):
        cache.cached("t", 1, data_dir, [data_dir / "x.png"], {}, build, "off")
    assert len(calls) == 2
    assert not (data_dir / cache.DATA_CACHE_DIR).exists()
    assert not (private_cache / "tasks").exists()


def test_user_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("FEDKIT_CACHE", str(tmp_path / "c"))
    assert cache.user_cache_dir() == tmp_path / "c"
    monkeypatch.delenv("FEDKIT_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.user_cache_dir() == tmp_path / "xdg" / "fedkit"
    assert os.fspath(cache.cache_dirs(tmp_path)[-1]).endswith("fedkit/tasks")


def test_a_failing_cache_write_warns_and_the_run_goes_on(data_dir, monkeypatch):
    def full_disk(path, obj, mode):  # what torch.save raises when the disk fills up
        raise RuntimeError("[enforce fail at inline_container.cc] . unexpected pos 64")

    monkeypatch.setattr(cache, "write_torch", full_disk)
    build, calls = counting_build()
    with pytest.warns(DataWarning, match="could not write the task cache"):
        data = cache.cached("t", 1, data_dir, [data_dir / "x.png"], {}, build)
    assert len(data.sites["s1"]["train"]) == 2


def test_cache_entries_are_readable_by_the_group(data_dir):
    build, _ = counting_build()
    old = os.umask(0o022)
    try:
        cache.cached("t", 1, data_dir, [data_dir / "x.png"], {}, build, "data")
    finally:
        os.umask(old)
    (entry,) = (data_dir / cache.DATA_CACHE_DIR).glob("t-*.pt")
    assert entry.stat().st_mode & 0o044 == 0o044


@pytest.mark.parametrize("where", ["user", "data"])
def test_cache_entries_keep_the_data_folders_restrictions(data_dir, private_cache, where):
    data_dir.chmod(0o700)  # only its owner may read the data: nor may others read the cache
    build, _ = counting_build()
    cache.cached("t", 1, data_dir, [data_dir / "x.png"], {}, build, where)
    folder = data_dir / cache.DATA_CACHE_DIR if where == "data" else private_cache / "tasks"
    (entry,) = folder.glob("t-*.pt")
    assert stat.S_IMODE(entry.stat().st_mode) & 0o077 == 0


def test_a_file_rewritten_with_the_same_size_and_mtime_rebuilds(data_dir):
    """``cp -p``/``rsync -t`` keep a rewritten file's size and mtime: the key is its bytes."""
    build, calls = counting_build()
    path = data_dir / "x.png"
    cache.cached("t", 1, data_dir, [path], {}, build)
    before = path.stat()
    path.write_bytes(b"54321")  # another class's pixels, the same size
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    cache.cached("t", 1, data_dir, [path], {}, build)
    assert len(calls) == 2
    cache.cached("t", 1, data_dir, [path], {}, build)
    assert len(calls) == 2  # unchanged since: the entry (and the file's digest) reused


def test_file_digests_are_read_once_and_rechecked_by_their_stamp(tmp_path, monkeypatch):
    from fedkit_core.tasks import digests

    files = [tmp_path / f"{k}.png" for k in range(3)]
    for k, path in enumerate(files):
        path.write_bytes(bytes([k]) * 10)
    memo = tmp_path / "memo" / "files.json"
    first = digests.file_digests(files, memo)
    read = []
    monkeypatch.setattr(digests, "digest_file", lambda p: read.append(p) or "x")
    assert digests.file_digests(files, memo) == first and read == []
    files[1].write_bytes(bytes([9]) * 10)
    assert digests.file_digests(files, memo)[str(files[1])] == "x" and read == [files[1]]
