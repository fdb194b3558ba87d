"""What the tests share: sample inputs, the fake transport, fixtures that start real
servers, load and fault tools. Importable as ``helpers`` (tests/conftest.py puts tests/ on
the path); nothing here is collected as a test."""
