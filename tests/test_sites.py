"""Site profiles: units, rules that give each client a profile, clear errors, and the
shipped examples (examples/sites/), read through a run's config."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fedkit_core.errors import FedkitError
from fedkit_core.resolve import resolve_config
from fedkit_core.sites import bandwidth, duration, load_sites, parse_sites
from fedkit_core.testing import REPO_ROOT, tiny

EXAMPLES = sorted((REPO_ROOT / "examples" / "sites").glob("*.yaml"))


def test_durations_and_bandwidths_read_their_units():
    assert duration("300 ms", "x") == pytest.approx(0.3)
    assert duration("10 min", "x") == 600
    assert duration("2.5 h", "x") == 9000
    assert duration(42, "x") == 42
    assert bandwidth("20 Mbit/s", "x") == pytest.approx(2.5e6)
    assert bandwidth("2.5 MB/s", "x") == pytest.approx(2.5e6)
    assert bandwidth("1 Gbps", "x") == pytest.approx(1.25e8)
    assert bandwidth(1000, "x") == 1000
    with pytest.raises(FedkitError, match="not a bandwidth"):
        bandwidth("20 Mbits", "profiles.a.download")
    with pytest.raises(FedkitError, match="not a duration"):
        duration("soon", "profiles.a.latency")
    with pytest.raises(FedkitError, match="not a duration above 0"):
        duration(0, "repair")


def spec(**clients_and_more):
    return {
        "base": {"samples_per_second": 200},
        "profiles": {
            "fast": {"compute": "2x", "download": "100 Mbit/s", "latency": "10 ms"},
            "slow": {"compute": 20, "upload": "1 MB/s"},
        },
        **clients_and_more,
    }


def test_a_profile_reads_factors_of_the_base_and_fills_defaults():
    sites = parse_sites(spec(clients=[{"profile": "fast"}]))
    fast, slow = sites.profiles["fast"], sites.profiles["slow"]
    assert fast.samples_per_second == 400 and slow.samples_per_second == 20
    assert fast.download == pytest.approx(12.5e6) and fast.latency == pytest.approx(0.01)
    assert slow.upload == 1e6 and slow.download == pytest.approx(12.5e6)  # the default
    assert slow.latency == pytest.approx(0.02) and slow.availability.always_up


def test_rules_give_each_client_the_first_profile_that_takes_it():
    ids = [f"site{k}" for k in range(6)] + ["lab"]
    sites = parse_sites(
        spec(
            clients=[
                {"index": 0, "profile": "fast"},
                {"match": "site[45]", "profile": "slow"},
                {"match": "lab", "profile": {"compute": 5}},
                {"profile": "fast"},
            ]
        )
    )
    got = {cid: p.name for cid, p in sites.assign(ids, seed=0).items()}
    assert got["site0"] == got["site1"] == got["site3"] == "fast"
    assert got["site4"] == got["site5"] == "slow"
    assert sites.assign(ids, 0)["lab"].samples_per_second == 5


def test_a_share_rule_draws_the_same_clients_for_a_seed():
    ids = [f"c{k}" for k in range(100)]
    sites = parse_sites(spec(clients=[{"share": 0.25, "profile": "slow"}, {"profile": "fast"}]))
    first = {c for c, p in sites.assign(ids, seed=3).items() if p.name == "slow"}
    assert len(first) == 25
    assert first == {c for c, p in sites.assign(ids, seed=3).items() if p.name == "slow"}
    assert first != {c for c, p in sites.assign(ids, seed=4).items() if p.name == "slow"}


def test_a_mapping_of_clients_is_read_as_rules_integer_keys_as_positions():
    canonical = load_sites(spec(clients={1: "slow", "site*": "fast"}))
    assert canonical["clients"] == [
        {"index": 1, "profile": "slow"},
        {"match": "site*", "profile": "fast"},
    ]
    got = parse_sites(canonical).assign(["site0", "site1"], 0)
    assert (got["site0"].name, got["site1"].name) == ("fast", "slow")


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"clients": [{"profile": "fastt"}]}, "Did you mean 'fast'"),
        ({"clients": [{"match": "x*", "profile": "fast"}]}, "no rule of `clients` gives client"),
        ({"clients": [{"profile": "fast", "shares": 1}]}, "unknown key 'shares'"),
        ({"clients": [{"index": 0, "share": 0.5, "profile": "fast"}]}, "use one of match"),
        ({"clients": [{"share": 1.5, "profile": "fast"}]}, r"share must be in \(0, 1\]"),
        ({"profiles": {"a": {"compute": "fast"}}}, "not a training speed"),
        ({"profiles": {"a": {"availability": {"failures_per_day": 3}}}}, "needs `repair`"),
        ({"profiles": {"a": {"availability": {"down": [[60, 30]]}}}}, "ends before it starts"),
        ({"profiles": {"a": {"speed": 3}}}, "unknown key 'speed'"),
    ],
)
def test_bad_site_profiles_are_clear_errors(bad, message):
    with pytest.raises(FedkitError, match=message):
        parse_sites(spec(**bad)).assign(["site0", "site1"], 0)


def test_availability_joins_merges_and_draws_failures():
    sites = parse_sites(
        {
            "profiles": {
                "a": {
                    "availability": {
                        "join": "10 min",
                        "down": [["5 min", "20 min"], [3600, 3700]],
                        "failures_per_hour": 2,
                        "repair": "5 min",
                    }
                }
            }
        }
    )
    availability = sites.profiles["a"].availability
    assert availability.down == ((0.0, 1200.0), (3600.0, 3700.0))
    assert availability.failure_rate == pytest.approx(2 / 3600) and availability.repair == 300


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_the_shipped_profiles_load_and_cover_any_number_of_clients(path):
    sites = parse_sites(load_sites(str(path)))
    for n in (1, 4, 10_000):
        ids = [f"c{k}" for k in range(n)]
        assert set(sites.assign(ids, seed=0)) == set(ids)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_the_commands_in_the_site_files_name_tasks_that_exist(path):
    from fedkit_core.tasks.registry import all_tasks

    header = "\n".join(line for line in path.read_text().splitlines() if line.startswith("#"))
    named = re.findall(r"--task (\S+)", header)
    assert all(name in all_tasks() for name in named), named


def test_the_rural_profiles_ship():
    assert (REPO_ROOT / "examples" / "sites" / "rural.yaml") in EXAMPLES


def test_a_runs_config_keeps_the_profiles_not_the_path(tmp_path: Path):
    path = REPO_ROOT / "examples" / "sites" / "straggler.yaml"
    cfg, _ = resolve_config([tiny(), {"sites": str(path)}])
    assert cfg["sites"]["profiles"]["straggler"]["compute"] == "0.1x"
    # a YAML config naming its profiles file by a path relative to itself
    (tmp_path / "profiles.yaml").write_text(path.read_text())
    (tmp_path / "run.yaml").write_text("sites: profiles.yaml\n")
    cfg, _ = resolve_config([tiny(), tmp_path / "run.yaml"])
    assert cfg["sites"] == load_sites(str(path))
    with pytest.raises(FedkitError, match="site profiles file not found"):
        resolve_config([tiny(), {"sites": "nowhere.yaml"}])
