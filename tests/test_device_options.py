"""The device options of issue 16 (``precision``, ``channels_last``, ``data_on_device``) on a
CPU: bf16 trains and evaluates, the defaults change nothing, channels-last computes the same
numbers, bad values are refused. Their speed on a GPU is measured by benchmarks/gpu_job.py."""

from copy import deepcopy
from dataclasses import replace

import pytest
import torch

from fedkit_core import run
from fedkit_core.cli import main
from fedkit_core.devices import (
    DataPlacement,
    as_float32,
    autocast_forward,
    input_layout,
    place_model,
)
from fedkit_core.federation import prepare
from fedkit_core.hooks import context
from fedkit_core.resolve import resolve_config
from fedkit_core.testing import tiny as any_device


def tiny(**overrides):
    """The tiny run on the CPU, whatever the machine has (these tests are about the CPU)."""
    return any_device(**{"device": "cpu", **overrides})


def _rounds(results):
    return [{k: v for k, v in r.items() if k != "seconds"} for r in results.rounds]


def _forward_precisions(monkeypatch) -> list[bool]:
    """Whether autocast was on in each forward pass of the client models (recorded)."""
    seen: list[bool] = []
    forward = context.autocast_forward

    def recording(fn, x, precision, device):
        def probe(x):
            seen.append(torch.is_autocast_enabled("cpu"))
            return fn(x)

        return forward(probe, x, precision, device)

    monkeypatch.setattr(context, "autocast_forward", recording)
    return seen


def test_defaults_are_fp32_contiguous_and_change_nothing(monkeypatch):
    cfg, _ = resolve_config(tiny())
    assert (cfg["precision"], cfg["channels_last"], cfg["data_on_device"]) == (
        "fp32",
        False,
        "auto",
    )
    seen = _forward_precisions(monkeypatch)
    default = run(tiny())
    assert seen and not any(seen)  # fp32: no forward pass under autocast
    explicit = run(tiny(precision="fp32", channels_last=False, data_on_device="false"))
    assert _rounds(default) == _rounds(explicit)  # bitwise: the same floats


def test_bf16_on_cpu_trains_and_evaluates_in_float32_outputs(monkeypatch, tmp_path):
    seen = _forward_precisions(monkeypatch)
    results = run(tiny(precision="bf16", checkpoint=True), out=tmp_path / "run")
    assert seen and all(seen)  # every forward pass of training and evaluation autocast
    first, last = (sum(c["loss"] for c in r["train"].values()) for r in results.rounds)
    assert last < first  # it learns
    assert results.rounds[-1]["global"]["acc"] > 0.4  # 4 classes: chance is 0.25
    saved = [p for p in (tmp_path / "run").rglob("*.pt")]
    weights = [v for p in saved for v in _tensors(torch.load(p, weights_only=False))]
    assert saved and any(v.dim() == 4 for v in weights)  # the convolutions' weights
    assert all(v.dtype == torch.float32 for v in weights if v.is_floating_point())


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)


def test_bf16_forward_returns_float32_and_fp32_is_the_plain_call():
    model = torch.nn.Linear(4, 3)
    x = torch.randn(5, 4)
    out = autocast_forward(lambda x: {"logits": model(x), "n": 1}, x, "bf16", torch.device("cpu"))
    assert out["logits"].dtype == torch.float32 and out["n"] == 1
    assert not torch.equal(out["logits"], model(x))  # computed in bfloat16
    assert torch.equal(autocast_forward(model, x, "fp32", torch.device("cpu")), model(x))
    assert as_float32([torch.ones(1, dtype=torch.bfloat16)])[0].dtype == torch.float32


def test_bf16_reaches_a_plugins_own_training_phase(monkeypatch):
    seen = _forward_precisions(monkeypatch)
    results = run(tiny(plugins=["fedrep"], precision="bf16", rounds=1))
    assert seen and all(seen)  # FedRep's head epochs (ctx.train) included
    assert results.rounds[-1]["clients_mean"]["acc"] > 0.25


def test_channels_last_gives_the_contiguous_results_up_to_rounding():
    from fedkit_core.models import build_model

    cfg, _ = resolve_config(tiny())
    fed = prepare(cfg, None)
    torch.manual_seed(0)
    plain = build_model(fed.task, "cnn")
    last = place_model(deepcopy(plain), torch.device("cpu"), True)
    x = fed.clients["site0"].normalizer(fed.clients["site0"]["train"].images[:16])
    outputs = [m(input_layout(x, m is last))["logits"] for m in (plain, last)]
    for out in outputs:
        out.square().sum().backward()
    assert torch.allclose(outputs[0], outputs[1], atol=1e-5)
    for a, b in zip(plain.parameters(), last.parameters()):
        assert torch.allclose(a.grad, b.grad, rtol=1e-4, atol=1e-5)
    # a whole run: training amplifies the rounding (Adam), the results stay close
    runs = [run(tiny(channels_last=flag)) for flag in (False, True)]
    for a, b in zip(*(r.rounds for r in runs)):
        for client, losses in a["train"].items():
            assert losses["loss"] == pytest.approx(b["train"][client]["loss"], rel=1e-3)
    a, b = (r.rounds[-1]["global"] for r in runs)
    assert a.keys() == b.keys() and a["bauc"] == pytest.approx(b["bauc"], abs=0.02)


