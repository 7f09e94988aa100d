"""A supervised command's stderr relayed (process/supervision/children.py's Relay): passed on as
it comes, and read for the line that says why it failed. No TensorFlow."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from tests.cli import wait_until
from tfconfig_slurm.process.supervision.children import Relay
from tfconfig_slurm.process.user_code import versions

TRACEBACK = b"""W0000 a log line of TensorFlow's
Traceback (most recent call last):
  File "/site-packages/keras/src/trainers/trainer.py", line 9, in fit
    raise ValueError(message)
ValueError: Attempt to convert a value (PerReplica:{
  0: <tf.Tensor>
}) to a Tensor.
I0000 a log line at exit
"""


class Sink:
    """The other end of the relay's output: what has reached it so far."""

    def __init__(self) -> None:
        self.fd, self._reader = os.pipe()[::-1]
        os.set_blocking(self._reader, False)
        self._got = b""

    def getvalue(self) -> bytes:
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(self._reader, 1 << 16):
                self._got += chunk
        return self._got


def relayed(*chunks: bytes, aside: Path | None = None) -> tuple[Relay, Sink, int]:
    reader, writer = os.pipe()
    sink = Sink()
    relay = Relay(reader, sink.fd, aside)
    for chunk in chunks:
        os.write(writer, chunk)
    return relay, sink, writer


def test_the_exception_line_of_the_last_traceback_is_why_it_failed() -> None:
    relay, sink, writer = relayed(TRACEBACK)
    os.close(writer)
    relay.finish()
    # Its message's next lines too, not the TensorFlow log line after them.
    assert relay.why_it_failed() == (
        "ValueError: Attempt to convert a value (PerReplica:{ 0: <tf.Tensor> }) to a Tensor."
    )
    assert relay.through_keras_3
    assert sink.getvalue() == TRACEBACK


def test_without_a_traceback_its_last_line_is_why_and_keras_2_is_not_keras_3() -> None:
    """tf-keras, and Keras 2's keras/src (tf.keras on TensorFlow 2.15), are not Keras 3."""
    for keras_2 in (b"/tf_keras/src/trainers/", b"/keras/src/engine/"):
        relay, _, writer = relayed(TRACEBACK.replace(b"/keras/src/trainers/", keras_2))
        os.close(writer)
        relay.finish()
        assert not relay.through_keras_3
        assert relay.why_it_failed().startswith("ValueError: Attempt")
    plain, _, writer = relayed(b"error: no such file\nbye")
    os.close(writer)
    plain.finish()
    assert plain.why_it_failed() == "bye"


def test_a_line_not_yet_ended_is_passed_on_at_once() -> None:
    """A progress bar redraws its line with \\r: it is not held until a newline."""
    relay, sink, writer = relayed(b"epoch 1: 50%\r")
    try:
        assert wait_until(lambda: sink.getvalue() == b"epoch 1: 50%\r", 5.0)
    finally:
        os.close(writer)
    relay.finish()
    assert relay.why_it_failed() == "epoch 1: 50%"


FILTERED = b"""Traceback (most recent call last):
  File "/home/me/script.py", line 30, in <module>
    model.fit(dataset, epochs=1)
  File "/site-packages/keras/src/utils/traceback_utils.py", line 122, in error_handler
    raise e.with_traceback(filtered_tb) from None
ValueError: Attempt to convert a value (PerReplica:{ 0: <tf.Tensor> }) to a Tensor.
"""


def said_keras_3_of_a_filtered_traceback() -> bool:
    """Keras 3 filters its own frames out of a traceback, all but traceback_utils.py's."""
    relay, _, writer = relayed(FILTERED)
    os.close(writer)
    relay.finish()
    return relay.through_keras_3


def test_a_filtered_traceback_through_keras_2_is_not_keras_3() -> None:
    """The Estimator suite's keras is Keras 2 (2.15), which has a traceback_utils.py too."""
    assert versions.installed().keras.startswith("2.")  # type: ignore[union-attr]
    assert not said_keras_3_of_a_filtered_traceback()


@pytest.mark.tf2
def test_a_filtered_traceback_through_keras_3_is_keras_3() -> None:
    """TensorFlow 2.16+'s keras is Keras 3: its one frame left is enough."""
    assert versions.installed().keras.startswith("3.")  # type: ignore[union-attr]
    assert said_keras_3_of_a_filtered_traceback()


# A --keras3 worker's stderr as JAX ended it when a peer was killed (a test cluster's task log).
JAX_ABORT = (
    b"process 1: batch 5 done\n"
    b"E1128 19:46:21.095583     585 coordination_service_agent.cc:288] Polled an error from "
    b"coordination service (this can be an error from this or another task).\n"
    b"F1128 19:46:21.095632     585 client.h:86] Terminating process because the JAX "
    b"distributed service detected fatal errors. This most likely indicates that another task "
    b"died; see the other task logs for more details.\n"
    b"Additional GRPC error information from remote target coordination_service while calling "
    b"/xla.coordination.CoordinationService/PollForError:\n"
    b":UNAVAILABLE:Stream removed (Socket closed)\n"
    b"=== Source Location Trace: ===\n"
    b"external/xla+/xla/pjrt/distributed/coordination/coordination_service_error_util.cc:64\n"
    b"\n"
    b"process 1: batch 6 done\n"
    b"*** Check failure stack trace: ***\n"
    b"    @     0x7f16730f81b4  absl::lts_20260526::log_internal::LogMessage::SendToLog()\n"
    b"    @     0x7f16832a71f5  (unknown)\n"
)


def test_jax_s_fatal_end_goes_aside_in_one_line_where_a_file_is_given(tmp_path: Path) -> None:
    aside = tmp_path / "logs" / "worker-0-native.log"
    # Split inside the FATAL line: its first part is not passed on before it is known.
    cut = JAX_ABORT.index(b"client.h")
    relay, sink, writer = relayed(JAX_ABORT[:cut], aside=aside)
    assert wait_until(lambda: b"Polled an error" in sink.getvalue(), 5.0)
    os.write(writer, JAX_ABORT[cut:])
    os.close(writer)
    relay.finish()
    fatal = JAX_ABORT.index(b"F1128")
    assert sink.getvalue() == JAX_ABORT[:fatal] + (
        b"F1128 19:46:21.095632     585 client.h:86] Terminating process because the JAX "
        b"distributed service detected fatal errors (the rest, and its native stack trace: "
        + os.fsencode(aside)
        + b")\n"
    )
    assert aside.read_bytes() == JAX_ABORT[fatal:]
    assert relay.why_it_failed() == (
        "Terminating process because the JAX distributed service detected fatal errors"
    )
    # Without a file, every line is passed on.
    whole, sink, writer = relayed(JAX_ABORT)
    os.close(writer)
    whole.finish()
    assert sink.getvalue() == JAX_ABORT
