"""The experiment judge: ``ditgate baseline`` / ``ditgate experiment`` own a lane's run.

The candidate's code runs only in a child pytest process that writes its outputs (safetensors) and raw
timing samples (JSON) to a fresh folder; this package, imported by the deciding process from fixed paths,
checks scope and integrity against the lane's anchors, compares those outputs with the goldens under the
quality contract, re-derives the speed ratios from the raw samples and appends the verdict to the lane's
hash-chained history. See ``docs/agent_loop.md`` for the threat model.
"""
