"""The ``dp.*`` and ``secagg.*`` config keys (declared by the built-in plugins ``dp`` and
``secagg``, so they are set, checked and saved like any plugin's options)."""

from __future__ import annotations

from fedkit_core.contract.channels import CLIENT, NONE, SAMPLE
from fedkit_core.contract.options import Option

#: dp.grad_sample values: how DP-SGD clips each sample's gradient
AUTO, GHOST, HOOKS = "auto", "ghost", "hooks"

DP_OPTIONS = (
    Option(
        "level",
        str,
        NONE,
        "differential privacy: none; client (DP-FedAvg: each client's update clipped, "
        "Gaussian noise on their sum, protects a whole client); sample (DP-SGD on each "
        "client through Opacus, protects each training sample)",
        choices=(NONE, CLIENT, SAMPLE),
    ),
    Option(
        "noise_multiplier",
        float,
        1.0,
        "noise std over the clipping norm (ignored when dp.target_epsilon calibrates it)",
        min=0,
    ),
    Option(
        "clip",
        float,
        1.0,
        "clipping norm C: of each client's update (client), of each sample's gradient (sample); "
        "the initial norm with dp.clipping=adaptive",
        gt=0,
    ),
    Option(
        "clipping",
        str,
        "fixed",
        "client level: fixed norm, or adaptive (Andrew et al. 2021: the norm follows a "
        "quantile of the update norms, estimated with noise)",
        choices=("fixed", "adaptive"),
    ),
    Option(
        "target_quantile",
        float,
        0.5,
        "adaptive clipping: the quantile of update norms",
        min=0,
        max=1,
    ),
    Option("clip_lr", float, 0.2, "adaptive clipping: the norm's geometric learning rate", min=0),
    Option(
        "count_noise",
        float,
        None,
        "adaptive clipping: noise std of the count of unclipped updates (default: expected "
        "clients / 20 as the paper, at least the noise multiplier)",
        gt=0,
    ),
    Option("delta", float, 1e-5, "the delta of the (epsilon, delta) guarantee", min=0, max=1),
    Option(
        "target_epsilon",
        float,
        None,
        "the privacy budget: calibrate the noise to spend it in `rounds` rounds, or stop when "
        "it is spent (dp.on_target)",
        gt=0,
    ),
    Option(
        "on_target",
        str,
        "calibrate",
        "with dp.target_epsilon: calibrate (choose the noise multiplier before training) or "
        "stop (keep dp.noise_multiplier; the run ends with the last round the budget pays for)",
        choices=("calibrate", "stop"),
    ),
    Option(
        "sampling",
        str,
        "poisson",
        "client level, with sample_fraction < 1: poisson (each client joins a round with "
        "probability sample_fraction; add/remove-one guarantee) or fixed (exactly "
        "round(sample_fraction * clients) clients; replace-one guarantee)",
        choices=("poisson", "fixed"),
    ),
    Option(
        "accountant",
        str,
        "rdp",
        "the accountant of dp-accounting: rdp (Renyi DP) or pld (privacy loss distributions, "
        "tighter, slower)",
        choices=("rdp", "pld"),
    ),
    Option(
        "grad_sample",
        str,
        AUTO,
        "sample level: how each sample's gradient is clipped (the same bound, noise and "
        "accounting either way): ghost (Opacus ghost clipping: per-sample gradient norms "
        "without storing per-sample gradients, then a backward pass of the clipped loss; "
        "needs each sample's loss, which fedkit has for its built-in task losses with no "
        "plugin loss terms), hooks (Opacus's per-sample gradients: any loss of the model's "
        "outputs; a term on the parameters themselves is refused), or auto (ghost "
        "where it applies, else hooks, with a note)",
        choices=(AUTO, GHOST, HOOKS),
    ),
    Option(
        "reproducible_noise",
        bool,
        False,
        "TESTS ONLY, NOT PRIVATE: draw the DP noise and sampling from the run's seed (recorded "
        "in the run's files, so anyone who reads them can remove the noise) instead of a "
        "secret seed from os.urandom; results.json and the console say NOT PRIVATE",
    ),
    Option(
        "batchnorm",
        str,
        "replace",
        "sample level: batch norm mixes samples, which DP-SGD cannot clip one by one: "
        "replace it by group norm (Opacus's ModuleValidator.fix, on every party) or refuse",
        choices=("replace", "refuse"),
    ),
)

SECAGG_OPTIONS = (
    Option(
        "enabled",
        bool,
        False,
        "secure aggregation (engine=flower: Flower's SecAgg+ workflow and mod): the server "
        "sees only the sum of the sampled clients' updates",
    ),
    Option(
        "shares",
        float,
        1.0,
        "SecAgg+ num_shares as a fraction of the sampled clients (each shares its keys with "
        "that many neighbours)",
        gt=0,
        max=1,
    ),
    Option(
        "threshold",
        float,
        0.5,
        "SecAgg+ reconstruction threshold as a fraction of the shares (the dropouts tolerated)",
        gt=0,
        max=1,
    ),
    Option(
        "clip_range",
        float,
        8.0,
        "SecAgg+ clipping range: each coordinate of a weighted update must lie in "
        "[-range, range] to be quantised (a client with a larger one fails with a message)",
        gt=0,
    ),
    Option(
        "max_weight",
        float,
        1000.0,
        "SecAgg+ max_weight: the largest num_examples a client may weight its update with",
        min=1,
    ),
    Option("quantization", int, 2**22, "SecAgg+ quantization range", min=2),
    Option("timeout", float, None, "seconds each SecAgg+ stage waits for replies", min=0),
)
