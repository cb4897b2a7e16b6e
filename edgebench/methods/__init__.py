"""The gradient-computation methods: knobs, presets, trainers and the analytic memory model.

`parse_method("lora+ckpt+bf16") -> Method`, `PRESETS`, `make_trainer(method, model, ...)`,
and `edgebench.methods.memory.predict(...)` (estimates, in bytes).
"""

from edgebench.methods.knobs import PRESETS, Method, MethodError, MethodUnavailable, parse_method


def __getattr__(name: str):
    """The trainers load torch; knobs, presets and support tables stay importable without it."""
    if name in ("Trainer", "make_trainer"):
        from edgebench.methods import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["PRESETS", "Method", "MethodError", "MethodUnavailable", "Trainer", "make_trainer", "parse_method"]
