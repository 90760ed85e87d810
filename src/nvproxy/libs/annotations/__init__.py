"""What the headers do not say about each library's functions (plain data, read by libs/spec.py)."""
