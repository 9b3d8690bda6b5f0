"""A signal that ends the run, landing just as :func:`kvsim.core.io.atomic_path` makes its
temporary file, still leaves nothing behind: the file is named before it is made, so the
code that removes it knows it (a SIGTERM a millisecond after the file appeared once left it,
made by ``tempfile.mkstemp``, which names it only after making it)."""

from __future__ import annotations

import os
import signal

import pytest

from kvsim.core.ending import Terminated, end_on_signal, forget_ending
from kvsim.core.io import atomic_path


def test_a_sigterm_as_the_temp_file_is_made_leaves_no_file(tmp_path, monkeypatch):
    real_open = os.open
    sent = []

    def open_then_sigterm(*args, **kwargs):
        fd = real_open(*args, **kwargs)
        if not sent:  # the file exists; its maker has not returned yet
            sent.append(True)
            os.kill(os.getpid(), signal.SIGTERM)
        return fd

    monkeypatch.setattr(os, "open", open_then_sigterm)
    before = signal.signal(signal.SIGTERM, end_on_signal)
    try:
        with pytest.raises(Terminated), atomic_path(tmp_path / "rows.csv"):
            raise AssertionError("the write ran past the signal")
    finally:
        signal.signal(signal.SIGTERM, before)
        forget_ending()
    assert sent and list(tmp_path.iterdir()) == []
