"""The process the judge times: it builds a lane's timed regions for some implementations and runs rounds on the
judge's word, over two pipes.

Started by the judge as ``python -B -c <bootstrap.SERVER> <root> <timing module> <impls> <read fd> <write fd>``
in the candidate's tree (impls ``candidate``) or in a read-only checkout of the lane best's commit (impls
``best`` and ``baseline``: the best's candidate and the baseline). One JSON object a line each way; the judge
sends, the server answers once:

- ``{"op": "build", "region": r}``: build the region's functions; ``{"ok": ..., "skip": reason|None}``;
- ``{"op": "warm", "region": r, "impl": i, "seed": s}``: three untimed calls; ``{"ms": host ms per call}``;
- ``{"op": "idle"}``: synchronise the device; the process's thread count and any replaced timer;
- ``{"op": "go", "region": r, "impl": i, "seed": s, "key": k, "calls": n}``: the timed round, one call at a
  time. The server draws the call's inputs from the seed it was last given (a generator on the region's
  device), runs the call, synchronises and commits to its outputs under ``key ^ call`` (:mod:`commitment`), and
  answers ``{"call": c, "commit": value}``; the judge reveals the next call's seed only then, with
  ``{"op": "next", "seed": s}``. No call's inputs exist in the process before the previous call's outputs are
  fixed, so nothing can compute later calls ahead in one batch (a super-batch). The last call's answer adds
  ``"done": [every commitment]``. The judge's clock runs from sending ``go`` to reading ``done``;
- ``{"op": "dump", "path": p, "impl": i}``: the outputs of ``i``'s last round, as safetensors (the judge may
  audit them);
- ``{"op": "bye"}``.

Every answer carries ``seq``, the number of the request it answers: a line the server did not write out of
this loop (candidate code writing to the pipe) breaks the sequence, and the judge refuses the run. Nothing the
server prints matters: the judge reads the pipe only.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

#: the implementations a server may build, and what ``build`` is asked for each
IMPL_BUILDS = {"candidate": "candidate", "best": "candidate", "baseline": "baseline"}


def load_regions(path: str) -> dict[str, Any]:
    """The ``REGIONS`` of the timing module at ``path`` (a file of the tree the server runs in), by name."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("ditgate_lane_timing", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load the lane's timing module {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["ditgate_lane_timing"] = module
    spec.loader.exec_module(module)
    regions = getattr(module, "REGIONS", None)
    if not isinstance(regions, (list, tuple)) or not regions:
        raise RuntimeError(f"{path} declares no REGIONS (a list of pytest_ditgate.timed_region.TimedRegion)")
    return {region.name: region for region in regions}


def thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        import threading

        return threading.active_count()


