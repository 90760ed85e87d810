"""The fault suite (README.md): every kind of fault a parameter, every case checked for a clear error, nothing
lost, no hang and nothing left behind.  A package, so that tests/conftest.py stays the one `conftest` module."""
