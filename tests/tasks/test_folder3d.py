"""The ``folder3d`` task: NIfTI files and DICOM series in the ``folder`` layout, scaling,
a run through the command line, and the errors."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fedkit_core.cli import main
from fedkit_core.errors import FedkitError
from fedkit_core.models import build_backbone
from fedkit_core.tasks import folder3d
from fedkit_core.tasks.rsna import write_fake_dicom


def write_series(folder: Path, volume: np.ndarray, order: list[int] | None = None) -> Path:
    """``volume`` (slices, rows, columns) as one DICOM file per slice, the files named in
    ``order`` (default: as stacked) so that only their positions give the slice order."""
    import pydicom

    folder.mkdir(parents=True, exist_ok=True)
    for name, z in zip(order or range(len(volume)), range(len(volume))):
        path = folder / f"{name:03d}.dcm"
        write_fake_dicom(path, volume[z])
        ds = pydicom.dcmread(path)
        ds.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
        ds.ImagePositionPatient = [0.0, 0.0, 2.5 * z]
        ds.InstanceNumber = len(volume) - z  # a contradicting number: the position wins
        ds.save_as(path)
    return folder


@pytest.mark.slow
def test_two_sites_of_nifti_volumes_are_scaled_and_resized(tmp_path, load):
    folder3d.write_fake(tmp_path, per_class=6)
    data = load("folder3d", tmp_path, image_size=8)
    assert data.has_sites and list(data.sites) == ["a", "b"]
    assert data.class_names == ["healthy", "lesion"]
    train = data.sites["a"]["train"]
    assert train.images.shape == (12, 1, 8, 8, 8) and train.images.dtype == torch.float32
    assert float(train.images.min()) >= 0.0 and float(train.images.max()) <= 1.0
    centre = train.images[:, 0, 3:5, 3:5, 3:5].mean(dim=(1, 2, 3))
    assert (centre[train.targets == 1] > 0.8).all() and (centre[train.targets == 0] < 0.7).all()


def test_a_dicom_series_is_read_in_slice_position_order(tmp_path):
    volume = np.arange(4, dtype=np.float64)[:, None, None] * 10 + np.zeros((4, 6, 5))
    write_series(tmp_path / "s", volume, order=[3, 1, 0, 2])
    read = folder3d.read_dicom_series(tmp_path / "s")
    assert read.shape == (4, 6, 5) and read[:, 0, 0].tolist() == [0.0, 10.0, 20.0, 30.0]


@pytest.mark.slow
def test_dicom_series_and_nifti_files_mix_in_class_folders(tmp_path, load):
    folder3d.write_fake(tmp_path, per_class=2)
    rng = np.random.default_rng(0)
    write_series(tmp_path / "b" / "lesion" / "series-1", rng.normal(100, 10, (6, 10, 10)))
    data = load("folder3d", tmp_path, image_size=6)
    assert len(data.sites["b"]["train"]) == 5 and len(data.sites["a"]["train"]) == 4


@pytest.mark.slow
def test_a_run_through_the_command_line(tmp_path):
    folder3d.write_fake(tmp_path / "data", per_class=6)
    args = ["run", "--task", "folder3d", "--set", f"task.path={tmp_path / 'data'}"]
    args += ["--set", "task.image_size=12", "--set", "task.cache=off", "--rounds", "1"]
    assert main([*args, "--out", str(tmp_path / "run"), "-q"]) == 0


def test_a_2d_backbone_refuses_volumes_and_the_cnn_takes_them():
    with pytest.raises(FedkitError, match="model=resnet18 takes 2D images.*model=cnn"):
        build_backbone("resnet18", 1, spatial_dims=3)
    net, dim = build_backbone("cnn", 1, spatial_dims=3)
    assert net(torch.zeros(2, 1, 8, 8, 8)).shape == (2, dim)


def _broken_nifti(root: Path) -> None:
    folder3d.write_fake(root)
    (root / "b" / "lesion" / "broken.nii.gz").write_bytes(b"not a volume")


def _mixed_series(root: Path) -> None:
    folder3d.write_fake(root)
    series = write_series(root / "a" / "healthy" / "s", np.zeros((2, 6, 6)))
    write_fake_dicom(series / "odd.dcm", np.zeros((4, 4)))


@pytest.mark.slow
@pytest.mark.parametrize(
    "make, message",
    [
        (lambda root: root.mkdir(), "found no folders of volumes"),
        (lambda root: folder3d.write_fake(root, classes=("only",)), r"class folders \['only'\]"),
        (_broken_nifti, r"cannot read .*broken\.nii\.gz as a NIfTI volume"),
        (_mixed_series, r"DICOM series .*s mixes slice shapes \[\(4, 4\), \(6, 6\)\]"),
    ],
)
def test_errors_name_the_problem(tmp_path, load, make, message):
    make(tmp_path / "data")
    with pytest.raises(FedkitError, match=message):
        load("folder3d", tmp_path / "data", image_size=6, cache="off")


@pytest.mark.parametrize(
    "module, make, extra",
    [
        ("nibabel", folder3d.write_fake, "nifti"),
        (
            "pydicom",
            lambda root: write_series(root / "a" / "x" / "s", np.zeros((2, 4, 4))),
            "dicom",
        ),
    ],
)
def test_a_missing_reader_names_its_extra(tmp_path, load, monkeypatch, module, make, extra):
    make(tmp_path)
    write_series(tmp_path / "a" / "y" / "s", np.zeros((2, 4, 4)))  # a second class
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(FedkitError, match=rf"pip install 'fedkit\[{extra}\]'"):
        load("folder3d", tmp_path, image_size=4, cache="off")
