"""Import boundaries (docs/internals.md, "Dependency rule").

Each package is imported - with every one of its modules - in a fresh interpreter, and the project
modules that ended up in ``sys.modules`` must all belong to what that package may depend on:

    protocol  <-  plugins  <-  engine  <-  server
        ^                        ^
        +------- clients --------+   (InlineDuplexClient imports the engine lazily)
    bench -> clients

The engine and the server may use the plugin *contract* (``duplex.plugins``, ``.base``, ``.registry``,
the worker protocol) but never a concrete plugin. ``duplex.protocol`` must not pull in torch. A package
that does not exist yet is skipped with a reason naming it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ("duplex", "clients", "bench", "batch_models")

PLUGIN_CONTRACT = (
    "duplex.plugins",
    "duplex.plugins.base",
    "duplex.plugins.registry",
    "duplex.engine.worker",
)

# package -> (allowed project module prefixes, heavy third-party modules it must not load)
RULES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "duplex.protocol": (("duplex.protocol",), ("torch",)),
    "duplex.plugins": (("duplex.protocol", "duplex.plugins"), ()),
    "duplex.engine": (("duplex.protocol", *PLUGIN_CONTRACT, "duplex.engine"), ()),
    "duplex.server": (("duplex.protocol", *PLUGIN_CONTRACT, "duplex.engine", "duplex.server"), ()),
    "clients": (("duplex.protocol", "clients"), ("torch",)),
    "bench": (("duplex.protocol", "clients", "bench"), ()),
    # Batch models are plugins: the plugin layer and the wire codec, never the engine or the server.
    "batch_models": (("duplex.protocol", "duplex.plugins", "batch_models"), ()),
}

_PROBE = r"""
import importlib, importlib.util, json, pkgutil, sys
name = sys.argv[1]
if importlib.util.find_spec(name) is None:
    print(json.dumps({"missing": True})); raise SystemExit
package = importlib.import_module(name)
errors = []
for info in pkgutil.walk_packages(getattr(package, "__path__", []), prefix=name + "."):
    try:
        importlib.import_module(info.name)
    except Exception as exc:  # reported, not hidden: a module that cannot import is a failure too
        errors.append(f"{info.name}: {type(exc).__name__}: {exc}")
print(json.dumps({"missing": False, "modules": sorted(sys.modules), "errors": errors}))
"""


def _allowed(module: str, prefixes: tuple[str, ...]) -> bool:
    if module == "duplex":
        return True
    return any(module == p or module.startswith(p + ".") for p in prefixes)


@pytest.mark.parametrize("package", sorted(RULES))
def test_package_imports_only_what_it_may(package: str) -> None:
    allowed, banned = RULES[package]
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, package],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    if report["missing"]:
        pytest.skip(f"package {package} does not exist yet")
    assert report["errors"] == [], f"modules of {package} that fail to import"
    own = [m for m in report["modules"] if m.split(".")[0] in PROJECT]
    outside = sorted(m for m in own if not _allowed(m, allowed) and not _is_own(m, package))
    assert outside == [], f"{package} imports project modules outside its layer"
    heavy = sorted(b for b in banned if b in report["modules"])
    assert heavy == [], f"{package} loads {heavy}"


def _is_own(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")
