"""Run a function on every host at once; never stop half-way; report every failure.

Like fabric's Group: each host gets its own result, and one host failing does
not hide (or cancel) the others. Failures are raised together at the end.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence, TypeVar

from kit.errors import HostsFailed, KitError

T = TypeVar("T")
K = TypeVar("K")

MAX_PARALLEL = 32


def fan_out(what: str, items: Sequence[K], fn: Callable[[K], T], name: Callable[[K], str] = str) -> list[T]:
    """fn(item) for every item in parallel; results in the items' order, or HostsFailed naming each failure."""
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=min(len(items), MAX_PARALLEL)) as pool:
        futures = [pool.submit(fn, item) for item in items]
    results, failures = [], {}
    for item, future in zip(items, futures):
        try:
            results.append(future.result())
        except KitError as e:
            failures[name(item)] = e
        except Exception as e:  # noqa: BLE001 - an unexpected error on one host is still that host's failure
            failures[name(item)] = KitError(f"{type(e).__name__}: {e}", host=name(item))
    if failures:
        raise HostsFailed(what, failures)
    return results
