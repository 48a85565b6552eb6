"""Importing core, building a config and listing plugins never imports a heavy library."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch", "ray", "vllm", "deepspeed", "transformers")

PROGRAM = """
import sys
import arctic_platform.rl
assert 'torch' not in sys.modules
from arctic_platform.rl.config import ArcticRLClientConfig
from arctic_platform.rl.plugins import get_registry
import arctic_platform.rl.protocol, arctic_platform.rl.interfaces, arctic_platform.rl.losses
ArcticRLClientConfig(model_name="m", training_gpus=1, host="127.0.0.1")
get_registry().rows()
loaded = [m for m in {heavy!r} if m in sys.modules]
assert not loaded, loaded
"""


def test_import_and_config_do_not_load_heavy_libraries():
    subprocess.run([sys.executable, "-c", PROGRAM.format(heavy=HEAVY)], check=True)
