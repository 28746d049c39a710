"""``python -m bench.collections``: a collection's write protocol under contention, and one add
into a large collection (tilecommit/catalog; docs/catalog.md).

1. The race: ``--items`` publications (default 32), each delivered twice, released at once by a
   barrier into one collection, ``--rounds`` times (a fresh collection each), on Azurite held to
   Azure's rules (testkit/strict_storage.py). Printed: the items listed (lost, doubled), the
   refused conditional writes (412s, and 409s of a create) and the writes sent per publication,
   beside the contention lab's independent-attempt model (bench/contention.py): every write
   refused with one probability p, independently, p measured as refusals / writes sent. A
   publication whose writes landed ``s`` times (its successes: writes sent - refusals) then has
   k refusals with the negative binomial probability C(k + s - 1, k) p^k (1 - p)^s; the expected
   histogram is that summed over the publications, and the dispersion index is the observed
   variance of k over the model's (1: the model; > 1: refusals cluster on some publications).
2. The large collection: ``--entries`` index entries (default 10,000 and 100,000) generated
   into the pages and the collection document, then one more item added: its wall time, the
   peak of Python's allocations during it (tracemalloc) and the sizes of the documents it read
   and wrote, against one activity's budget (the function's timeout, Consumption's 1.5 GB).

Prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import statistics
import threading
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor

from tilecommit.catalog import collections, documents
from tilecommit.retries import FUNCTION_TIMEOUT_S
from tilecommit.settings import CONSUMPTION_INSTANCE_MB


def made_entry(n: int, *, salt: str = "") -> dict:
    """The index entry of a made-up item ``n``: a 0.05-degree square on a grid over Europe."""
    job_id = hashlib.sha256(f"{salt}/{n}".encode()).hexdigest()[:16]
    west, south = -10.0 + (n % 400) * 0.1, 35.0 + (n // 400 % 250) * 0.1
    item = {
        "id": job_id,
        "bbox": [west, south, west + 0.05, south + 0.05],
        "properties": {
            "datetime": f"2026-{1 + n % 12:02d}-{1 + n % 28:02d}T10:00:00Z",
            "proj:code": "EPSG:32632",
            "proj:shape": [1000, 1000],
            "tilecommit:profile": {"name": "default"},
            "tilecommit:overview_levels": 2,
        },
    }
    return documents.entry(
        item, item_blob=f"mosaics/{job_id}/item.json", mosaic_blob=f"mosaics/{job_id}/mosaic.tif", item_sha256="0" * 64
    )


def race(output, items: int, rounds: int) -> dict:
    """``rounds`` x (``items`` publications delivered twice each, all at once); per publication
    (refusals, writes sent), and what each round's documents list."""
    publications: list[tuple[int, int]] = []
    failures, lost, doubled = 0, 0, 0
    for rnd in range(rounds):
        collection = f"race-{rnd}"
        entries = [made_entry(n, salt=collection) for n in range(items)]
        adders = entries * 2
        barrier = threading.Barrier(len(adders))

        def add(entry: dict, barrier=barrier, collection=collection):
            barrier.wait()
            try:
                return collections.add_item(output, collection, entry, job_id=entry["id"])
            except Exception as exc:  # noqa: BLE001 - counted: the activity would be retried
                return exc

        with ThreadPoolExecutor(len(adders)) as pool:
            results = list(pool.map(add, adders))
        for result in results:
            if isinstance(result, Exception):
                failures += 1
            else:
                publications.append((result.conflicts, result.attempts))
        listed: list[str] = []
        doc, _ = collections.read_document(output, documents.collection_blob_name(collection))
        for key in (doc or {}).get(documents.PAGE_RECORDS, {}):
            page, _ = collections.read_document(output, documents.page_blob_name(collection, key))
            listed += list((page or {}).get(documents.ITEMS, {}))
        lost += len({e["id"] for e in entries} - set(listed))
        doubled += len(listed) - len(set(listed))
    return {"publications": publications, "failures": failures, "lost": lost, "doubled": doubled}


def model(publications: list[tuple[int, int]]) -> dict:
    """The independent-attempt model's p, expected histogram of refusals per publication, and
    the dispersion index (the module's description)."""
    refusals = [k for k, _ in publications]
    sent = sum(a for _, a in publications)
    p = sum(refusals) / sent if sent else 0.0
    top = max(refusals, default=0)
    expected = [0.0] * (top + 1)
    means, variances = [], []
    for k_seen, attempts in publications:
        s = attempts - k_seen
        if s <= 0:
            means.append(0.0)
            variances.append(0.0)
            continue
        for k in range(top + 1):
            expected[k] += math.comb(k + s - 1, k) * p**k * (1 - p) ** s
        means.append(s * p / (1 - p) if p < 1 else 0.0)
        variances.append(s * p / (1 - p) ** 2 if p < 1 else 0.0)
    observed = [refusals.count(k) for k in range(top + 1)]
    model_var = statistics.fmean(variances) if variances else 0.0
    seen_var = statistics.pvariance(refusals) if len(refusals) > 1 else 0.0
    return {
        "p": p,
        "observed": observed,
        "expected": expected,
        "dispersion": seen_var / model_var if model_var else float("nan"),
        "model_mean": statistics.fmean(means) if means else 0.0,
    }


