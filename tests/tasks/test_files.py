"""The shared file helpers: pairing, class-folder trees, image reading, folder search."""

import warnings

import numpy as np
import pytest
from PIL import Image

from fedkit_core.errors import FedkitError
from fedkit_core.tasks import files


def touch(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return path


def test_pairs_by_name_with_mask_endings(tmp_path):
    images = [touch(tmp_path / "i" / n) for n in ("a.png", "CHNCXR_0001_0.png", "c.png")]
    masks = [touch(tmp_path / "m" / n) for n in ("c.png", "CHNCXR_0001_0_mask.png", "a.png")]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pairs = files.pair_files(images, masks, "here")
    assert [(i.name, m.name) for i, m in pairs] == [
        ("CHNCXR_0001_0.png", "CHNCXR_0001_0_mask.png"),
        ("a.png", "a.png"),
        ("c.png", "c.png"),
    ]


def test_equal_leftovers_pair_in_order_only_in_auto(tmp_path):
    images = [touch(tmp_path / "i" / n) for n in ("00_00.png", "00_01.png")]
    masks = [touch(tmp_path / "m" / n) for n in ("00_00.png", "00_02.png")]
    with pytest.warns(files.DataWarning, match="00_01.png <-> 00_02.png"):
        pairs = files.pair_files(images, masks, "site/train", "auto")
    assert [(i.name, m.name) for i, m in pairs] == [
        ("00_00.png", "00_00.png"),
        ("00_01.png", "00_02.png"),
    ]
    with pytest.warns(files.DataWarning, match=r"skipped 1 image\(s\)"):
        strict = files.pair_files(images, masks, "site/train", "name")
    assert len(strict) == 1


def test_unequal_leftovers_are_skipped_and_named(tmp_path):
    images = [touch(tmp_path / "i" / n) for n in ("a.png", "b.png", "c.png")]
    masks = [touch(tmp_path / "m" / "a.png")]
    with pytest.warns(files.DataWarning, match=r"\[b.png, c.png\]"):
        assert len(files.pair_files(images, masks, "x")) == 1


def test_class_folders_nested_and_flat(tmp_path):
    for rel in ("upper/landmarks/z-line/1.jpg", "lower/findings/polyps/2.jpg", "polyps2/3.png"):
        touch(tmp_path / rel)
    touch(tmp_path / "notes.txt")
    found = files.class_folders(tmp_path)
    assert list(found) == ["polyps", "polyps2", "z-line"]
    assert [p.name for p in found["z-line"]] == ["1.jpg"]


def test_class_folders_refuse_duplicate_names(tmp_path):
    touch(tmp_path / "a" / "x" / "1.jpg")
    touch(tmp_path / "b" / "x" / "2.jpg")
    with pytest.raises(FedkitError, match="both named 'x'"):
        files.class_folders(tmp_path)


def test_read_image_crop_keeps_the_centre(tmp_path):
    array = np.zeros((20, 40), np.uint8)
    array[:, 10:30] = 200  # the central square of a 2:1 image
    Image.fromarray(array).save(tmp_path / "wide.png")
    cropped = files.read_image(tmp_path / "wide.png", 1, 10, fit="crop")
    stretched = files.read_image(tmp_path / "wide.png", 3, 10)
    assert cropped.shape == (1, 10, 10) and stretched.shape == (3, 10, 10)
    assert cropped.min() > 150  # only the bright centre survives the crop
    assert stretched[0, :, 0].max() < 50  # the stretched image keeps the dark sides


def test_read_sixteen_bit_images_are_scaled_not_clipped(tmp_path):
    array = np.linspace(0, 4000, 64, dtype=np.uint16).reshape(8, 8)
    Image.fromarray(array).save(tmp_path / "deep.png")
    grey = files.read_image(tmp_path / "deep.png", 1, None)
    assert grey.min() == 0 and grey.max() == 255
    assert (np.diff(grey.reshape(-1).astype(int)) >= 0).all()


def test_read_mask_resizes_by_nearest(tmp_path):
    mask = np.full((40, 40, 3), 255, np.uint8)
    mask[10:30, 10:30] = 128
    mask[18:22, 18:22] = 0
    Image.fromarray(mask).save(tmp_path / "m.png")
    assert set(np.unique(files.read_mask(tmp_path / "m.png", 13)).tolist()) <= {0, 128, 255}


def test_find_dir_descends_to_the_layout(tmp_path):
    touch(tmp_path / "unpacked" / "chest_xray" / "train" / "x.jpg")
    found = files.find_dir(tmp_path, lambda d: (d / "train").is_dir())
    assert found == tmp_path / "unpacked" / "chest_xray"
    assert files.find_dir(tmp_path, lambda d: False) is None


def test_read_mask_reads_a_palette_mask_by_its_grey_values(tmp_path):
    from PIL import Image

    indices = np.array([[0, 1], [2, 1]], dtype=np.uint8)
    palette = Image.fromarray(indices, mode="P")
    palette.putpalette([0, 0, 0, 128, 128, 128, 255, 255, 255])  # index 1 is grey 128
    palette.save(tmp_path / "p.png")
    grey = np.array([[0, 128], [255, 128]], dtype=np.uint8)
    assert np.array_equal(files.read_mask(tmp_path / "p.png", None), grey)
