"""Helpers shared by the tests (plain functions and classes; fixtures live in conftest.py)."""
