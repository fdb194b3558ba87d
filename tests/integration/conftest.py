"""Fixtures shared by the integration modules: the session's local stack."""

from helpers.local_stack import local_stack

__all__ = ["local_stack"]
