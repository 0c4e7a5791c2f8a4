"""What JAX compiles during a block: the StableHLO of every module it lowers, dumped to a
folder (``jax_dump_ir_to``), for tests that read the programs (rows passed as arguments,
nothing exchanged with the host)."""

from __future__ import annotations

import jax


class dump_programs_to:
    """Set JAX's ``jax_dump_ir_to`` to ``directory`` (without debug locations) for a block;
    the previous settings come back after it."""

    def __init__(self, directory):
        self.directory = str(directory)

    def __enter__(self):
        self.previous = (jax.config.read("jax_dump_ir_to"),
                         jax.config.read("jax_include_debug_info_in_dumps"))
        jax.config.update("jax_dump_ir_to", self.directory)
        jax.config.update("jax_include_debug_info_in_dumps", False)
        return self

    def __exit__(self, *exc):
        jax.config.update("jax_dump_ir_to", self.previous[0])
        jax.config.update("jax_include_debug_info_in_dumps", self.previous[1])
