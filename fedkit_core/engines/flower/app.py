"""The components of fedkit's Flower App, named in the app's ``pyproject.toml`` (written by
``fedkit flower submit`` / ``fedkit flower app``): Flower loads them on the SuperLink (the
ServerApp) and on every SuperNode (the ClientApp). fedkit and the run's plugins must be
installed there; the run's config travels in the run config (``fedkit-config``).
"""

from __future__ import annotations

from flwr.serverapp import ServerApp

from fedkit_core.engines.flower.node import make_client_app
from fedkit_core.engines.flower.serverapp import serve_deployed

server_app = ServerApp()
server_app.main()(serve_deployed)

client_app = make_client_app()
