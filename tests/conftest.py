"""Project-wide test settings.

Each test directory keeps its own fixtures in its own conftest.py; this file only
holds what every test needs.
"""

import os

# Never reach a model hub from a test: every model loads from a local path or package data.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
