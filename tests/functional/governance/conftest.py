"""Fixtures of the governance tests; the helpers live in governance_world (a name no other tier uses)."""

from governance_world import world, world_factory

__all__ = ["world", "world_factory"]
