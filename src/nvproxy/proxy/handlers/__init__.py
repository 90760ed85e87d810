"""Handlers by API area (see dispatch.py for their shape)."""
