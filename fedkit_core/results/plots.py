"""Plots of a run (curves.png, clients.png) and of several runs side by side."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedkit_core.results.store import _atomic


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path) -> Path:
    _atomic(Path(path), lambda fh: fig.savefig(fh, format="png", dpi=120, bbox_inches="tight"))
    _pyplot().close(fig)
    return Path(path)


def plot_run(results: Mapping[str, Any], directory: Path) -> list[Path]:
    """``curves.png`` (main metric per round for global and each client; train loss) and
    ``clients.png`` (final main metric per client)."""
    plt = _pyplot()
    main = results["task"]["main_metric"]
    evaluated = [r for r in results["rounds"] if "val" in r]
    if not evaluated:
        return []
    rounds = [r["round"] for r in evaluated]
    fig, (ax, ax_loss) = plt.subplots(1, 2, figsize=(11, 4))
    clients = list(results["task"]["client_ids"])
    for cid in clients:
        ys = [r["clients"].get(cid, {}).get(main, np.nan) for r in evaluated]
        ax.plot(rounds, ys, lw=1, alpha=0.6, label=f"client {cid}")
    ax.plot(
        rounds,
        [r["clients_mean"].get(main, np.nan) for r in evaluated],
        "k--",
        lw=1.5,
        label="clients mean",
    )
    ax.plot(
        rounds,
        [r["global"].get(main, np.nan) for r in evaluated],
        "k-",
        lw=2.5,
        label="global (pooled)",
    )
    ax.set(xlabel="round", ylabel=f"test {main}", title=f"{_title(results)}: test {main}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    loss_rounds = [r["round"] for r in results["rounds"] if r.get("train")]
    losses = [
        np.mean([c["loss"] for c in r["train"].values()])
        for r in results["rounds"]
        if r.get("train")
    ]
    ax_loss.plot(loss_rounds, losses, "o-", ms=3)
    ax_loss.set(xlabel="round", ylabel="mean local training loss", title="training loss")
    ax_loss.grid(alpha=0.3)
    paths = [save_figure(fig, Path(directory) / "curves.png")]
    final = results["final"]
    fig, ax = plt.subplots(figsize=(max(4, 0.6 * len(clients) + 2), 3.6))
    values = [final["clients"].get(cid, {}).get(main, np.nan) for cid in clients]
    ax.bar(range(len(clients)), values, color="tab:blue")
    ax.set_xticks(range(len(clients)), clients, rotation=45 if len(clients) > 6 else 0, ha="right")
    if main in final.get("global", {}):
        ax.axhline(
            final["global"][main], color="k", lw=1.5, label=f"global {final['global'][main]:.3f}"
        )
    fair = final.get("fairness", {})
    title = f"final {main} per client"
    if fair:
        title += f" (std {fair['std']:.3f}, worst {fair['worst']:.3f})"
    ax.set(ylabel=main, title=title, ylim=(0, 1))
    ax.legend(fontsize=8)
    paths.append(save_figure(fig, Path(directory) / "clients.png"))
    return paths


def _title(results: Mapping[str, Any]) -> str:
    cfg = results["config"]
    name = cfg.get("name")
    if name:
        return name
    plugins = "+".join(cfg.get("plugins") or []) or "fedavg"
    return f"{plugins} on {results['task']['name']}"


def plot_runs(runs: Sequence[Mapping[str, Any]], labels: Sequence[str], path: Path) -> Path:
    """Global and clients-mean main metric per round of several runs in one figure."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for results, label in zip(runs, labels):
        main = results["task"]["main_metric"]
        evaluated = [r for r in results["rounds"] if "val" in r]
        rounds = [r["round"] for r in evaluated]
        axes[0].plot(rounds, [r["global"].get(main, np.nan) for r in evaluated], label=label)
        axes[1].plot(rounds, [r["clients_mean"].get(main, np.nan) for r in evaluated], label=label)
    axes[0].set(title="global (pooled test)", xlabel="round", ylabel=main)
    axes[1].set(title="mean over clients", xlabel="round")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save_figure(fig, path)


def plot_partition(task: Any, infos: Mapping[str, Any], path: Path) -> Path:
    """Heatmap of training samples (pixels for segmentation) per client and class, from the
    clients' own statistics (``{client id: ClientInfo}``, as a simulation holds them)."""
    plt = _pyplot()
    clients = list(infos)
    counts = np.array([infos[c].class_counts for c in clients], dtype=float)
    fig, ax = plt.subplots(
        figsize=(max(5, 0.7 * task.num_classes + 2), max(3, 0.45 * len(clients) + 1.5))
    )
    shown = counts / counts.sum(axis=1, keepdims=True) if task.kind == "segmentation" else counts
    image = ax.imshow(shown, cmap="viridis", aspect="auto")
    for i in range(len(clients)):
        for j in range(task.num_classes):
            text = f"{shown[i, j]:.2f}" if task.kind == "segmentation" else f"{int(counts[i, j])}"
            ax.text(
                j,
                i,
                text,
                ha="center",
                va="center",
                fontsize=7,
                color="white" if shown[i, j] < shown.max() / 2 else "black",
            )
    ax.set_xticks(range(task.num_classes), task.class_names, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(len(clients)), clients, fontsize=8)
    unit = "pixel share" if task.kind == "segmentation" else "training samples"
    ax.set(title=f"{task.name}: {unit} per client and class")
    fig.colorbar(image, ax=ax)
    return save_figure(fig, path)
