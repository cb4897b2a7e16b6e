"""Lowering the training step for on-device runtimes (host side).

`pipeline.export(ExportRequest(...))` -> an export directory with manifest.json, through
a content-keyed cache; `executorch.py` (.pte joint forward-backward program),
`onnxruntime.py` (ONNX Runtime training artifacts), `manifest.py` (request, manifest, cache);
the `edgebench export` command is the fleet's (edgebench/fleet/export.py).
"""
