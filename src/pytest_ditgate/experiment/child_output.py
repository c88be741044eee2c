"""The child's terminal output, passed on with a prefix on every line: nothing the candidate's process prints
(a fake ``VERDICT:`` line, a replaced ``print``) can look like a line of the judge's own.

The judge's lines are the only ones that start without the prefix; the whole output also goes, unprefixed, to
``child.log`` beside the run's artefacts.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TextIO

#: what starts every line the child wrote, on the judge's terminal
PREFIX = b"  | "
#: seconds the judge waits, once the child has ended, for processes it left behind to close the pipe
DRAIN_S = 5.0


class PrefixedPump:
    """Copies a pipe to ``sink`` (a text stream: its binary buffer where it has one) with :data:`PREFIX` at the
    start of each line and, unchanged, to ``log``."""

    def __init__(self, source: int, sink: TextIO, log: Path) -> None:
        self.source = source
        self.sink = sink
        self.log = log.open("wb")
        self.at_line_start = True
        self.thread = threading.Thread(target=self._run, name="ditgate-child-output", daemon=True)

    def start(self) -> "PrefixedPump":
        self.thread.start()
        return self

    def prefixed(self, chunk: bytes) -> bytes:
        """``chunk`` with the prefix after every newline that more output follows (and at a line's start)."""
        lines = chunk.split(b"\n")
        out = []
        for index, line in enumerate(lines):
            last = index == len(lines) - 1
            if line or not last:
                out.append((PREFIX if self.at_line_start else b"") + line)
                self.at_line_start = False
            if not last:
                out.append(b"\n")
                self.at_line_start = True
        return b"".join(out)

    def _write(self, data: bytes) -> None:
        self.sink.flush()
        binary = getattr(self.sink, "buffer", None)
        if binary is not None:
            binary.write(data)
            binary.flush()
        else:
            self.sink.write(data.decode(errors="replace"))
            self.sink.flush()

    def _run(self) -> None:
        try:
            while True:
                try:
                    chunk = os.read(self.source, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                self.log.write(chunk)
                self._write(self.prefixed(chunk))
        finally:
            self.log.close()

    def finish(self) -> None:
        """Wait for the pipe's end (processes the child left behind may hold it: not beyond :data:`DRAIN_S`)."""
        self.thread.join(DRAIN_S)
        if not self.at_line_start:
            self._write(b"\n")
        try:
            os.close(self.source)
        except OSError:
            pass
