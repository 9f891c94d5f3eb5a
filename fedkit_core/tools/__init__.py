"""Tools that read what runs wrote, outside the runtime (no engine imports them): the
membership-inference attack on a run's global model (:mod:`.attack`)."""
