"""Nothing listening that should not be, nothing readable that should not be: a Flower
simulation on Ray opens no port beyond loopback, and a ``--private`` run (its folder, Ray's
temporary folder with its logs, ``fedkit compare``'s runspec folders) leaves no file or
folder that the group or others may read."""

from __future__ import annotations

import ipaddress
import os
import socket
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from fedkit_core.contract.observer import Observer
from fedkit_core.testing import tiny

pytestmark = pytest.mark.skipif(not Path("/proc/net/tcp").is_file(), reason="needs Linux /proc")


def _process_tree(root: int) -> set[int]:
    """``root`` and every process descended from it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, stack = set(), [root]
    while stack:
        pid = stack.pop()
        found.add(pid)
        stack.extend(children.get(pid, []))
    return found


def _address(hexed: str, v6: bool) -> tuple[str, int]:
    ip, port = hexed.split(":")
    raw = bytes.fromhex(ip)
    if v6:  # four host-order 32-bit words
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
        return socket.inet_ntop(socket.AF_INET6, raw), int(port, 16)
    return socket.inet_ntop(socket.AF_INET, raw[::-1]), int(port, 16)


def listening(pids: set[int]) -> set[tuple[str, int, str]]:
    """The TCP sockets the processes ``pids`` listen on: (address, port, process name),
    from /proc/net/tcp{,6} (as ``ss -ltn``) and each process's open sockets."""
    owners: dict[str, str] = {}
    for pid in pids:
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                link = os.readlink(fd)
                if link.startswith("socket:["):
                    owners[link[8:-1]] = name
        except OSError:
            continue
    out = set()
    for table, v6 in (("tcp", False), ("tcp6", True)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in owners:  # LISTEN
                out.add((*_address(fields[1], v6), owners[fields[9]]))
    return out


def loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def open_to_others(root: Path, folders: bool = True) -> list[str]:
    """Each file or folder under ``root`` (itself included) that its group or others may
    use in any way (symbolic links, whose own mode means nothing, aside); ``folders=False``:
    files only."""
    found = []
    for path in [root, *root.rglob("*")]:
        try:
            info = path.lstat()
        except FileNotFoundError:  # removed meanwhile (Ray's temporary files)
            continue
        if stat.S_ISLNK(info.st_mode) or (stat.S_ISDIR(info.st_mode) and not folders):
            continue
        if stat.S_IMODE(info.st_mode) & 0o077:
            found.append(f"{path} {stat.S_IMODE(info.st_mode):o}")
    return found


def intrude(sockets: set[tuple[str, int, str]]) -> subprocess.CompletedProcess:
    """A process without the run's token (as another local user's, which cannot read the
    run's environment) that joins the Ray instance at its GCS's loopback port. Without the
    token check it joined in 2 s (and could then run code as the run's user)."""
    port = next(port for _, port, name in sockets if name == "gcs_server")
    code = f"import ray; ray.init(address='127.0.0.1:{port}'); print('joined')"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )


class _Snapshot(Observer):
    """Looks at the machine while round 1 runs: the sockets this process's tree listens
    on, and what group or others may read in the ``folders()`` of that moment."""

    def __init__(self, folders: Callable[[], list[Path]]):
        self.folders = folders
        self.seen: list[Path] = []
        self.sockets: set[tuple[str, int, str]] = set()
        self.exposed: list[str] = []

    def on_round_end(self, record: dict) -> None:
        if record["round"] == 1:
            self.sockets = listening(_process_tree(os.getpid()))
            self.intruder = intrude(self.sockets)
            self.seen = self.folders()
            self.exposed = [p for folder in self.seen for p in open_to_others(folder)]
            self.ray_files = [p for folder in self.seen for p in open_to_others(folder, False)]
            self.listing = [p for folder in self.seen for p in folder.rglob("*")]


@pytest.mark.slow
def test_a_ray_simulation_listens_on_loopback_only_and_a_private_one_writes_private_files(
    tmp_path, monkeypatch
):
    pytest.importorskip("flwr")
    pytest.importorskip("ray")
    import tempfile

    from fedkit_core import run

    made: list[Path] = []
    mkdtemp = tempfile.mkdtemp

    def recorded(*args, **kwargs):
        made.append(Path(mkdtemp(*args, **kwargs)))
        return str(made[-1])

    monkeypatch.setattr(tempfile, "mkdtemp", recorded)
    out = tmp_path / "nested" / "run"
    ray_temp = lambda: [p for p in made if p.name.startswith("fedkit-ray-")]  # noqa: E731
    snapshot = _Snapshot(lambda: [*ray_temp(), out.parent])
    snapshot.ray_files, snapshot.listing = [], []
    before = listening(_process_tree(os.getpid()))
    config = tiny(rounds=2, engine="flower", flower={"backend": "ray"}, private=True)
    run({**config, "checkpoint": True}, out=out, observer=snapshot)
    new = snapshot.sockets - before
    assert new, "nothing listened: the test saw no Ray"
    assert {s for s in new if not loopback(s[0])} == set()
    # on loopback, a local process without the run's token cannot join (it could run code)
    assert snapshot.intruder.returncode != 0 and "joined" not in snapshot.intruder.stdout
    ray_folder, _ = snapshot.seen  # Ray's temporary folder was looked at, while running:
    logs = [p for p in snapshot.listing if p.parent.name == "logs" and p.is_relative_to(ray_folder)]
    assert logs
    assert snapshot.ray_files == []  # Ray's logs and sockets, the run's files
    # no folder is open but Ray's own (it makes them 0777) inside the 0700 one around them
    assert [p for p in snapshot.exposed if not p.startswith(f"{ray_folder}/ray")] == []
    assert open_to_others(out.parent) == []  # and once it is done (figures, results)
    assert not any(p.exists() for p in ray_temp())  # removed with the run


def test_a_private_run_makes_its_missing_folders_private(tmp_path):
    from fedkit_core.results.store import RunDir

    RunDir(tmp_path / "compare" / "fedavg" / "seed0").create({"private": True})
    assert open_to_others(tmp_path / "compare") == []
    RunDir(tmp_path / "open" / "seed0").create({})
    assert stat.S_IMODE((tmp_path / "open").stat().st_mode) == 0o777 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.slow
def test_compare_private_leaves_no_folder_or_file_open_to_others(tmp_path):
    from fedkit_core.comparison import compare

    out = tmp_path / "compare"
    out.mkdir(mode=0o700)  # as `fedkit compare --private` makes it
    compare(["fedavg", "fedprox"], seeds=[0], out=out, base=[tiny(rounds=1, private=True)])
    assert (out / "compare.md").is_file()
    assert open_to_others(out) == []
