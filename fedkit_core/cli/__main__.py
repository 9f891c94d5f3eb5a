"""``python -m fedkit_core.cli`` runs the fedkit command."""

import sys

from fedkit_core.cli import main

sys.exit(main())
