"""The repository's install surface: the files that install Apex beside the Python code.

A migrated tree that still installs Apex keeps a CUDA build in every image and CI job for code
that no longer imports it. Dependency declarations (requirements files, setup.py, setup.cfg,
pyproject.toml, conda environment files) are edited, since each Apex entry has one right
replacement once the tree's Python files are migrated; install steps in Dockerfiles, shell
scripts and Markdown are reported, never edited, since a command line's meaning depends on
what runs around it.
"""
