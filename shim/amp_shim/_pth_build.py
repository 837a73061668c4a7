"""Build step: ship the `amp_shim_alias.pth` start-up hook at the root of site-packages.

The hook is one line that does nothing unless `AMP_SHIM_ALIAS` is set; then it installs the
`apex` alias (`amp_shim.alias.activate_from_environment`). That is how the alias reaches child
processes (torchrun workers, multiprocessing spawn) without touching their command line.

A `.pth` file only runs from a site directory, so it must sit at the wheel's root, outside any
package. pyproject.toml's `[tool.setuptools] cmdclass` loads the two commands below from this
file at build time:

* `build_py` writes the file into the build directory's root, so `bdist_wheel` puts it at the
  wheel's root, beside `amp_shim/`;
* `editable_wheel` (what `pip install -e .` runs, PEP 660) builds no such tree: setuptools'
  editable wheel holds only its own `__editable__` finder and `.pth`, and it never installs
  `data_files` either. So the command adds the file to the finished editable wheel (with its
  RECORD line); pip then installs and uninstalls it like any other file of the wheel.

The setuptools classes are created on first access (module `__getattr__`), so importing this
module at run time, where setuptools may be absent, costs nothing.
"""

from __future__ import annotations

import base64
import hashlib
import os
import zipfile

PTH_NAME = "amp_shim_alias.pth"
# site.py executes a .pth line that starts with "import". `__editable__.*.pth` sorts first, so an
# editable install's finder is in place when this line imports amp_shim.
PTH_CONTENT = (
    "import os; os.environ.get('AMP_SHIM_ALIAS', '').strip().lower() not in "
    "('', '0', 'false', 'no', 'off') and "
    "__import__('amp_shim.alias').alias.activate_from_environment()\n"
)


def add_file_to_wheel(wheel_path: str, name: str, data: bytes) -> None:
    """Add (or replace) one file in a wheel and record it in the wheel's RECORD."""
    with zipfile.ZipFile(wheel_path) as zin:
        entries = [(info, zin.read(info)) for info in zin.infolist() if info.filename != name]
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record_line = "%s,sha256=%s,%d\n" % (name, digest, len(data))
    tmp = wheel_path + ".tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
        info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
        info.external_attr = 0o644 << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        zout.writestr(info, data)
        for entry, content in entries:
            if entry.filename.endswith(".dist-info/RECORD"):
                lines = [ln for ln in content.decode().splitlines(True) if not ln.startswith(name + ",")]
                content = (
                    "".join(lines[:-1] + [record_line] + lines[-1:]).encode()
                    if lines
                    else record_line.encode()
                )
            zout.writestr(entry, content)
    os.replace(tmp, wheel_path)


def _build_py_class():
    from setuptools.command.build_py import build_py as base

    class build_py(base):
        def run(self):
            super().run()
            if not getattr(self, "editable_mode", False):
                self.mkpath(self.build_lib)
                with open(os.path.join(self.build_lib, PTH_NAME), "w", encoding="utf-8") as f:
                    f.write(PTH_CONTENT)

        def get_outputs(self, include_bytecode=1):
            outputs = list(super().get_outputs(include_bytecode))
            if not getattr(self, "editable_mode", False):
                outputs.append(os.path.join(self.build_lib, PTH_NAME))
            return outputs

    return build_py


def _editable_wheel_class():
    from setuptools.command.editable_wheel import editable_wheel as base

    class editable_wheel(base):
        def run(self):
            super().run()
            wheels = [
                os.path.join(self.dist_dir, n)
                for n in os.listdir(self.dist_dir)
                if n.endswith(".whl") and "-0.editable-" in n
            ]
            if not wheels:
                raise RuntimeError(
                    "amp-migrate: no editable wheel in %s to add %s to" % (self.dist_dir, PTH_NAME)
                )
            add_file_to_wheel(max(wheels, key=os.path.getmtime), PTH_NAME, PTH_CONTENT.encode())

    return editable_wheel


def __getattr__(name: str):
    if name == "build_py":
        return _build_py_class()
    if name == "editable_wheel":
        return _editable_wheel_class()
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
