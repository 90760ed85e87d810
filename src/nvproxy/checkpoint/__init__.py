"""Checkpoint and restore of a proxy's GPU state: the image format (image.py),
moving memory between device and file (transfer.py), what is saved (dump.py)
and how a fresh proxy rebuilds it (restore.py)."""
