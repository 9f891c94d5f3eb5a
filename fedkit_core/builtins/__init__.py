"""The core's own behaviour, written as plugins on the same hooks third parties use."""
