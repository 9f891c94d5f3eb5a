"""The protocol's names: the prefixes and keys that messages between server and clients use
beyond the plugins' own (the message kinds and their contents: docs/architecture.md, "The
protocol")."""

#: prefix of the plugins' arrays in a fit message (``fedkit_configure_fit``) and in its
#: reply (``fedkit_client_report`` returning a :class:`Payload`)
PAYLOAD = "payload/"
#: prefix of a previous round's evaluation that travels with a fit message and its reply
#: (``eval_with_fit``: the scalars of the ``evaluate`` message of the global arrays the fit
#: message carries; in the reply, the evaluation's reply)
EVALUATION = "evaluate/"
#: the setup reply's array of training class counts (sent only when shot groups need them)
CLASS_COUNTS = "class_counts"
