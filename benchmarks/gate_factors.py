"""How the regression gate (``gate.py``) takes the machine's speed out of a record's figure.

A record's *share* is its time figure in the run over the same record's figure in the baseline.
The machine's speed moves every share alike, so a record's *change* is its share over a
*machine factor*: the median share of a set of other records. The set decides what a slowdown
can hide, so each check has its own:

* **One structure** (:func:`kind_factors`): its records over the median share of every record
  of the *other* kinds, the references included. A slowdown of the structure cannot move its
  own factor, so it reads in full. The run-wide median this replaced took in the structure's
  own records: a 1.3x slowdown of DelayIndex (a quarter of the quick tier's time records) read
  as 1.2x.
* **All our structures together** (:data:`ALL_KINDS`): over the median share of the
  *references* only (heapq, SortedList and Redis rows: code this project never changes), so a
  slowdown of everything we own shows too. The run-wide median absorbed that: every structure
  1.3x slower read 1.03-1.12x. With fewer than :data:`MIN_REFERENCES` references, every record
  counts.
* **One record** (:func:`local_factors`): over the median share of the records run just before
  and after it, since a shared machine has slow stretches that no run-wide factor sees.

Plain numbers in and out (keys are ``(group, name)``); standard library only.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Iterable, Mapping, Sequence

Key = tuple[str, str]
#: The pseudo-structure of the check over all our structures at once.
ALL_KINDS = "all structures"
#: Fewest reference records the :data:`ALL_KINDS` factor is taken from.
MIN_REFERENCES = 5
#: Time records on each side of a record whose median share is its local machine factor:
#: about six seconds of the quick tier each way, inside the slow stretches seen (about 20 s).
LOCAL_WINDOW = 6


def median_share(shares: Mapping[Key, float], keys: Iterable[Key] | None = None) -> float:
    """The median of ``shares`` over ``keys`` (default: all of them); 1.0 when there are none."""
    values = [shares[key] for key in (shares if keys is None else keys) if key in shares]
    return statistics.median(values) if values else 1.0


def kind_factors(
    shares: Mapping[Key, float], kinds: Mapping[Key, str], reference_kinds: Collection[str]
) -> dict[str, float]:
    """The machine factor of each kind present in ``shares`` (the median share of every other
    kind's records; all records when it is the only kind), and of :data:`ALL_KINDS` (the
    median share of the records of ``reference_kinds``)."""
    present = {kinds.get(key, "") for key in shares}
    out = {}
    for kind in present:
        others = [key for key in shares if kinds.get(key, "") != kind]
        out[kind] = median_share(shares, others or None)
    references = [key for key in shares if kinds.get(key, "") in reference_kinds]
    out[ALL_KINDS] = median_share(shares, references if len(references) >= MIN_REFERENCES else None)
    return out


def local_factors(shares: Mapping[Key, float], order: Sequence[Key]) -> dict[Key, float]:
    """Each record's *local* machine factor: the median share of the :data:`LOCAL_WINDOW`
    records of ``shares`` run before it and after it (``order``: the run's execution order, as
    pytest-benchmark lists its records), itself excluded.

    A shared machine has slow stretches: in one clean run, every benchmark of a 20-second
    stretch (codec decode, reopen, replay; reference rows too) ran 1.5-1.6x slower. A run-wide
    factor does not see a stretch, a local one does; a regression of one operation does not move
    its neighbours' median. Records with fewer than three neighbours get no local factor."""
    timed = [key for key in order if key in shares]
    values = [shares[key] for key in timed]
    out = {}
    for i, key in enumerate(timed):
        window = values[max(i - LOCAL_WINDOW, 0) : i] + values[i + 1 : i + 1 + LOCAL_WINDOW]
        if len(window) >= 3:
            out[key] = statistics.median(window)
    return out
