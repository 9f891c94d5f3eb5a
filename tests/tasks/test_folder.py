"""The ``folder`` task: sites, optional split folders, class sets, formats and layout errors."""

from pathlib import Path

import numpy as np
import pytest

import fedkit_core
from fedkit_core.errors import FedkitError
from fedkit_core.federation import prepare
from fedkit_core.resolve import resolve_config
from fedkit_core.tasks import cache, classfolders, fakes, folder, pneumonia
from fedkit_core.tasks.files import DataWarning
from fedkit_core.testing import shared_data

HOSPITALS = ("hospital-a", "hospital-b", "hospital-c")


def labels_match_pixels(split) -> bool:
    """The fakes encode each image's label in its grey level: 40 + 20 * label."""
    means = split.images.float().mean(dim=(1, 2, 3))
    return bool(((means - 40 - 20 * split.targets).abs() < 6).all())


def write_hospitals(root: Path, per_class: int = 20) -> Path:
    """Three hospitals x two classes of real PneumoniaMNIST chest X-rays as PNG files."""
    npz = np.load(shared_data("medmnist", "pneumoniamnist.npz"))
    images, labels = npz["train_images"], npz["train_labels"].reshape(-1)
    names = ("normal", "pneumonia")
    for label, name in enumerate(names):
        members = np.flatnonzero(labels == label)[: per_class * len(HOSPITALS)]
        for k, index in enumerate(members):
            site = HOSPITALS[k % len(HOSPITALS)]
            fakes.save_image(images[index], root / site / name / f"{index}.png")
    return root


@pytest.mark.slow
def test_three_hospitals_of_real_pngs_run_as_three_clients(tmp_path):
    root = write_hospitals(tmp_path / "xray")
    config = {
        "task": {"name": "folder", "path": str(root), "image_size": 28},
        "rounds": 1,
        "batch_size": 16,
        "checkpoint": False,
    }
    results = fedkit_core.run(config)
    assert results["task"]["client_ids"] == list(HOSPITALS)
    assert results["task"]["class_names"] == ["normal", "pneumonia"]
    assert results["task"]["in_channels"] == 1  # grey PNGs: detected
    assert set(results.final["clients"]) == set(HOSPITALS)
    assert 0.0 <= results.final["global"]["bacc"] <= 1.0
    assert not (root / cache.DATA_CACHE_DIR).exists()  # the data folder is not written to


def test_split_folders_are_used_and_missing_ones_carved(tmp_path, load):
    folder.write_fake(tmp_path, sites=("a",), per_class=2, splits=("train", "test"))
    folder.write_fake(tmp_path, sites=("b",), per_class=5)  # no split folders
    data = load("folder", tmp_path, image_size=8)
    assert data.has_sites and list(data.sites) == ["a", "b"]
    assert {k: len(v) for k, v in data.sites["a"].items()} == {"train": 4, "test": 4}
    assert {k: len(v) for k, v in data.sites["b"].items()} == {"train": 10}
    assert all(labels_match_pixels(s) for site in data.sites.values() for s in site.values())
    config, _ = resolve_config({"task": {"name": "folder", "path": str(tmp_path), "image_size": 8}})
    fed = prepare(config, None)
    assert list(fed.clients) == ["a", "b"]
    assert fed.infos["a"].num_test == 4 and fed.infos["b"].num_test == 2  # 0.2 of b's 10


def test_a_root_of_class_folders_is_one_site_for_the_partitioners(tmp_path, load):
    folder.write_fake(tmp_path, sites=("",), classes=("x", "y", "z"), per_class=4)
    data = load("folder", tmp_path, image_size=8)
    assert not data.has_sites and list(data.sites) == ["all"]
    assert data.class_names == ["x", "y", "z"] and labels_match_pixels(data.sites["all"]["train"])
    config, _ = resolve_config(
        {"task": {"name": "folder", "path": str(tmp_path), "image_size": 8}, "clients": 2}
    )
    assert len(prepare(config, None).clients) == 2  # iid by default


def test_sites_with_different_class_sets_share_the_union(tmp_path, load):
    folder.write_fake(tmp_path, sites=("a",), classes=("cyst", "normal"))
    folder.write_fake(tmp_path, sites=("b",), classes=("normal", "tumour"))
    data = load("folder", tmp_path, image_size=8)
    assert data.class_names == ["cyst", "normal", "tumour"]
    assert sorted(set(data.sites["a"]["train"].targets.tolist())) == [0, 1]
    assert sorted(set(data.sites["b"]["train"].targets.tolist())) == [1, 2]


def test_colour_is_detected_and_channels_can_be_forced(tmp_path, load):
    folder.write_fake(tmp_path / "rgb", sites=("a", "b"), channels=3, suffix=".jpg")
    assert load("folder", tmp_path / "rgb", image_size=8).sample_split().images.shape[1] == 3
    grey = load("folder", tmp_path / "rgb", image_size=8, channels=1)
    assert grey.sample_split().images.shape[1] == 1
    folder.write_fake(tmp_path / "bmp", sites=("a", "b"), suffix=".bmp")
    folder.write_fake(tmp_path / "bmp", sites=("c",), suffix=".tif")
    data = load("folder", tmp_path / "bmp", image_size=8)
    assert data.sample_split().images.shape[1] == 1 and len(data.sites) == 3


