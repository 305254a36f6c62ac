"""Helpers shared by tests: independent readers that check what icesink wrote."""