class Server:
    def __init__(self, regions: dict[str, Any], impls: list[str], read_fd: int, write_fd: int) -> None:
        self.regions = regions
        self.impls = impls
        self.read = os.fdopen(read_fd, "rb", buffering=0)
        self.write_fd = write_fd
        self.built: dict[tuple[str, str], Any] = {}
        self.devices: dict[str, str] = {}
        self.last: dict[str, list[Any]] = {}
        self.seq = 0
        self.buffer = b""
        import torch

        self.torch = torch
        # the real functions, taken before any candidate code runs in this process
        self.synchronize = torch.cuda.synchronize
        self.generator = torch.Generator

    # -- the pipe -------------------------------------------------------------------------------------
    def receive(self) -> dict[str, Any] | None:
        while b"\n" not in self.buffer:
            chunk = os.read(self.read.fileno(), 65536)
            if not chunk:
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        self.seq += 1
        return json.loads(line)

    def answer(self, **fields: Any) -> None:
        payload = (json.dumps({"seq": self.seq, **fields}, separators=(",", ":")) + "\n").encode()
        view = memoryview(payload)
        while view:
            written = os.write(self.write_fd, view)
            view = view[written:]

    # -- the work ---------------------------------------------------------------------------------------
    def device(self, name: str) -> str:
        if name not in self.devices:
            wanted = self.regions[name].device
            cuda = self.torch.cuda.is_available()
            self.devices[name] = ("cuda" if cuda else "cpu") if wanted == "auto" else wanted
        return self.devices[name]

    def sync(self, name: str | None = None) -> None:
        if self.torch.cuda.is_available() and (name is None or self.device(name) == "cuda"):
            self.synchronize()

    def build(self, name: str) -> dict[str, Any]:
        region = self.regions[name]
        reason = region.skip() if region.skip is not None else None
        if reason is None and self.device(name) == "cuda" and not self.torch.cuda.is_available():
            reason = "needs a CUDA device"
        if reason:
            return {"skip": str(reason)}
        for impl in self.impls:
            self.built[(name, impl)] = region.build(IMPL_BUILDS[impl])
        return {"skip": None, "device": self.device(name)}

    def inputs(self, name: str, generator: Any) -> tuple:
        made = self.regions[name].make_inputs(generator)
        return made if isinstance(made, tuple) else (made,)

    def quiet(self) -> None:
        """End torch.compile's worker pool once the functions are built and warm: its processes (one in a session
        of its own) would otherwise run beside the rounds, which the judge refuses."""
        try:
            from torch._inductor.async_compile import shutdown_compile_workers
        except ImportError:
            return
        try:
            shutdown_compile_workers()
        except Exception:  # noqa: BLE001 - no pool, or an older torch: nothing to end
            pass

    def warm(self, name: str, impl: str, seed: int) -> dict[str, Any]:
        fn = self.built[(name, impl)]
        generator = self.generator(device=self.device(name))
        generator.manual_seed(seed)
        took = []
        for _ in range(3):
            args = self.inputs(name, generator)
            self.sync(name)
            start = time.perf_counter()
            fn(*args)
            self.sync(name)
            took.append((time.perf_counter() - start) * 1e3)
        self.quiet()
        return {"ms": sorted(took)[1]}

    def go(self, name: str, impl: str, seed: int, key: int, calls: int) -> dict[str, Any]:
        from pytest_ditgate.experiment.commitment import commit_call

        fn = self.built[(name, impl)]
        generator = self.generator(device=self.device(name))
        outputs, done = [], []
        for call in range(calls):
            if call:  # the judge reveals this call's seed once the previous call's outputs are committed
                self.answer(call=call - 1, commit=done[-1])
                message = self.receive()
                if message is None or message.get("op") != "next":
                    raise RuntimeError(f"the round was interrupted at call {call} of {calls}")
                seed = int(message["seed"])
            generator.manual_seed(seed)
            out = fn(*self.inputs(name, generator))
            done.append(str(commit_call(out, key ^ call)))  # reads a value back: the call has finished
            outputs.append(out)
            del out
        self.sync(name)
        self.last[impl] = outputs
        return {"call": calls - 1, "commit": done[-1], "done": done}

    def dump(self, path: str, impl: str) -> dict[str, Any]:
        from safetensors.torch import save_file

        from pytest_ditgate.experiment.commitment import flatten

        tensors = {}
        for call, out in enumerate(self.last.pop(impl, [])):
            for index, (_, tensor) in enumerate(flatten(out)):
                tensors[f"{call}.{index}"] = tensor.detach().to("cpu").contiguous().clone()
        save_file(tensors, path)
        return {"dumped": len(tensors)}

    def idle(self) -> dict[str, Any]:
        from pytest_ditgate.timer_integrity import tampered_timers

        self.sync()
        replaced = list(tampered_timers())
        if self.torch.cuda.is_available() and self.torch.cuda.synchronize is not self.synchronize:
            replaced.append("torch.cuda.synchronize")
        return {"threads": thread_count(), "replaced": replaced}

    def loop(self) -> None:
        self.answer(ready=True, regions=sorted(self.regions), threads=thread_count(), pid=os.getpid())
        while True:
            message = self.receive()
            if message is None or message.get("op") == "bye":
                return
            op = message.get("op")
            try:
                if op == "build":
                    self.answer(**self.build(message["region"]))
                elif op == "warm":
                    self.answer(**self.warm(message["region"], message["impl"], int(message["seed"])))
                elif op == "idle":
                    self.answer(**self.idle())
                elif op == "go":
                    self.answer(**self.go(message["region"], message["impl"], int(message["seed"]),
                                          int(message["key"]), int(message["calls"])))
                elif op == "dump":
                    self.answer(**self.dump(message["path"], message["impl"]))
                else:
                    self.answer(error=f"unknown request {op!r}")
            except Exception as exc:  # noqa: BLE001 - the candidate's code failed: the judge records it
                from pytest_ditgate.experiment.commitment import NotPlainOutput

                if isinstance(exc, NotPlainOutput):  # an integrity matter, not a crash
                    self.answer(refused=f"{message.get('impl', '?')}: {exc}")
                else:
                    self.answer(error=f"{type(exc).__name__}: {str(exc)[:500]}")


def main(argv: list[str]) -> int:
    timing, impls, read_fd, write_fd = argv[0], argv[1].split(","), int(argv[2]), int(argv[3])
    for impl in impls:
        if impl not in IMPL_BUILDS:
            raise SystemExit(f"unknown implementation {impl!r}")
    try:
        regions = load_regions(timing)
    except Exception as exc:  # noqa: BLE001 - reported to the judge, which refuses the run
        os.write(write_fd, (json.dumps({"seq": 0, "error": f"{type(exc).__name__}: {exc}"}) + "\n").encode())
        return 1
    Server(regions, impls, read_fd, write_fd).loop()
    return 0
