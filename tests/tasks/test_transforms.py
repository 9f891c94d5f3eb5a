"""``task.transforms``: MONAI dictionary transforms from the config, seeded per client round,
with one clear error per bad spec."""

import pytest
import torch

import fedkit_core
from fedkit_core.errors import FedkitError
from fedkit_core.resolve import resolve_config
from fedkit_core.tasks import folder3d
from fedkit_core.tasks.augment import from_specs

FLIPS = [
    {"name": "RandFlipd", "prob": 0.5, "spatial_axis": 0},
    {"name": "RandRotate90d", "prob": 0.5, "spatial_axes": [1, 2]},
]


def test_the_same_seed_augments_alike_and_another_differently():
    augment = from_specs(FLIPS, segmentation=False)
    x, y = torch.arange(4 * 64, dtype=torch.float32).reshape(4, 1, 4, 4, 4), torch.arange(4)

    def run(seed: int) -> torch.Tensor:
        return augment(x, y, torch.Generator().manual_seed(seed))[0]

    assert torch.equal(run(0), run(0)) and not torch.equal(run(0), run(1))
    assert type(run(0)) is torch.Tensor  # plain, not a MONAI MetaTensor


def test_segmentation_masks_move_with_their_images():
    augment = from_specs([{"name": "RandFlipd", "prob": 1.0, "spatial_axis": 1}], True)
    x = torch.arange(16, dtype=torch.float32).reshape(1, 1, 4, 4)
    images, masks = augment(x, x[:, 0].long(), torch.Generator().manual_seed(0))
    assert torch.equal(images[:, 0].long(), masks) and torch.equal(images, x.flip(-1))


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"name": "RandFlipz"}, r"task.transforms\[0\] \(RandFlipz\): name must be a MONAI"),
        ({"name": "RandFlip"}, r"\(RandFlip\): name must be a MONAI dictionary transform"),
        ({"prob": 0.5}, r"\(no name\): name must be"),
        ({"name": "RandFlipd", "probability": 0.5}, r"\(RandFlipd\): bad arguments .*probability"),
    ],
)
def test_a_bad_spec_is_one_error_naming_it(spec, message):
    with pytest.raises(FedkitError, match=message):
        from_specs([spec], segmentation=False)


def test_the_option_takes_a_list_of_mappings_only(tmp_path):
    def resolve(transforms, **task):
        return resolve_config(
            {"task": {"name": "folder3d", "path": str(tmp_path), "transforms": transforms, **task}}
        )[0]

    assert resolve({"name": "RandFlipd"})["task.transforms"] == [{"name": "RandFlipd"}]
    with pytest.raises(FedkitError, match="task.transforms' must be a list of mappings"):
        resolve(["RandFlipd"])


@pytest.mark.slow
def test_runs_with_transforms_repeat_per_seed_and_refuse_task_augment(tmp_path):
    folder3d.write_fake(tmp_path / "data", per_class=4, shape=(8, 8, 8))
    task = {"name": "folder3d", "path": str(tmp_path / "data"), "image_size": 8}
    config = {"task": {**task, "transforms": FLIPS}, "rounds": 1, "checkpoint": False}
    first, second = (fedkit_core.run(config).final for _ in range(2))
    first.pop("wall_seconds"), second.pop("wall_seconds")
    assert first == second
    with pytest.raises(FedkitError, match="task.augment=true and task.transforms"):
        fedkit_core.run({**config, "task": {**config["task"], "augment": True}})


#: FCA's augmentation (its paper: random rotation, horizontal and vertical flips, Gaussian
#: blur), as benchmarks/results/isic2019.yaml gives it
PAPER = [
    {"name": "RandFlipd", "prob": 0.5, "spatial_axis": 0},
    {"name": "RandFlipd", "prob": 0.5, "spatial_axis": 1},
    {"name": "RandRotated", "prob": 1.0, "range_x": 3.1416, "padding_mode": "zeros"},
    {"name": "RandGaussianSmoothd", "prob": 0.5, "sigma_x": [0.1, 1.0], "sigma_y": [0.1, 1.0]},
]


def test_the_file_tasks_with_task_augment_take_transforms_too(tmp_path):
    """Fed-ISIC2019 (and every file task with task.augment) takes task.transforms: the
    augmentation a paper states (FCA's rotation by any angle and blur), beyond flips."""
    import importlib

    from fedkit_core.tasks import isic

    isic.write_fake(tmp_path / "isic", per_centre=4)
    task = {"name": "isic2019", "path": str(tmp_path / "isic"), "image_size": 32}
    config = resolve_config({"task": {**task, "cache": False, "transforms": PAPER}})[0]
    data = isic.load(config)
    assert data.augment is not None
    x = torch.rand(4, 3, 32, 32)
    out, _ = data.augment(x, torch.zeros(4, dtype=torch.long), torch.Generator().manual_seed(0))
    assert out.shape == x.shape and not torch.equal(out, x)
    for name in ("fundus", "prostate", "ixi", "rsna", "lung", "classfolders"):
        module = importlib.import_module(f"fedkit_core.tasks.{name}")
        options = module.SPEC.options if hasattr(module, "SPEC") else module.OPTIONS
        assert "transforms" in {o.name for o in options}, name
