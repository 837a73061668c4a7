"""The diagnostic codes of the install surface (amp_migrate/install/)."""

from __future__ import annotations

from ..diagnostics import Severity, define

APEX_DEPENDENCY_REMOVED = define(
    "AMP080",
    "apex-dependency-removed",
    Severity.INFO,
    "The Apex entry of a dependency declaration was removed: no file in the tree needs Apex "
    "or the shim after the migration.",
    "Every Python file and notebook under the given paths was migrated to native torch.amp (or "
    "never used Apex), so installing Apex, which builds CUDA extensions from source, only costs "
    "build time. The entry is removed from requirements files, setup.py `install_requires` and "
    "`extras_require`, setup.cfg, pyproject.toml `[project]` dependencies and optional "
    "dependencies, and the pip section of a conda environment file, keeping every other line "
    "as it was. Files outside the given paths are not seen: run amp-migrate on the whole "
    "repository before relying on this.",
    before="torch>=2.1\napex @ git+https://github.com/NVIDIA/apex",
    after="torch>=2.1",
)
APEX_DEPENDENCY_REPLACED = define(
    "AMP081",
    "apex-dependency-replaced",
    Severity.INFO,
    "The Apex entry of a dependency declaration now names `amp-migrate`, the distribution "
    "that provides `amp_shim`, which a migrated file in the tree imports.",
    "A file migrated to the shim imports `amp_shim` instead of `apex`; `amp_shim` is installed "
    "by the `amp-migrate` distribution, a pure-Python wheel that builds nothing. The entry's "
    "environment markers and comment are kept; a URL or editable checkout of Apex's source is "
    "replaced by the plain name. Where the file already names `amp-migrate` the Apex entry is "
    "removed instead.",
    before="apex @ git+https://github.com/NVIDIA/apex ; platform_system == 'Linux'",
    after="amp-migrate ; platform_system == 'Linux'",
)
APEX_DEPENDENCY_KEPT = define(
    "AMP082",
    "apex-dependency-kept",
    Severity.WARNING,
    "The Apex entry of a dependency declaration was kept: a file in the tree still needs Apex "
    "after the migration.",
    "A file the codemod left on Apex (an Apex module or argument the shim lacks, AMP470 or "
    "AMP471; a use no rule rewrites, AMP031, AMP032 or AMP035; a file that could not be "
    "migrated) still imports `apex`, so removing the entry would break it. The message names "
    "the first such file; when other files use the shim, `amp-migrate` is added beside the "
    "entry. Migrate the named file by hand and run amp-migrate again to drop the entry. When "
    "the run was given no Python file or notebook at all (only `requirements.txt` named on the "
    "command line), nothing says whether Apex is still needed, and every entry is kept.",
    before="apex",
    after="apex\namp-migrate",
)
APEX_DEPENDENCY_NOT_EDITED = define(
    "AMP083",
    "apex-dependency-not-edited",
    Severity.WARNING,
    "An Apex requirement appears in a form the migration does not edit; change it by hand.",
    "Only literal entries are edited: a requirements line, a string in a literal list of "
    "setup.py's `install_requires` or `extras_require`, a line of setup.cfg's "
    "`install_requires`, a string of pyproject.toml's `[project]` dependency arrays, a pip "
    "entry of a conda environment file. A requirement computed in setup.py, a conda package "
    "(`nvidia-apex`), a Poetry table, a line continued with a backslash, or a pyproject.toml "
    "array the text scan does not reach (an inline table, a dotted key) cannot be edited with a "
    "guarantee of what the result means, so it is reported with what it should become: remove "
    "it, replace it by `amp-migrate`, or keep it. So is an edit the format's own reader "
    "(tomllib, configparser, Python's parser) reads back otherwise than asked: the file is "
    "then left as it was.",
    before='install_requires=["torch"] + (["apex"] if CUDA else [])',
)
APEX_INSTALL_STEP_OBSOLETE = define(
    "AMP084",
    "apex-install-step-obsolete",
    Severity.WARNING,
    "A Dockerfile, shell script or Markdown line installs Apex, which no file in the tree "
    "needs after the migration; remove it by hand (install `amp-migrate` instead where a "
    "file uses the shim).",
    "Install steps are reported, never edited: a command line's meaning depends on what runs "
    "around it (a `cd apex` two lines up, a `WORKDIR`, a build argument). The message says "
    "what the line does: clones Apex's repository, pip installs Apex, or builds its C++ and "
    "CUDA extensions (`--cpp_ext`, `--cuda_ext`), which takes minutes and a CUDA toolkit.",
    before="RUN git clone https://github.com/NVIDIA/apex && cd apex && pip install -v "
    '--global-option="--cpp_ext" --global-option="--cuda_ext" ./',
)
APEX_INSTALL_STEP_NEEDED = define(
    "AMP085",
    "apex-install-step-needed",
    Severity.INFO,
    "A Dockerfile, shell script or Markdown line installs Apex, which a file in the tree "
    "still needs after the migration.",
    "The message names the first file that still imports Apex (see AMP082); the line stays "
    "needed until that file is migrated by hand. When the run was given no Python file or "
    "notebook, the message says that nothing tells whether the line is still needed.",
    before="pip install -v --no-build-isolation ./apex",
)
