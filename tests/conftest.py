"""Project-wide test settings.

Each test directory keeps its own fixtures in its own conftest.py; this file only
holds what every test needs: no model hub, the ``slow_on_uvloop`` marker, and no skips in CI
(``tests/no_skips.py``).

``@pytest.mark.slow_on_uvloop`` is for a heavy end-to-end test of a directory whose async tests
run on both event loops (``tests.event_loops``): its asyncio run stays in the default tier and
its uvloop run is marked ``slow``. It is for tests that wait on real time (paced speech, a browser
playing audio, a camera's seconds) while what they check does not depend on the loop, and whose
module keeps lighter tests on both loops; a module with no lighter async test may use it only
where the routes it drives run on uvloop in lighter tests elsewhere. Transport tests (disconnects,
slow readers, header timeouts, hostile frames) stay on both loops: the loops' transports differ.
"""

import os

import pytest

pytest_plugins = ["tests.no_skips"]

# Never reach a model hub from a test: every model loads from a local path or package data.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

#: pytest-asyncio's parameter that carries a test's loop factory (``pytest_asyncio_loop_factories``).
_LOOP_PARAM = "_asyncio_loop_factory"


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The uvloop run of a ``slow_on_uvloop`` test is ``slow``."""
    from tests.event_loops import LOOP_FACTORIES

    standard = LOOP_FACTORIES["asyncio"]
    for item in items:
        if item.get_closest_marker("slow_on_uvloop") is None:
            continue
        callspec = getattr(item, "callspec", None)
        factory = callspec.params.get(_LOOP_PARAM) if callspec is not None else None
        if factory is not None and factory is not standard:
            item.add_marker(pytest.mark.slow)

