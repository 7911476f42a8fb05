"""An engine double whose steps wait while a gate file exists, so that a test holds a stream
open, running, for as long as it needs (several models loading and unloading beside it) and
then lets it finish. Served through the plugin point a user has too:
`pagode serve --engine-factory tests.gated_engine:GatedEngine`, with PAGODE_TEST_GATE naming
the gate file and PAGODE_TEST_GATED the text in the model path of the models it holds back
(the others step freely). The wait comes before the step takes its turn among the engines
(engine/step_turns.py), so a held model never holds the others up."""

from __future__ import annotations

import os
import time
from pathlib import Path

from engine.async_engine import AsyncEngine


class GatedEngine(AsyncEngine):
    def _step(self):  # type: ignore[no-untyped-def]
        gated = os.environ.get("PAGODE_TEST_GATED")
        gate = Path(os.environ.get("PAGODE_TEST_GATE", "/nonexistent"))
        if gated and gated in str(self.config.model):
            while gate.exists() and not self._stopping:
                time.sleep(0.02)
        return super()._step()
