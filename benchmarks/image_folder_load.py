"""Load time of an ImageFolder dataset: the first load (decode every image) against a cached one.

    python benchmarks/image_folder_load.py [--path cifar10_jpeg] [--data-root PATH]
                                          [--repeats 2] [--json out.json]

Each repeat, in one process and interleaved, loads the dataset twice through
``load_dataset("image_folder", ...)``: first with an empty decode cache (a fresh temporary
``$FEDCOMM_CACHE_DIR``: list, hash, decode, write the cache, convert), then again (list, hash,
read and check the cache, convert). Phases come from timing wrappers around the loader's own
functions (listing, content hash, decode, cache read / write; wall seconds) and the process's CPU
seconds, steadier than wall time on a shared machine. The image files are read once
before timing, so both loads see the OS page cache warm (the first load of a cold disk adds
its read time). Report the machine's load average beside the numbers (printed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest.mock import patch

from fedcomm.data.datasets import image_cache, image_files, image_folder
from fedcomm.data.datasets.registry import load_dataset
from fedcomm.data.datasets.verify import DATA_ROOT_ENV

PHASES = ("list_images", "content_digests", "decode", "read_cache", "write_cache")
_CALLER = {"list_images": image_folder, "content_digests": image_folder}  # else image_cache


def _timed(phases: dict[str, float], name: str) -> Callable[..., Any]:
    real = getattr(_CALLER.get(name, image_cache), name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            phases[name] = phases.get(name, 0.0) + time.perf_counter() - t

    return wrapper


def load_once(root: Path, path: str, cache_dir: Path) -> dict[str, float]:
    """One load with ``cache_dir`` as the decode cache: total and per-phase seconds."""
    phases: dict[str, float] = {}
    os.environ[image_cache.CACHE_ENV] = str(cache_dir)
    patches = [patch.object(_CALLER.get(n, image_cache), n, _timed(phases, n)) for n in PHASES]
    for p in patches:
        p.start()
    try:
        t, cpu = time.perf_counter(), time.process_time()
        ds = load_dataset("image_folder", root, path=path)
        phases["total"] = time.perf_counter() - t
        phases["cpu"] = time.process_time() - cpu  # this process's CPU seconds (all threads)
    finally:
        for p in patches:
            p.stop()
    phases["images"] = float(len(ds))
    return phases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--path", default="cifar10_jpeg")
    ap.add_argument("--data-root", default=os.environ.get(DATA_ROOT_ENV, "../shared/data"))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    root = Path(args.data_root)
    listing = image_files.list_images(root / args.path)
    image_files.content_digests(listing)  # warm the page cache: both loads read warm files
    rows: dict[str, list[dict[str, float]]] = {"first": [], "cached": []}
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            rows["first"].append(load_once(root, args.path, Path(tmp)))
            rows["cached"].append(load_once(root, args.path, Path(tmp)))
    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else []
    out: dict[str, Any] = {"path": args.path, "loadavg": load, "repeats": args.repeats}
    for kind, runs in rows.items():
        keys = sorted({k for r in runs for k in r})
        out[kind] = {k: statistics.median(r.get(k, 0.0) for r in runs) for k in keys}
        phases = ", ".join(f"{k} {out[kind][k]:.2f}" for k in PHASES if out[kind].get(k))
        total, cpu = out[kind]["total"], out[kind]["cpu"]
        print(
            f"{kind:>6}: {total:.2f} s wall, {cpu:.2f} s CPU, median of {args.repeats} ({phases})"
        )
    print(f"load average {' '.join(load)}; {int(out['first']['images'])} images")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
