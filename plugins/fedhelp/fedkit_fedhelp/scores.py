"""The contribution scores ``a_m`` each small client learned, read from a finished run's
client checkpoints (the scores never leave their clients during the run).

    python -m fedkit_fedhelp.scores RUN_DIR [RUN_DIR ...]

Per client (its newest snapshot): the mean ``a_m`` of each API over the public samples, the
share of samples whose scores moved more than 0.05 from uniform (1/M), the mean largest
``a_m`` and the largest |logit|.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from fedkit_fedhelp.plugin import SCORES

KEY = f"extras.{SCORES}.logits"
#: a sample's scores count as moved when some a_m is this far from 1/M
MOVED = 0.05


def statistics(logits: torch.Tensor) -> dict[str, float | list[float]]:
    """What the (P, M) score logits say: see the module docstring."""
    a = torch.softmax(logits.float(), dim=1)
    uniform = 1.0 / a.shape[1]
    return {
        "mean_a": [round(float(v), 4) for v in a.mean(0)],
        "moved": float(((a - uniform).abs().amax(1) > MOVED).float().mean()),
        "mean_max_a": float(a.amax(1).mean()),
        "max_abs_logit": float(logits.abs().max()),
    }


def client_scores(run_dir: Path) -> dict[str, torch.Tensor]:
    """Each client's score logits from its newest checkpoint under ``run_dir`` (clients
    without scores, the large ones, are left out)."""
    from fedkit_core.plugin import read_snapshot  # a client checkpoint, for this report

    out = {}
    for folder in sorted(Path(run_dir).glob("**/clients/*")):
        files = sorted(folder.glob("r*.pt"), key=lambda f: int(f.stem[1:]))
        if not files:
            continue
        private = read_snapshot(files[-1])["client"]["private"]
        if KEY in private:
            out[folder.name] = private[KEY]
    return out


def main(paths: list[str]) -> int:
    for path in paths:
        scores = client_scores(Path(path))
        if not scores:
            print(f"{path}: no client checkpoint with contribution scores")
            continue
        for cid, logits in scores.items():
            print(f"{path} {cid}: {statistics(logits)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
