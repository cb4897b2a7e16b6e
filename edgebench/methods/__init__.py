"""The gradient-computation methods: knobs, presets, trainers and the analytic memory model.

`parse_method("lora+ckpt+bf16") -> Method`, `PRESETS`, `make_trainer(method, model, ...)`,
and `edgebench.methods.memory.predict(...)` (estimates, in bytes).
"""

from edgebench.methods.knobs import PRESETS, Method, MethodError, MethodUnavailable, parse_method
from edgebench.methods.trainer import Trainer, make_trainer

__all__ = ["PRESETS", "Method", "MethodError", "MethodUnavailable", "Trainer", "make_trainer", "parse_method"]
