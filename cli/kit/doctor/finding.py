"""A finding of `kit doctor` (one check on one host: ok, warn or fail, with its fix), in a module of its own so that
the pure judges a preflight shares with doctor (kit.doctor.gpuhealth) need not import doctor's reading."""

from __future__ import annotations

from dataclasses import asdict, dataclass

OK, WARN, FAIL = "ok", "warn", "fail"


@dataclass(frozen=True)
class Finding:
    host: str
    check: str
    level: str   # ok, warn, fail
    text: str
    fix: str = ""

    def as_dict(self) -> dict:
        return asdict(self)
