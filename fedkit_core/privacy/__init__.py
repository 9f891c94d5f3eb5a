"""Privacy you can measure: differential privacy with accounting, secure aggregation, and
a membership-inference check (see docs/privacy.md).

* :mod:`.options`: the ``dp.*`` and ``secagg.*`` config keys;
* :mod:`.channels`: what a run sends beyond the model update, declared by plugins
  (``fedkit_channels``) and refused in private runs unless privatised;
* :mod:`.checks`: the refusals, before any data is loaded;
* :mod:`.accounting`: epsilon, calibration and budgets from Google's dp-accounting;
* :mod:`.client_level`: DP-FedAvg's clipping, noise and adaptive clipping;
* :mod:`.layer`: the server's privacy mechanism (sampling, privatised updates, accounting);
* :mod:`.rounds`: DP and SecAgg+ as wrappers around a round's strategy;
* :mod:`.sample_level`: DP-SGD on each client through Opacus (ghost clipping or stored
  per-sample gradients);
* :mod:`.bookkeeping`: ghost clipping in one backward pass on Opacus's hooks;
* :mod:`.secure`: Flower's SecAgg+ workflow and mod around fedkit's fit exchange;
* :mod:`.runspec`, :mod:`.report`: ``dp(...)`` runspecs and the privacy-utility summary of
  ``fedkit compare``;
* :mod:`.attack`: a loss-threshold membership-inference attack on a global model.
"""
