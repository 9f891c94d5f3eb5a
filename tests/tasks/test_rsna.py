"""rsna-ich: the challenge's csv + DICOM layout, single-subtype selection, FCA's splits."""

import numpy as np
import pytest

from fedkit_core.errors import FedkitError
from fedkit_core.federation import prepare
from fedkit_core.resolve import resolve_config
from fedkit_core.tasks.rsna import SUBTYPES, dicom_hounsfield, write_fake, write_fake_dicom

pytest.importorskip("pydicom", reason="pydicom (fedkit[dicom]) reads the RSNA DICOM files")


@pytest.mark.parametrize("fmt", ["dcm", "png"])
def test_single_subtype_images_with_aligned_labels(tmp_path, load, fmt):
    write_fake(tmp_path, fmt=fmt)
    data = load("rsna-ich", tmp_path, image_size=16)
    assert data.class_names == list(SUBTYPES)
    train = data.sites["all"]["train"]
    # 3 single-subtype images per class; none-positive and two-subtype images are dropped
    assert np.bincount(train.targets.numpy()).tolist() == [3, 3, 3, 3, 3]
    assert train.images.shape == (15, 1, 16, 16)
    # the fakes hold 20 * label HU: the brain window (40/80) maps it to 255/4 * label
    means = train.images.float().mean(dim=(1, 2, 3)).numpy()
    assert np.allclose(means, 255 / 4 * train.targets.numpy(), atol=6)


def test_wrong_intercept_of_12_bit_scans_is_repaired(tmp_path):
    import pydicom

    write_fake_dicom(tmp_path / "a.dcm", np.full((4, 4), 30.0), intercept=-1024.0)
    ds = pydicom.dcmread(tmp_path / "a.dcm")
    # the challenge's faulty files: 12-bit unsigned pixels holding HU modulo 4096, intercept 0
    ds.BitsStored, ds.PixelRepresentation, ds.RescaleIntercept = 12, 0, 0
    stored = np.array([[30, 3100]] * 2, np.uint16)  # 30 HU and -996 HU (air), wrapped
    ds.Rows, ds.Columns = stored.shape
    ds.PixelData = stored.tobytes()
    ds.save_as(tmp_path / "b.dcm")
    assert np.allclose(dicom_hounsfield(tmp_path / "a.dcm"), 30.0)
    assert dicom_hounsfield(tmp_path / "b.dcm").tolist() == [[30.0, -996.0]] * 2


@pytest.mark.parametrize("preset,clients", [("split1", 5), ("split2", 10)])
def test_fca_splits_are_named_partitions(tmp_path, preset, clients):
    write_fake(tmp_path, fmt="png", size=8)
    config, _ = resolve_config(
        {"task": {"name": "rsna-ich", "path": str(tmp_path)}, "partition.preset": preset}
    )
    assert config["partition.kind"] == "class-dirichlet"
    assert config["partition.alphas"][0] == 0.5 and config["partition.alphas"][-1] == 50.0
    assert config["partition.drop_prob"] == (0.3 if preset == "split2" else 0.0)
    fed = prepare(config, None)
    assert len(fed.task.client_ids) == clients


def test_missing_label_csv(tmp_path, load):
    (tmp_path / "stage_2_train").mkdir()
    with pytest.raises(FedkitError):
        load("rsna-ich", tmp_path)
    (tmp_path / "a.csv").write_text("x,y\n1,2\n")
    with pytest.raises(FedkitError, match="expected columns ID,Label"):
        load("rsna-ich", tmp_path)


def test_wide_csv_and_png_images(tmp_path, load):
    import csv

    write_fake(tmp_path, fmt="png")
    long = tmp_path / "stage_2_train.csv"
    flags: dict[str, dict[str, str]] = {}
    with long.open() as fh:
        for row in csv.DictReader(fh):
            image, _, subtype = row["ID"].rpartition("_")
            flags.setdefault(image, {})[subtype] = row["Label"]
    long.unlink()
    with (tmp_path / "labels.csv").open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["Image", *SUBTYPES])
        writer.writerows([f"{image}.png", *(f[s] for s in SUBTYPES)] for image, f in flags.items())
    data = load("rsna-ich", tmp_path, image_size=8)
    assert np.bincount(data.sites["all"]["train"].targets.numpy()).tolist() == [3] * 5