def print_race(items: int, rounds: int, outcome: dict) -> None:
    pubs = outcome["publications"]
    refusals = [k for k, _ in pubs]
    sent = [a for _, a in pubs]
    fitted = model(pubs)
    print(f"\n== {items} publications, each delivered twice, all at once into one collection; {rounds} rounds ==")
    print(
        f"items lost {outcome['lost']}, doubled {outcome['doubled']}; publications that ran out of their budget "
        f"(the activity retried) {outcome['failures']}"
    )
    print(
        f"refused writes (412/409) per publication: mean {statistics.fmean(refusals):.2f}, max {max(refusals)}, "
        f"total {sum(refusals)}; writes sent per publication: mean {statistics.fmean(sent):.2f}, max {max(sent)}"
    )
    print(
        f"independent-attempt model: p = {fitted['p']:.3f} (refusals / writes sent), mean refusals "
        f"{fitted['model_mean']:.2f}; dispersion index {fitted['dispersion']:.2f} (1: the model)"
    )
    print("refusals k | publications observed | expected by the model")
    for k, (seen, expected) in enumerate(zip(fitted["observed"], fitted["expected"], strict=True)):
        if seen or expected >= 0.05:
            print(f"{k:>10} | {seen:>21} | {expected:>21.1f}")
    print(f"{'more':>10} | {0:>21} | {len(pubs) - sum(fitted['expected']):>21.1f}")


def generate(output, collection: str, entries: int) -> None:
    """``entries`` made-up entries written straight into the collection's pages and document."""
    by_page: dict[str, list[dict]] = {}
    for n in range(entries):
        entry = made_entry(n, salt=collection)
        by_page.setdefault(documents.page_key(entry["id"]), []).append(entry)
    doc = None
    base = output.url.rstrip("/") + "/"
    for key, listed in sorted(by_page.items()):
        *first, last = listed
        seed = {documents.ITEMS: {e["id"]: e for e in first}, documents.REVISION: len(first)}
        page = documents.page_with(seed, collection, key, last, base + last["mosaic"])
        assert page is not None
        output.upload_blob(documents.page_blob_name(collection, key), documents.canonical(page), overwrite=True)
        # What the page's entries add to the document, in two merges (its earliest and its latest
        # item, each given the page's bounds), not one per entry: the same document, made faster.
        moments = sorted(listed, key=lambda e: e["datetime"])
        for end in (moments[0], moments[-1]):
            doc = documents.collection_with(doc, collection, {**end, "bbox": page["bounds"]}, key, page) or doc
    assert doc is not None
    output.upload_blob(documents.collection_blob_name(collection), documents.canonical(doc), overwrite=True)


def one_add(output, entries: int) -> None:
    collection = f"large-{entries}"
    started = time.perf_counter()
    generate(output, collection, entries)
    made_s = time.perf_counter() - started
    entry = made_entry(entries + 1, salt="the new one")
    tracemalloc.start()
    started = time.perf_counter()
    added = collections.add_item(output, collection, entry)
    took = time.perf_counter() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    page = output.get_blob_client(added.index_blob).get_blob_properties().size
    doc = output.get_blob_client(added.collection_blob).get_blob_properties().size
    print(
        f"\n== one add into a collection of {entries:,} entries (generated in {made_s:.1f} s) ==\n"
        f"{added.outcome}, revision {added.revision}: {took * 1000:.0f} ms, peak Python allocations "
        f"{peak / 2**20:.1f} MiB; read and wrote its page ({page / 1024:.0f} KiB) and the collection document "
        f"({doc / 1024:.0f} KiB). Budget of one activity: {FUNCTION_TIMEOUT_S} s, {CONSUMPTION_INSTANCE_MB} MB."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.collections", description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--entries", default="10000,100000", help="sizes of the generated collections, comma-separated")
    args = parser.parse_args(argv)
    import logging

    logging.getLogger("tilecommit").setLevel(logging.WARNING)  # every refusal is logged at INFO
    from devhost.azurite import Azurite
    from testkit.strict_storage import StrictStorage
    from tilecommit.storage import StorageConnection

    with Azurite() as emulator, StrictStorage(emulator) as strict:
        blobs = StorageConnection.from_connection_string(strict.connection_string).blob_service()
        output = blobs.get_container_client("bench-collections")
        output.create_container()
        print_race(args.items, args.rounds, race(output, args.items, args.rounds))
        for entries in (int(e) for e in args.entries.split(",") if e.strip()):
            one_add(output, entries)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