def test_channels_last_model_uploads_contiguous_states():
    model = place_model(torch.nn.Conv2d(3, 4, 3), torch.device("cpu"), True)
    assert model.weight.is_contiguous(memory_format=torch.channels_last)
    assert not model.weight.is_contiguous()
    x = input_layout(torch.randn(2, 3, 8, 8), True)
    assert x.is_contiguous(memory_format=torch.channels_last)
    assert input_layout(torch.randn(2, 3, 4, 8, 8), True).is_contiguous()  # 3-D: untouched
    from fedkit_core.models.fedmodel import FedModel

    conv = FedModel(torch.nn.Conv2d(3, 4, 3), torch.nn.Identity(), None)
    fed = place_model(conv, torch.device("cpu"), True)
    assert all(v.is_contiguous() for v in fed.shared_state().values())


@pytest.mark.parametrize(
    "key, value", [("precision", "fp8"), ("data_on_device", "maybe"), ("channels_last", "x")]
)
def test_bad_values_exit_2_naming_the_allowed_ones(key, value, tmp_path, capsys):
    assert main(["run", "--set", f"{key}={value}", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert key in err and "Traceback" not in err
    if key == "precision":
        assert "fp32" in err and "bf16" in err


def test_data_on_device_reads_true_and_false_from_the_command_line():
    for text, value in (("true", "true"), ("false", "false"), ("auto", "auto")):
        cfg, _ = resolve_config(tiny(data_on_device=text))
        assert cfg["data_on_device"] == value
    cfg, _ = resolve_config(tiny(data_on_device=True))  # what YAML makes of `true`
    assert cfg["data_on_device"] == "true"


@pytest.mark.parametrize("setting", ["auto", "true", "false"])
def test_data_on_device_is_a_no_op_on_cpu(setting):
    cfg, plugins = resolve_config(tiny(data_on_device=setting))
    fed = prepare(cfg, plugins)
    for cid, data in fed.clients.items():
        assert fed.client_data(cid) is data
    assert fed.placement.bytes == 0 and not fed.placement.active


def test_placement_copies_each_stored_range_once():
    """The device copies, made on the CPU standing in for a GPU: clients whose splits view
    one gathered host copy share one placed copy, see the same values, and the host data
    stay as they were."""
    cfg, plugins = resolve_config(tiny(clients=6, **{"partition.kind": "iid"}))
    fed = prepare(cfg, plugins)
    placement = DataPlacement(torch.device("cpu"), "true")
    placement.active = True
    placed = {cid: placement.place(data) for cid, data in fed.clients.items()}
    splits = [s for d in fed.clients.values() for s in d.splits.values()]
    tensors = [t for s in splits for t in (s.images, s.targets)]
    data_bytes = sum(t.numel() * t.element_size() for t in tensors)
    # about one copy of the data: each byte the splits view is copied once
    copies = sum(len(c) for c in placement.copies.values())
    assert data_bytes <= placement.bytes <= data_bytes + 16 * copies  # 16: alignment
    placed_bytes = placement.bytes
    for cid, data in fed.clients.items():
        for name, split in data.splits.items():
            moved = placed[cid].splits[name]
            for old, new in ((split.images, moved.images), (split.targets, moved.targets)):
                assert torch.equal(old, new) and old.dtype == new.dtype
                if old.numel():
                    here = new.untyped_storage().data_ptr()
                    assert here != old.untyped_storage().data_ptr()
    first = next(iter(fed.clients.values()))
    again = placement.place(replace(first, id="twin"))  # the same splits: no second copy
    assert placement.bytes == placed_bytes
    assert again["train"].images.data_ptr() == placed[first.id]["train"].images.data_ptr()
    assert fed.client_data(first.id) is first  # the run's own placement: on a CPU, none


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_data_on_the_gpu_gives_the_results_of_data_copied_per_batch():
    """On a GPU: the clients' data held there (indexed by an order moved there once a pass)
    and host data copied per batch through pinned memory train the same model exactly."""
    held = run(any_device(device="cuda", data_on_device="true"))
    copied = run(any_device(device="cuda", data_on_device="false"))
    assert _rounds(held) == _rounds(copied)
