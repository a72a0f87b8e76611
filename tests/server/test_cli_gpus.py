"""``duplex serve --gpus N``: one GPU (the default) is this one process and never imports Ray; more
than one needs the cluster extra, and a server without it says so and exits with status 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from duplex.cli import build_parser, main

_PROBE = """
import sys
from duplex.cli import _cluster
from duplex.server.config import ServeConfig
assert _cluster(ServeConfig(), None) is None
assert _cluster(ServeConfig(cluster={"gpus": 4}), 1) is None
print(_cluster(ServeConfig(), 3).gpus, "ray" in sys.modules)
"""


def test_gpus_parses_and_one_gpu_is_one_process_without_ray() -> None:
    assert build_parser().parse_args(["serve", "--gpus", "8"]).gpus == 8
    done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["3", "False"]


def test_more_gpus_without_the_cluster_extra_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    try:
        import ray  # noqa: F401
    except ImportError:
        assert main(["serve", "--plugin", "echo", "--gpus", "2"]) == 2
        assert "duplex-runtime[cluster]" in capsys.readouterr().err
    else:  # an environment with Ray starts a cluster instead: tests/cluster covers that
        assert build_parser().parse_args(["serve", "--gpus", "2"]).gpus == 2


def test_a_bad_cluster_section_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--plugin", "echo", "--gpus", "0"]) == 2
    assert "cluster" in capsys.readouterr().err
