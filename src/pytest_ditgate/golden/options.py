"""Options of the golden store and the fixed-paths lock (light: imported at every pytest start)."""

from __future__ import annotations

from pytest_ditgate.options import OptionSpec

FREEZE = OptionSpec("--ditgate-freeze", "write goldens that are missing for this device (existing ones are "
                                        "compared, never overwritten); also rewrites the fixed-paths lock at the "
                                        "end of the run", kind="bool")
REFREEZE = OptionSpec("--ditgate-refreeze", "OVERWRITE the goldens of every test that runs (deliberate "
                                            "baseline change; reported loudly); also rewrites the fixed-paths lock",
                      kind="bool")
GOLDEN_DIR = OptionSpec("--ditgate-golden-dir", "golden store folder (manifest.json + <device key>/*.safetensors); "
                                                "default: <rootdir>/golden")
RELOCK = OptionSpec("--ditgate-relock", "rewrite the fixed-paths lock from the files as they are now "
                                        "(a deliberate change of corpus, goldens, evaluator or baseline)", kind="bool")
OPTIONS = (FREEZE, REFREEZE, GOLDEN_DIR, RELOCK)
