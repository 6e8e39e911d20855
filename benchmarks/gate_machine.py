"""Which processor a benchmark run came from, and the stored baseline that may gate it.

Why. A stored baseline carries its machine's *relative* speeds, and those change with the
processor: Python bytecode and compiled code do not speed up or slow down together. On
2026-12-06 a clean quick-tier run on an Intel Xeon (family 6, model 207) against the baseline
recorded on an AMD EPYC read the native structures x1.12-1.24 and the pure-Python ones
x0.68-1.15 (calibrated against a pure-Python loop), so the gate failed four structures on
unchanged code. No machine factor takes that out: whichever rows it is taken from, one kind of
code reads slower and the other faster. So a baseline gates only runs of its own processor.

How. A run's processor is read from pytest-benchmark's ``machine_info.cpu`` (py-cpuinfo): the
brand string, and the family and model numbers where present (a virtual machine's brand string
can be as vague as "Intel(R) Xeon(R) Processor"). Two processors match when their brands are
equal and, where both sides name a family and model, those are equal too (a baseline reduced
before this module kept the brand only). A run that names no processor (hand-made JSON) matches
anything, since nothing can be checked. :func:`select_baseline` picks, from a directory of
baselines (``benchmarks/baselines/``, one ``<tier>-<processor slug>.json`` each), the one that
matches the runs' processor; :func:`baseline_name` is that file name.

Standard library only, like the rest of the gate.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The ``machine_info.cpu`` keys a reduced baseline keeps (``gate_records.reduce_run``).
CPU_KEYS = ("brand_raw", "vendor_id_raw", "family", "model", "count", "hz_actual_friendly")


@dataclass(frozen=True)
class Processor:
    """A processor as a benchmark run names it."""

    brand: str
    family: int | None = None
    model: int | None = None

    def matches(self, other: Processor) -> bool:
        """Same brand, and the same family and model where both name them."""
        if self.brand != other.brand:
            return False
        if None in (self.family, self.model, other.family, other.model):
            return True
        return (self.family, self.model) == (other.family, other.model)

    def __str__(self) -> str:
        if self.family is None or self.model is None:
            return self.brand
        return f"{self.brand} (family {self.family}, model {self.model})"

    @property
    def slug(self) -> str:
        """A file-name form: ``intel-xeon-processor-f6-m207``."""
        brand = re.sub(r"\((?:r|tm)\)", "", self.brand, flags=re.IGNORECASE)
        words = re.findall(r"[a-z0-9]+", brand.lower())
        if self.family is not None and self.model is not None:
            words += [f"f{self.family}", f"m{self.model}"]
        return "-".join(words) or "unknown"


def processor(machine_info: Mapping[str, Any] | None) -> Processor | None:
    """The processor a run's ``machine_info`` names (None: it names none)."""
    cpu = (machine_info or {}).get("cpu") or {}
    brand = str(cpu.get("brand_raw") or "").strip()
    if not brand:
        return None
    family, model = cpu.get("family"), cpu.get("model")
    if not (isinstance(family, int) and isinstance(model, int)):
        family = model = None
    return Processor(brand, family, model)


def processor_of(path: Path) -> Processor | None:
    """The processor of the pytest-benchmark JSON file at ``path`` (full or reduced form)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # load_records reports an unreadable file with its reason
    return processor(data.get("machine_info") if isinstance(data, dict) else None)


def common_processor(paths: Iterable[Path]) -> tuple[Processor | None, list[str]]:
    """The processor the runs at ``paths`` share (None if none names one), and a problem
    line for each run whose processor differs from the first one named."""
    found: Processor | None = None
    problems = []
    for path in paths:
        named = processor_of(path)
        if named is None:
            continue
        if found is None:
            found = named
        elif not found.matches(named):
            problems.append(f"{path} ran on {named}, not on {found}")
    return found, problems


def baseline_name(tier: str, cpu: Processor) -> str:
    """The file name of ``tier``'s baseline for ``cpu`` (``quick-amd-epyc.json``)."""
    return f"{tier}-{cpu.slug}.json"


def stored_baselines(directory: Path, tier: str) -> dict[Path, Processor | None]:
    """``tier``'s baselines in ``directory`` (``<tier>-*.json``), each with its processor."""
    if not directory.is_dir():
        return {}
    return {path: processor_of(path) for path in sorted(directory.glob(f"{tier}-*.json"))}


def select_baseline(directory: Path, tier: str, cpu: Processor | None) -> tuple[Path, Processor]:
    """The stored baseline of ``tier`` in ``directory`` recorded on ``cpu``, and the processor
    it names.

    Raises:
        LookupError: the runs name no processor, or no stored baseline matches it; the message
            says which are stored and how to record one.
    """
    stored = stored_baselines(directory, tier)
    if cpu is None:
        raise LookupError(
            "the runs do not say which processor ran them (no machine_info.cpu), so no stored "
            "baseline can be chosen for them: pass --baseline"
        )
    matching = [path for path, held in stored.items() if held is not None and held.matches(cpu)]
    if matching:
        # An exact family/model match beats a brand-only one (an older reduced baseline).
        exact = [path for path in matching if stored[path] == cpu]
        chosen = (exact or matching)[0]
        return chosen, stored[chosen] or cpu
    held = ", ".join(f"{path.name} ({p})" for path, p in stored.items()) or "none"
    raise LookupError(
        f"no stored {tier}-tier baseline was recorded on this processor, {cpu} (stored: "
        f"{held}). A baseline gates only runs of the processor that recorded it: Python "
        "bytecode and compiled code change speed by different factors between processors. "
        "Record one from clean runs of the code to gate against: delayindex bench "
        f"--record-baseline (writes {directory / baseline_name(tier, cpu)})"
    )
