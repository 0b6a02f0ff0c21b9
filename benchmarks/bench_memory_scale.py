"""Memory as it grows: one session at 1k, 10k and 100k turns, and 1,000 sessions x 100 turns.

Each configuration runs in a fresh child process (so its RSS is its own) on a SQLite file
(WAL), through the engine's own API: the LoCoMo dialogue turns, cycled with renamed speakers,
are stored raw with ``MemoryEngine.store_turns`` in chunks of 500 and derived after each chunk
with ``MemoryEngine.derive`` (tags and compaction, as the background worker does; an 8k-token
window so compaction fires). Reported per configuration:

* write rate (store + derive, turns/s) and, with the default embedder, the embedding catch-up;
* recall (``on_message_inbound``, LoCoMo questions, 2,048-token budget) p50/p95, keyword-only
  (``embedder=None``) and with the default embedder (MiniLM; vectors embedded before timing);
* the first recall after a compaction (turns appended and derived, then ``compact``) and after
  a restart (a fresh engine on the same store; the embedder's model stays loaded), each beside
  the steady p50: the median of ``FIRSTS`` rounds (each with its own question; every sample
  is in the JSON). They run after both steady phases, since their compactions grow the
  session by ``grow`` turns: the steady recalls see the size the run is named for, and each
  phase of first recalls starts from a copy of the store as they saw it;
* the first recall after a restart of the session as ingested, stored and derived but never
  recalled (a bulk import, then a restart): ``FIRSTS`` fresh engines, each on a fresh copy of
  the store as the writes left it, keyword only and, with ``--synthetic-vectors``, with the
  embedder (random vectors stored first, the last turns embedded by the model, by an engine
  closed before any recall);
* the process RSS after each phase and the vectors' own size (turns x 384 x 4 bytes);
* side by side: the runs' stores are kept, then reopened in one last child process whose
  steady recalls (each run's same questions, keyword-only, then with the embedder) are timed
  in three alternating rounds, so the sizes are compared under the same machine load; the runs
  themselves are minutes apart, and on a shared 2-core machine the load drifts between them.
  Each engine caches its own query vectors (one model, loaded once): a cache shared by the
  runs would embed each question once, for the first run only.

Steady means after the reads a first recall starts in the background are done
(``Recaller.settle`` after one warm-up recall): a session of 20,000 vectors or more has them
read by the recaller's worker, not the recall, and until then its recalls go without the
dense signal; at 100k turns that read outlasted the 60 timed recalls, which then measured no
dense scan at all (the runs before this one did).

The embedder runs only where the configuration's embedded turns are at most ``--embed-max``
(default 10,000: embedding 100k turns on a shared 2-core machine takes longer than the rest of
the run); the 1,000-session run embeds the sessions its questions ask (every session is
embedded only with ``--embed-max`` >= 100,000). With ``--synthetic-vectors`` the turns past
``--embed-max`` get random unit vectors instead (stored under the embedder's name, so recall
scans a full matrix of the session's size; the query is still embedded by MiniLM): the dense
recall's cost is measured at every size, its ranking is not; and with them the relevance
floors are off (``recall.relevance_floor`` and ``unknown_name_floor``): no random vector comes
near a real question, so the floor would withhold every recall's memory and the dense timing
would leave out the assembly. ``--sizes`` picks the runs.

Run: ``python benchmarks/bench_memory_scale.py`` (``--quick`` for the smoke test).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import _common as common
from contextfold.items import Message
from contextfold.memory.config import MemoryConfig
from contextfold.memory.engine import MemoryEngine
from contextfold.retrieval.embedders import CachedEmbedder, default_embedder
from contextfold.store.sqlite.memory import MemoryStore

CHUNK = 500  # turns stored per store_turns call, derived after each
NAMES = [
    "Avery", "Blake", "Camille", "Dmitri", "Elena", "Farid", "Greta", "Hiro", "Imani", "Jonas",
    "Keiko", "Lars", "Mateo", "Nadia", "Oskar", "Priya", "Quinn", "Rosa", "Soren", "Tala",
]  # fmt: skip
DIM = 384
WARM_UP = "What did we talk about before?"  # a warm-up recall's message, never timed
FIRSTS = 3  # first recalls timed after a compaction, and after a restart (the median reported)
ROUNDS = 3  # alternating rounds of the side-by-side phase
INGEST_EMBEDDED = 20  # the as-ingested session's last turns embedded by the model (the rest random)


def rss_mb() -> float:
    """This process's resident set size now (Linux; peak RSS elsewhere)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return common.peak_rss_mb()


