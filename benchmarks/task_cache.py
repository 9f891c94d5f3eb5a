"""How much the task cache saves: time a task's first load (decode + resize + write the
cache) against its second (read the cache), each in a fresh process.

    python benchmarks/task_cache.py rif \
        ../shared/data/seg/site_samples/midss_fundus4_prostate6/Fundus
    python benchmarks/task_cache.py rif DIR --replicate 1060   # a full-size copy (symlinks)

``--replicate N`` builds, in a temporary folder, a tree of the same layout with N training
images per site made of symlinks to the real files (a full-sized RIF has 1060 images in
all), so that decoding costs what it costs on the real data set. Prints seconds and ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import json, sys, time
import monai.transforms  # imported before timing: both loads pay it equally
from fedkit_core.resolve import resolve_config
from fedkit_core.tasks.loading import load_task
config, _ = resolve_config({"task": json.loads(sys.argv[1])})
start = time.perf_counter()
data = load_task(config)
seconds = time.perf_counter() - start
count = sum(len(s) for splits in data.sites.values() for s in splits.values())
print(json.dumps({"seconds": seconds, "images": count}))
"""


def replicate(source: Path, target: Path, per_site: int) -> Path:
    """Symlink copies of each site's train image/mask pairs up to ``per_site`` pairs (an
    image folder's files are paired with its mask folder's in name order)."""
    for folder in sorted(source.rglob("image")):
        rel = folder.parent.relative_to(source)
        images = sorted(p for p in folder.iterdir() if p.is_file())
        masks = sorted(p for p in (folder.parent / "mask").iterdir() if p.is_file())
        for image, mask in zip(images, masks):
            for k in range(per_site // len(images) if "train" in rel.parts else 1):
                for src, kind in ((image, "image"), (mask, "mask")):
                    dst = target / rel / kind / f"{image.stem}-{k:04d}{image.suffix}"
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    dst.symlink_to(src.resolve())
    return target


def time_load(options: dict, env: dict) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(options)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task")
    parser.add_argument("path", type=Path)
    parser.add_argument("--replicate", type=int, default=0, help="training pairs per site")
    parser.add_argument("--set", nargs="*", default=[], help="task options key=value")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.path
        if args.replicate:
            per_site = max(1, args.replicate // len([p for p in path.iterdir() if p.is_dir()]))
            path = replicate(path, Path(tmp) / "data" / path.name, per_site)
        env = {**os.environ, "FEDKIT_CACHE": str(Path(tmp) / "cache")}
        root = Path(__file__).resolve().parents[1]
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
        options = {"name": args.task, "path": str(path)}
        options.update(dict(kv.split("=", 1) for kv in args.set))
        first, second = time_load(options, env), time_load(options, env)
    ratio = first["seconds"] / second["seconds"]
    print(
        f"{args.task}: {first['images']} images; first load {first['seconds']:.2f} s, "
        f"second (cached) {second['seconds']:.2f} s, {ratio:.1f}x faster"
    )


if __name__ == "__main__":
    main()
