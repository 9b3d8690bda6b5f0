"""A signal that ends the run, landing just as :func:`kvsim.core.io.atomic_path` makes its
temporary file, still leaves nothing behind: it is held until the code that removes the
file is in place (a SIGTERM a millisecond after the file appeared once left it)."""

from __future__ import annotations

import os
import signal
import tempfile

import pytest

from kvsim.core.ending import Terminated, end_on_signal, forget_ending
from kvsim.core.io import atomic_path


def test_a_sigterm_as_the_temp_file_is_made_leaves_no_file(tmp_path, monkeypatch):
    made = tempfile.mkstemp

    def mkstemp_then_sigterm(*args, **kwargs):
        fd_and_name = made(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # the file exists; its name is not returned yet
        return fd_and_name

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp_then_sigterm)
    before = signal.signal(signal.SIGTERM, end_on_signal)
    try:
        with pytest.raises(Terminated), atomic_path(tmp_path / "rows.csv") as tmp:
            open(tmp, "w").close()  # not reached: the signal ends it first
            raise AssertionError("the write ran past the signal")
    finally:
        signal.signal(signal.SIGTERM, before)
        forget_ending()
    assert list(tmp_path.iterdir()) == []


def test_the_signal_mask_is_given_back(tmp_path):
    before = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    with atomic_path(tmp_path / "a.txt") as tmp:
        assert signal.pthread_sigmask(signal.SIG_BLOCK, set()) == before  # nothing held here
        open(tmp, "w").close()
    assert signal.pthread_sigmask(signal.SIG_BLOCK, set()) == before
    assert (tmp_path / "a.txt").exists()