def messages(turns: list[common.Turn], start: int, count: int) -> list[Message]:
    """``count`` dialogue messages from position ``start`` of the endless cycle of LoCoMo
    turns; each cycle renames the two speakers of every conversation."""
    out = []
    for i in range(start, start + count):
        cycle, turn = divmod(i, len(turns))
        t = turns[turn]
        base = (cycle * 7 + t.conversation * 3) % len(NAMES)
        speaker = NAMES[base] if t.first_speaker else NAMES[(base + 1) % len(NAMES)]
        role = "user" if t.first_speaker else "assistant"
        out.append(Message(role=role, content=f"{speaker}: {t.text}"))
    return out


def timed(fn: Any) -> float:
    return common.time_call(fn).wall * 1000


def steady(engine: MemoryEngine, asks: list[tuple[str, str]]) -> dict[str, Any]:
    samples = common.Samples()
    for sid, question in asks:
        samples.add(
            common.time_call(
                lambda s=sid, q=question: engine.on_message_inbound(q, session_id=s, budget=2048)
            )
        )
    return samples.stats()


def firsts(
    engine: MemoryEngine,
    sid: str,
    questions: list[str],
    turns: list[common.Turn],
    at: int,
    grow: int,
    reopen: Any,
) -> tuple[MemoryEngine, int, dict[str, Any]]:
    """``FIRSTS`` first recalls after a compaction (``grow`` turns in all appended before
    them, a share before each: the session ends as large as with one compaction), then
    ``FIRSTS`` after a restart (``reopen()``: a fresh engine on the same store), each with the
    next of ``questions`` and then the same question again on the now warm engine: the
    medians, every sample (ms) and each first ÷ its question again (a question's own cost,
    which varies several-fold between questions, cancels; the question again is if anything
    cheaper than a steady recall of a new one, its words' rows and forms just read)."""
    asked = iter(questions)
    compaction: list[tuple[float, float]] = []
    for _ in range(FIRSTS):
        at = grow_and_compact(engine, sid, turns, at, max(1, grow // FIRSTS))
        compaction.append(twice(engine, sid, next(asked)))
    restart: list[tuple[float, float]] = []
    opened = []
    for _ in range(FIRSTS):
        engine.close()
        started = time.perf_counter()
        engine = reopen()
        opened.append((time.perf_counter() - started) * 1000)
        restart.append(twice(engine, sid, next(asked)))
    out: dict[str, Any] = {"restart_open_ms": float(np.median(opened))}
    out.update(paired("after_compaction", compaction))
    out.update(paired("after_restart", restart))
    return engine, at, out


def twice(engine: MemoryEngine, sid: str, question: str) -> tuple[float, float]:
    """``question``'s recall timed (ms), then the same again."""

    def ask() -> Any:
        return engine.on_message_inbound(question, session_id=sid, budget=2048)

    return timed(ask), timed(ask)


def paired(name: str, pairs: list[tuple[float, float]]) -> dict[str, Any]:
    """First recalls and their questions again (``twice``): the median first, every sample,
    and the median of each first ÷ its question again."""
    return {
        f"{name}_ms": float(np.median([first for first, _ in pairs])),
        f"{name}_samples_ms": [first for first, _ in pairs],
        f"{name}_again_samples_ms": [again for _, again in pairs],
        f"{name}_paired": float(np.median([first / again for first, again in pairs])),
    }


def after_ingest(
    folder: Path, config: MemoryConfig, sid: str, questions: list[str], embedder: Any
) -> dict[str, Any]:
    """The first recalls after a restart of a session as ingested (stored and derived, never
    recalled): each of ``questions`` asked by a fresh engine on a fresh copy of the store as
    the writes left it (``twice``), keyword only; then, with ``embedder`` (``None``: not
    measured), the same on a copy given random vectors first (``random_vectors``, all but the
    last ``INGEST_EMBEDDED`` turns', which the model embeds as a derive would, by an engine
    closed before any recall), with the embedder (no query-vector cache: the question again
    embeds too). The store is left as written."""
    path = folder / "memory.db"
    written = folder.with_name(folder.name + "-ingested")
    shutil.copytree(folder, written)
    out: dict[str, Any] = {}
    try:
        for kind in ("keyword", "dense"):
            model = None
            if kind == "dense":
                if embedder is None:
                    break
                model = CachedEmbedder(embedder.inner, max_entries=0)
                engine = MemoryEngine(config, store=MemoryStore(path), embedder=model)
                random_vectors(engine, sid, leave=INGEST_EMBEDDED)
                engine.recaller.ensure_vectors(sid)  # the last turns: embedded, as a derive
                engine.close()
            start = folder.with_name(folder.name + "-start")
            shutil.copytree(folder, start)
            pairs = []
            for n, question in enumerate(questions):
                if n:
                    shutil.rmtree(folder)
                    shutil.copytree(start, folder)
                engine = MemoryEngine(config, store=MemoryStore(path), embedder=model)
                pairs.append(twice(engine, sid, question))
                engine.close()
            shutil.rmtree(start)
            out[kind] = paired("after_ingest_restart", pairs)
            shutil.rmtree(folder)
            shutil.copytree(written, folder)
    finally:
        shutil.rmtree(written, ignore_errors=True)
    return out


def grow_and_compact(
    engine: MemoryEngine, sid: str, turns: list[common.Turn], at: int, count: int
) -> int:
    """Append ``count`` turns to ``sid``, derive them, and force a compaction."""
    engine.store_turns(sid, messages(turns, at, count))
    engine.derive(sid)
    engine.compact(session_id=sid)
    return at + count


def random_vectors(engine: MemoryEngine, sid: str, leave: int = 0) -> None:
    """Random unit vectors for every turn of ``sid`` but its last ``leave``, stored as the
    engine's embedder's."""
    model = engine.recaller._model
    last = engine.store.last_seq(sid) - leave
    rng = np.random.default_rng(22)
    for start in range(1, last + 1, 5_000):
        seqs = list(range(start, min(start + 5_000, last + 1)))
        rows = rng.standard_normal((len(seqs), DIM)).astype(np.float32)
        rows /= np.linalg.norm(rows, axis=1, keepdims=True)
        engine.store.add_turn_vectors(sid, model, seqs, rows)


def run_config(spec: dict[str, Any], data_dir: Path) -> dict[str, Any]:
    sessions, per_session = spec["sessions"], spec["turns_per_session"]
    turns = common.locomo_turns(data_dir)
    questions = common.locomo_questions(data_dir)
    rng = random.Random(22)
    rng.shuffle(questions)
    folder = Path(tempfile.mkdtemp(prefix="cf-bench-scale-"))
    snapshot = folder.with_name(folder.name + "-steady")  # (see the first recalls below)
    path = folder / "memory.db"
    settings: dict[str, Any] = {"context_window": 8192}
    if spec.get("synthetic_vectors"):  # (see the module docstring)
        settings["recall"] = {"relevance_floor": None, "unknown_name_floor": None}
    config = MemoryConfig.model_validate(settings)
    out: dict[str, Any] = {**spec, "rss_mb": {"start": rss_mb()}}
    try:
        engine = MemoryEngine(config, store=MemoryStore(path), embedder=None)
        engine.counter.count("warm up")
        sids = [f"s{n:04d}" for n in range(sessions)]
        position = 0
        started = time.perf_counter()
        for sid in sids:
            for at in range(0, per_session, CHUNK):
                n = min(CHUNK, per_session - at)
                engine.store_turns(sid, messages(turns, position, n))
                engine.derive(sid)
                position += n
        wall = time.perf_counter() - started
        total = sessions * per_session
        out["write"] = {"turns": total, "seconds": round(wall, 2), "turns_per_s": total / wall}
        out["rss_mb"]["after_write"] = rss_mb()
        n_q = spec["questions"]
        asked = [rng.choice(sids) for _ in range(n_q)]
        asks = list(zip(asked, questions[:n_q], strict=True))
        later = questions[n_q:]  # the first recalls' questions: 2 x FIRSTS a phase
        target = asked[0]
        engine.close()
        # With random vectors (every run's with ``--embed-max 0``) the dense first recalls
        # too, the model loaded here (and kept for the dense phase: one model a process).
        model = None
        if spec["embedder"] and spec.get("synthetic_vectors") and per_session > spec["embed_max"]:
            model = default_embedder()
            model.embed(["warm up"])
        ingested = after_ingest(folder, config, target, later[4 * FIRSTS : 5 * FIRSTS], model)
        engine = MemoryEngine(config, store=MemoryStore(path), embedder=None)
        # The steady recalls first, keyword only then with the embedder, on the session as
        # written; then the first recalls, which grow it (``grow`` turns per phase).
        engine.on_message_inbound(questions[-1], session_id=target, budget=2048)  # warm
        engine.recaller.settle()  # the reads that recall started (see the module docstring)
        kw: dict[str, Any] = {"steady": steady(engine, asks), **ingested["keyword"]}
        engine.close()
        out["keyword"] = kw
        out["rss_mb"]["after_keyword"] = rss_mb()
        embedded = (sessions if total <= spec["embed_max"] else len(set(asked))) * per_session
        synthetic = spec.get("synthetic_vectors", False) and embedded > spec["embed_max"]
        embedder = None
        if spec["embedder"] and (embedded <= spec["embed_max"] or synthetic):
            embedder = model or default_embedder()
            embedder.embed(["warm up"])
            engine = MemoryEngine(config, store=MemoryStore(path), embedder=embedder)
            todo = sids if total <= spec["embed_max"] else sorted(set(asked))
            started = time.perf_counter()
            for sid in todo:
                if synthetic:
                    random_vectors(engine, sid)
                engine.derive(sid)
                engine.recaller.ensure_vectors(sid)
            wall = time.perf_counter() - started
            dense: dict[str, Any] = {
                "embedded_turns": embedded,
                "embed_turns_per_s": embedded / wall,
                "synthetic_vectors": synthetic,
                **ingested.get("dense", {}),
            }
            engine.on_message_inbound(questions[-2], session_id=target, budget=2048)  # warm
            engine.recaller.settle()
            # 0 when the timed recalls scan every turn's vector (the benchmark's correctness)
            dense["unranked_turns_at_start"] = sum(
                engine.recaller.pending_vectors(sid) for sid in sorted(set(asked))
            )
            dense["steady"] = steady(engine, asks)
            out["rss_mb"]["after_dense"] = rss_mb()
            engine.close()
            out["dense"] = dense
        else:
            out["dense"] = None
            out["dense_skipped"] = (
                "embedder off (--no-embedder)"
                if not spec["embedder"]
                else f"{embedded:,} turns to embed > --embed-max {spec['embed_max']:,}"
            )
        # Each phase of first recalls grows the session (``grow`` turns): each starts from a
        # copy of the store as the steady recalls saw it, and the same turns are appended.
        # With ``keep`` that copy is the one ``side_by_side`` opens later (nothing writes it
        # before then), so the store is copied once.
        if spec.get("keep"):
            snapshot = Path(spec["keep"])
            stored = snapshot / path.name
            out["stored"] = {"path": str(stored), "asks": asks, "dense": embedder is not None}
        shutil.copytree(folder, snapshot)
        out["db_mb"] = round(sum(p.stat().st_size for p in folder.iterdir()) / 2**20, 1)
        phases: list[tuple[str, Any, list[str], str]] = [("keyword", None, later, questions[-1])]
        if embedder is not None:
            phases.append(("dense", embedder, later[2 * FIRSTS :], questions[-2]))
        written = position
        for n, (kind, model, asked_first, warm) in enumerate(phases):
            if n:
                shutil.rmtree(folder)
                shutil.copytree(snapshot, folder)
            if model is not None:  # no query-vector cache: the question again embeds too
                model = CachedEmbedder(model.inner, max_entries=0)
            engine = MemoryEngine(config, store=MemoryStore(path), embedder=model)
            engine.on_message_inbound(warm, session_id=target, budget=2048)
            engine.recaller.settle()
            engine, _, first = firsts(
                engine,
                target,
                asked_first,
                turns,
                written,
                spec["grow"],
                lambda m=model: MemoryEngine(config, store=MemoryStore(path), embedder=m),
            )
            engine.close()
            out[kind].update(first)
        out["vectors_mb"] = round(embedded * DIM * 4 / 2**20, 1) if out["dense"] else 0.0
        out["rss_mb"]["end"] = rss_mb()
        out["peak_rss_mb"] = common.peak_rss_mb()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        if not spec.get("keep"):
            shutil.rmtree(snapshot, ignore_errors=True)
    return out


def side_by_side(spec: dict[str, Any]) -> dict[str, Any]:
    """The runs' stores reopened in one process (a fresh engine each, warmed and settled as
    in ``run_config``), their steady recalls timed in ``ROUNDS`` alternating rounds, each
    round a share of every run's questions: the runs are compared under the same machine
    load, which the runs themselves, minutes apart, are not (keyword only, then with the
    default embedder for the runs that have vectors)."""
    settings: dict[str, Any] = {"context_window": 8192}
    if spec["synthetic_vectors"]:
        settings["recall"] = {"relevance_floor": None, "unknown_name_floor": None}
    config = MemoryConfig.model_validate(settings)
    out: dict[str, Any] = {"rounds": ROUNDS}
    model = None
    for kind in ("keyword", "dense"):
        stored = [r for r in spec["runs"] if kind == "keyword" or r["dense"]]
        if not stored:
            continue
        if kind == "dense":
            model = default_embedder().inner  # loaded once, shared
            model.embed(["warm up"])
        engines = []
        for r in stored:
            # Each engine caches its own query vectors (the runs ask the same questions: one
            # shared cache would answer every run's questions but the first's from memory).
            embedder = CachedEmbedder(model) if model is not None else None
            engine = MemoryEngine(config, store=MemoryStore(r["path"]), embedder=embedder)
            sid = r["asks"][0][0]
            engine.on_message_inbound(WARM_UP, session_id=sid, budget=2048)  # (not asked)
            engine.recaller.settle()
            engines.append(engine)
        samples = [common.Samples() for _ in stored]
        for round_ in range(ROUNDS):
            for r, engine, timings in zip(stored, engines, samples, strict=True):
                for sid, question in r["asks"][round_::ROUNDS]:
                    timings.add(
                        common.time_call(
                            lambda e=engine, s=sid, q=question: e.on_message_inbound(
                                q, session_id=s, budget=2048
                            )
                        )
                    )
        for engine in engines:
            engine.close()
        out[kind] = {
            r["label"]: timings.stats() for r, timings in zip(stored, samples, strict=True)
        }
    return out


def configs(
    quick: bool, embedder: bool, embed_max: int, questions: int, synthetic: bool = False
) -> list[dict[str, Any]]:
    if quick:
        shapes = [("one session, 300 turns", 1, 300), ("5 sessions x 60 turns", 5, 60)]
    else:
        shapes = [
            ("one session, 1k turns", 1, 1_000),
            ("one session, 10k turns", 1, 10_000),
            ("one session, 100k turns", 1, 100_000),
            ("1,000 sessions x 100 turns", 1_000, 100),
        ]
    return [
        {
            "label": label,
            "sessions": sessions,
            "turns_per_session": per,
            "questions": questions,
            "embedder": embedder,
            "embed_max": embed_max,
            "synthetic_vectors": synthetic,
            # Turns appended before the forced compactions (a share before each): at most the
            # session's own size, so the first recalls after them ask a session of at most
            # twice the size the steady recalls asked (1,000 x 100: 100 turns, not 500).
            "grow": 100 if quick else min(CHUNK, per),
        }
        for label, sessions, per in shapes
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    common.common_arguments(parser)
    parser.add_argument("--no-embedder", action="store_true", help="keyword-only recall")
    parser.add_argument("--embed-max", type=int, default=10_000, help="most turns to embed")
    parser.add_argument("--questions", type=int, default=None, help="recalls timed per run")
    parser.add_argument("--only", default=None, help="run only the configurations labelled so")
    parser.add_argument(
        "--sizes",
        default=None,
        help="comma-separated runs to do: 1k,10k,100k,1000x100 (default: all)",
    )
    parser.add_argument(
        "--synthetic-vectors",
        action="store_true",
        help="random vectors for the turns past --embed-max (dense cost, not ranking)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="an earlier memory_scale JSON, shown beside this run as 'before'",
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    data_dir = args.data_dir or common.default_data_dir()
    common.check_data(data_dir)
    if args.child is not None:
        spec = json.loads(args.child)
        print(json.dumps(side_by_side(spec) if "runs" in spec else run_config(spec, data_dir)))
        return
    n_q = args.questions or (5 if args.quick else 60)
    runs = []
    sizes = set(args.sizes.split(",")) if args.sizes else None
    keep = Path(tempfile.mkdtemp(prefix="cf-bench-scale-kept-"))
    try:
        for n, spec in enumerate(
            configs(args.quick, not args.no_embedder, args.embed_max, n_q, args.synthetic_vectors)
        ):
            if args.only and args.only not in spec["label"]:
                continue
            if sizes is not None and size_name(spec) not in sizes:
                continue
            spec["keep"] = str(keep / f"run{n}")
            run = common.run_child(__file__, spec, "--data-dir", str(data_dir))
            runs.append(run)
            print(summary(run), flush=True)
        together = common.run_child(
            __file__,
            {
                "label": "side by side",
                "synthetic_vectors": args.synthetic_vectors,
                "runs": [{"label": r["label"], **r.pop("stored")} for r in runs],
            },
            "--data-dir",
            str(data_dir),
        )
    finally:
        shutil.rmtree(keep, ignore_errors=True)
    print(side_by_side_summary(together), flush=True)
    result = common.base_result("memory_scale", __doc__.splitlines()[0], args.quick)
    result["parameters"] = {
        "chunk": CHUNK,
        "budget": 2048,
        "context_window": 8192,
        "questions": n_q,
        "first_recalls": FIRSTS,
        "floors_off_with_synthetic_vectors": args.synthetic_vectors,
    }
    result["runs"] = runs
    result["side_by_side"] = together
    result["correctness"] = {
        "every run recalled": all(r["keyword"]["steady"]["n"] == n_q for r in runs)
        and all(t["n"] == n_q for t in together["keyword"].values()),
        "every dense recall had every vector": all(
            r["dense"]["unranked_turns_at_start"] == 0 for r in runs if r["dense"]
        ),
    }
    result["peak_rss_mb"] = max(r["peak_rss_mb"] for r in runs)
    if args.baseline is not None:
        before = json.loads(args.baseline.read_text(encoding="utf-8"))
        load = before.get("machine", {}).get("load_avg_1m_at_start")
        result["baseline"] = {
            "commit": (before.get("git") or {}).get("commit") or "unknown",
            "runs": before["runs"],
            "note": (
                f"`{args.baseline.name}` ({before.get('command', '')}), an earlier run on the "
                f"same machine at load average {load} (compare the two only as far as the "
                "loads agree)"
            ),
        }
    path = common.write_result(result, args.results_dir, args.results_md)
    print(f"wrote {Path(path).name}")


def size_name(spec: dict[str, Any]) -> str:
    """``1k``, ``10k``, ``100k`` (one session) or ``1000x100`` (sessions x turns)."""
    if spec["sessions"] > 1:
        return f"{spec['sessions']}x{spec['turns_per_session']}"
    per = spec["turns_per_session"]
    return f"{per // 1000}k" if per >= 1000 else str(per)


def side_by_side_summary(together: dict[str, Any]) -> str:
    parts = []
    for kind in ("keyword", "dense"):
        if kind in together:
            p50s = ", ".join(f"{label} {t['median_ms']:.1f}" for label, t in together[kind].items())
            parts.append(f"{kind} p50 {p50s} ms")
    return f"side by side ({together['rounds']} alternating rounds): " + "; ".join(parts)


def summary(run: dict[str, Any]) -> str:
    kw, dense = run["keyword"], run["dense"]
    line = (
        f"{run['label']}: write {run['write']['turns_per_s']:.0f} turns/s; keyword p50 "
        f"{kw['steady']['median_ms']:.1f} p95 {kw['steady']['p95_ms']:.1f} ms, after compaction "
        f"{kw['after_compaction_ms']:.1f} (×{kw['after_compaction_paired']:.2f} the question "
        f"again), after restart {kw['after_restart_ms']:.1f} (×{kw['after_restart_paired']:.2f})"
        f", after a restart as ingested {kw['after_ingest_restart_ms']:.1f} "
        f"(×{kw['after_ingest_restart_paired']:.2f}) ms"
    )
    if dense and "after_ingest_restart_ms" in dense:
        line += (
            f"; dense after a restart as ingested {dense['after_ingest_restart_ms']:.1f} "
            f"(×{dense['after_ingest_restart_paired']:.2f}) ms"
        )
    if dense:
        line += (
            f"; dense p50 {dense['steady']['median_ms']:.1f} p95 {dense['steady']['p95_ms']:.1f}"
            f" ms, after compaction {dense['after_compaction_ms']:.1f} "
            f"(×{dense['after_compaction_paired']:.2f}), after restart "
            f"{dense['after_restart_ms']:.1f} (×{dense['after_restart_paired']:.2f}) ms"
        )
    return line + f"; RSS end {run['rss_mb']['end']} MB"


if __name__ == "__main__":
    main()
