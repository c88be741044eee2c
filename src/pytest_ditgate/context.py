"""The session-wide ditgate state (:class:`DitgateContext`), built once per pytest run and kept in the stash."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pytest_ditgate import options

if TYPE_CHECKING:
    from pytest_ditgate.device_info import DeviceInfo

#: fixtures whose use makes a test a gate test (skipped with a reason when ``--ditgate`` is off)
GATE_FIXTURES = frozenset({"kernel_check", "ditbench", "golden", "ditgate_device", "ditgate_artefacts", "quality_gate",
                           "dit_contract", "ditgate_candidate", "ditgate_lane"})
#: markers that make a test a gate test
GATE_MARKERS = frozenset({"ditgate", "requires_gpu"})

OFF_REASON = "ditgate gate test: gates are off; run pytest with --ditgate (or set ditgate = true in the ini file)"


@dataclass
class DitgateContext:
    """Options read once, plus lazily probed device info."""

    enabled: bool
    target: str | None
    artefact_dir: Path
    is_xdist_worker: bool
    _device: "DeviceInfo | None" = field(default=None, repr=False)

    @classmethod
    def from_config(cls, config: pytest.Config) -> "DitgateContext":
        from pytest_ditgate.artefacts import named_by, resolve_artefact_dir
        from pytest_ditgate.errors import DitgateUsageError
        from pytest_ditgate.project_config import load_project_config, missing_folder_problem

        enabled = bool(options.get_option(config, options.ENABLE))
        table = None
        if enabled:  # the gates on: [tool.ditgate] is checked now, before anything reads or writes by it
            try:
                table = load_project_config(config.rootpath)
            except DitgateUsageError as exc:
                raise pytest.UsageError(str(exc)) from None
        option = options.get_option(config, options.ARTEFACT_DIR)
        artefact_dir = resolve_artefact_dir(config.rootpath, option, table=table)
        source = named_by(f"--ditgate-dir={option}" if option else None, "[tool.ditgate] artefact_dir")
        if artefact_dir.exists() and not artefact_dir.is_dir():
            raise pytest.UsageError(f"{source}: {artefact_dir} is a file, not a folder; the run "
                                    "artefacts (ledgers, environment.json, images) need a folder")
        problem = missing_folder_problem(artefact_dir, config.rootpath) if enabled else None
        if problem is not None:
            raise pytest.UsageError(f"{source}: {problem}")
        return cls(
            enabled=enabled,
            target=options.get_option(config, options.TARGET),
            artefact_dir=artefact_dir,
            is_xdist_worker=hasattr(config, "workerinput"),
        )

    def device(self) -> "DeviceInfo":
        """The device skip decisions use (profile or detection), probed on first use."""
        if self._device is None:
            from pytest_ditgate.device import current_device

            self._device = current_device()
        return self._device

    def artefact_path(self, *parts: str) -> Path:
        """A path under the artefact folder, its parent created. A folder ditgate creates gets a
        ``.gitignore`` of ``*`` (as ``.pytest_cache`` does), so ledgers and lock files stay out of git."""
        if not self.artefact_dir.exists():
            from pytest_ditgate.fsutil import ensure_gitignore

            self.artefact_dir.mkdir(parents=True, exist_ok=True)
            ensure_gitignore(self.artefact_dir)
        path = self.artefact_dir.joinpath(*parts)
        path.parent.mkdir(parents=True, exist_ok=True)
        return path


#: the session-wide ditgate state, built once in ``plugin.py``'s ``pytest_configure``
context_key = pytest.StashKey[DitgateContext]()


def get_context(config: pytest.Config) -> DitgateContext:
    return config.stash[context_key]
