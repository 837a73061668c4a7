"""Whole-tree migration: the project index, the groups of files that share Apex objects, and
`migrate_project`, which migrates each group to one target."""

from . import codes  # noqa: F401  (registers AMP030-AMP049)
from .groups import Group, find_groups
from .index import ModuleFacts, ProjectIndex, build_index
from .migrate import Tree, migrate_project

__all__ = ["migrate_project", "build_index", "find_groups", "ProjectIndex", "ModuleFacts", "Group", "Tree"]