def test_non_image_files_and_stray_folders_are_skipped_with_a_warning(tmp_path, load):
    folder.write_fake(tmp_path, sites=("a", "b"))
    (tmp_path / "a" / "normal" / "notes.txt").write_text("not an image")
    (tmp_path / "a" / "normal" / ".DS_Store").write_bytes(b"\0")  # hidden: silent
    (tmp_path / "docs").mkdir()
    with pytest.warns(DataWarning) as caught:
        data = load("folder", tmp_path, image_size=8)
    messages = " ".join(str(w.message) for w in caught)
    assert "notes.txt" in messages and "[docs]" in messages and ".DS_Store" not in messages
    assert list(data.sites) == ["a", "b"] and len(data.sites["a"]["train"]) == 6


def test_a_stray_image_in_a_site_folder_does_not_make_the_sites_classes(tmp_path, load):
    folder.write_fake(tmp_path, sites=HOSPITALS)
    fakes.save_image(np.zeros((8, 8), np.uint8), tmp_path / "hospital-b" / "stray.png")
    with pytest.warns(DataWarning, match=r"hospital-b: skipped 1 file.s. .*stray\.png"):
        data = load("folder", tmp_path, image_size=8)
    assert list(data.sites) == list(HOSPITALS) and data.class_names == ["normal", "pneumonia"]


def test_an_image_file_that_is_not_an_image_is_named(tmp_path, load):
    folder.write_fake(tmp_path, sites=("a", "b"))
    (tmp_path / "b" / "pneumonia" / "broken.png").write_bytes(b"not a png")
    with pytest.raises(FedkitError, match=r"cannot read .*broken\.png as an image"):
        load("folder", tmp_path, image_size=8)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda root: root.mkdir(), "found no folders of images"),
        (lambda root: (root / "a" / "x").mkdir(parents=True), "found no folders of images"),
        (
            lambda root: folder.write_fake(root, sites=("a", "b"), classes=("only",)),
            r"found only the class folders \['only'\]",
        ),
        (
            lambda root: folder.write_fake(root, sites=("a",), splits=("val", "test")),
            "without a train folder",
        ),
    ],
)
def test_layout_errors_name_the_problem_and_the_layout(tmp_path, load, make, message):
    root = tmp_path / "data"
    make(root)
    with pytest.raises(FedkitError, match=message) as err:
        load("folder", root, image_size=8)
    assert "Expected layout: <task.path>/<site>/" in str(err.value)


def test_a_file_as_task_path_is_refused(tmp_path, load):
    (tmp_path / "x.png").write_bytes(b"")
    with pytest.raises(FedkitError, match="not a folder"):
        load("folder", tmp_path / "x.png")


def test_a_zoo_task_on_several_hospitals_warns_that_it_reads_one(tmp_path, load):
    """The issue: ``--task pneumonia-cxr`` on three hospitals silently used one."""
    for hospital in HOSPITALS:
        classes = pneumonia.LAYOUT.classes
        classfolders.write_fake_folders(tmp_path / hospital, classes, 2, ("train", "test"), 1)
    with pytest.warns(DataWarning, match=r"read only hospital-a and ignored .*--task folder"):
        data = load("pneumonia-cxr", tmp_path, image_size=8)
    assert len(data.sites["all"]["train"]) == 4


def _png_header(width: int, height: int) -> bytes:
    """A PNG of ``width`` x ``height`` grey pixels that is only its header: a few bytes
    that would decode to gigabytes (a decompression bomb)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


def test_a_decompression_bomb_is_an_input_error_with_the_limit_and_how_to_raise_it(
    tmp_path, load, monkeypatch
):
    for name in ("a", "b"):
        fakes.save_image(np.full((8, 8), 40, np.uint8), tmp_path / "d" / name / "1.png")
    (tmp_path / "d" / "a" / "bomb.png").write_bytes(_png_header(30000, 30000))
    with pytest.raises(FedkitError, match=r"bomb.png: .*more than 178,956,970 pixels.*") as err:
        load("folder", tmp_path / "d")
    assert "FEDKIT_MAX_IMAGE_PIXELS=<pixels>" in str(err.value)
    monkeypatch.setenv("FEDKIT_MAX_IMAGE_PIXELS", "100")
    with pytest.raises(FedkitError, match=r"\.png: .*more than 100 pixels"):
        load("folder", tmp_path / "d")  # the limit is the one set


def test_a_float_image_of_nan_is_refused_as_a_data_set_of_nan_is(tmp_path, load):
    from PIL import Image

    for name in ("a", "b"):
        fakes.save_image(np.full((8, 8), 40, np.uint8), tmp_path / "d" / name / "1.png")
    Image.fromarray(np.full((8, 8), np.nan, np.float32)).save(tmp_path / "d" / "a" / "nan.tif")
    with pytest.raises(FedkitError, match=r"nan.tif holds pixel values that are not finite"):
        load("folder", tmp_path / "d")
