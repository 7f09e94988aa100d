"""What the stock Keras jobs (keras_stock.py on tf-keras, keras3_stock.py on Keras 3) share:
their fit, timed step by step, and the one JSON line they print: the process's examples/s from
its second step to its last, and the processes."""

from __future__ import annotations

import json
import time
from typing import Any


def fit_and_report(
    model: Any, batches: Any, callback: type, *, steps: int, batch_size: int, processes: int
) -> None:
    """`model.fit` on `batches` for `steps` steps; `callback` is the Keras's Callback class."""
    ends: list[float] = []

    class Timed(callback):  # type: ignore[misc]
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            ends.append(time.monotonic())

    model.fit(batches, epochs=1, steps_per_epoch=steps, callbacks=[Timed()], verbose=0)
    examples_per_sec = (len(ends) - 1) * batch_size / (ends[-1] - ends[0])
    print(json.dumps({"examples_per_sec": examples_per_sec, "processes": processes}), flush=True)
