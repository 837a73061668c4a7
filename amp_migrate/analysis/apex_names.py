"""Apex's root module name, and the test of whether a qualified name is under it."""

APEX = "apex"


def is_apex_name(name: str) -> bool:
    return name == APEX or name.startswith(APEX + ".")
