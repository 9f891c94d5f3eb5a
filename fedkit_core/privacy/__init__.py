"""Privacy you can measure: differential privacy with accounting and the checks of a private
run (see docs/privacy.md). One layer of docs/architecture.md; what privacy touches on other
layers lives there: the channels a run may send in :mod:`fedkit_core.contract.channels`,
SecAgg+ beside the Flower engine (:mod:`fedkit_core.engines.flower.secure`), the
privacy-utility summary with the results (:mod:`fedkit_core.results.privacy`), the
membership-inference attack with the tools (:mod:`fedkit_core.tools.attack`).

* :mod:`.options`: the ``dp.*`` and ``secagg.*`` config keys, declared by the built-in
  plugins :mod:`.dp` and :mod:`.secagg`;
* :mod:`.checks`: the refusals, before any data is loaded;
* :mod:`.accounting`: epsilon, calibration and budgets from Google's dp-accounting;
* :mod:`.client_level`: DP-FedAvg's clipping, noise and adaptive clipping;
* :mod:`.noise`: the noise streams (secret, or seeded for tests);
* :mod:`.layer`: the server's privacy mechanism (sampling, privatised updates, accounting);
* :mod:`.rounds`: DP and SecAgg+ as wrappers around a round's strategy;
* :mod:`.sample_level`: DP-SGD on each client through Opacus (ghost clipping or stored
  per-sample gradients);
* :mod:`.bookkeeping`: ghost clipping in one backward pass on Opacus's hooks;
* :mod:`.runspec`: ``dp(...)`` runspecs of ``fedkit compare``.
"""
