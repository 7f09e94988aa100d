"""TensorFlow's start-up notes held back (process/task/native_noise.py): what its C++ writes to file
descriptor 2 as it loads, dropped, and everything else passed on in order. No TensorFlow: the
lines are written here as TensorFlow 2.21 writes them on a CPU machine."""

from __future__ import annotations

import logging
import os

import pytest

from tfconfig_slurm.process.task.native_noise import start_up_notes_held

NOTES = (
    b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
    b"I0000 00:00:1795716093.516594    9524 port.cc:153] oneDNN custom operations are on.\n"
    b"I0000 00:00:1795716093.586556    9524 cpu_feature_guard.cc:227] This TensorFlow binary is"
    b" optimized to use available CPU instructions in performance-critical operations.\n"
    b"To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow\n"
)
NO_DRIVER = (
    b"I0000 00:00:1795716093.516922    9524 cudart_stub.cc:31] Could not find cuda drivers on"
    b" your machine, GPU will not be used.\n"
    b"E0000 00:00:1795716094.942354    9524 cuda_platform.cc:52] failed call to cuInit: INTERNAL:"
    b" CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)\n"
)
NEWS = b"E0000 00:00:1795716095.1 9524 some_op.cc:12] a real error\n"


@pytest.mark.parametrize("gpus_asked", [False, True])
def test_the_notes_are_dropped_and_the_rest_passed_on(
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, gpus_asked: bool
) -> None:
    caplog.set_level(logging.INFO)
    with start_up_notes_held(gpus_asked):
        os.write(2, NOTES + NO_DRIVER + NEWS)
        os.write(2, b"the experiment's own line\n")
    err = capfd.readouterr().err
    assert "oneDNN" not in err and "cpu_feature_guard" not in err and "To enable" not in err
    assert err.endswith(NEWS.decode() + "the experiment's own line\n"), err
    # Where GPUs were asked for, a missing driver is news; else it is said once, in words.
    assert ("failed call to cuInit" in err) == gpus_asked
    said = "no GPU driver on this machine: TensorFlow trains on its CPUs" in caplog.text
    assert said != gpus_asked


def test_what_was_written_before_an_error_is_passed_on(capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError), start_up_notes_held(gpus_asked=False):
        os.write(2, NOTES + b"Traceback (most recent call last):\n")
        raise ValueError("an experiment that fails to load")
    assert capfd.readouterr().err == "Traceback (most recent call last):\n"
