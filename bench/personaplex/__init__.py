"""PersonaPlex capacity: how many real-time sessions one accelerator carries.

One module per mode of ``python -m bench.personaplex_capacity`` (the command
line and the orchestration live there):

* ``step``: the raw batched plugin step (``run_step``);
* ``server``: the whole server with N paced WebSocket clients (``run_server``,
  and ``serve``, the child process it starts);
* ``baseline``: moshi's ``LMGen`` loop at batch 1 (``run_baseline``);
* ``moshi_server``: ``python -m moshi.server`` itself (``run_moshi_server``);

and ``common`` (constants, the model folder, the plugin, the tick columns every
row shares) and ``report`` (the printed table and the plot).
"""

from bench.personaplex.baseline import run_baseline
from bench.personaplex.moshi_server import run_moshi_server
from bench.personaplex.report import plot, table
from bench.personaplex.server import run_server, serve
from bench.personaplex.step import run_step

__all__ = ["plot", "run_baseline", "run_moshi_server", "run_server", "run_step", "serve", "table"]
