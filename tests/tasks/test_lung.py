"""lung-cxr: image and mask folders, Montgomery and Shenzhen naming, FedHelp's clients."""

from fedkit_core.federation import prepare
from fedkit_core.resolve import resolve_config
from fedkit_core.tasks.lung import write_fake


def test_sources_become_sites_and_unannotated_images_are_left_out(tmp_path, load):
    write_fake(tmp_path, per_source=4)
    data = load("lung-cxr", tmp_path, image_size=16)
    assert list(data.sites) == ["Montgomery", "Shenzhen"] and data.has_sites
    for splits in data.sites.values():
        train = splits["train"]
        assert train.images.shape == (4, 1, 16, 16)
        lung = train.targets.bool()
        assert (
            train.images[:, 0][lung].float().mean() > train.images[:, 0][~lung].float().mean() + 100
        )


def test_fedhelp_partition_makes_three_clients(tmp_path):
    write_fake(tmp_path, per_source=10)
    config, _ = resolve_config(
        {
            "task": {"name": "lung-cxr", "path": str(tmp_path), "image_size": 8},
            "partition.preset": "fedhelp",
        }
    )
    fed = prepare(config, None)
    sizes = [c.num_train + c.num_val + c.num_test for c in fed.infos.values()]
    assert len(sizes) == 3 and sizes[0] == sizes[1] > 4 * sizes[2] > 0
