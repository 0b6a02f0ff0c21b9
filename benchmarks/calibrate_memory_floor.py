"""Calibrate memory's relevance floors on LoCoMo's *tune* split; measure them on *held-out* once.

The floor (``recall.relevance_floor``) withholds all memory from a message whose best cosine
similarity with a stored turn is under it; the stricter ``recall.unknown_name_floor`` does the
same for a message naming something no stored turn contains (``contextfold.memory.relevance``).
Every question is asked once at ``BUDGET`` tokens with the floors off, through the same
``contextfold`` system as ``contextfold eval locomo`` (the real ``MemoryEngine``); the answer
keeps its evidence recall (real questions, categories 1–4 with evidence), its injected tokens
(the negative set: :func:`contextfold.eval.locomo.negative_questions`, ``NEGATIVES`` per
conversation from the split's other conversations) and its best similarity
(``RankedTurn.similarity``). Since the floors are all or nothing, a floor ``f`` gives exactly:
recall 0 and tokens 0 for a question whose best similarity is under ``f``, the floor-off
values otherwise — every candidate is scored without asking again. Each question also records
whether it names something the conversation never stored, so the name floor is scored the
same way.

1. ``python benchmarks/calibrate_memory_floor.py`` reads conversations 1–5 only and reports
   the trade-off curve (recall at ``BUDGET`` and negative-set tokens, mean and p95, per
   candidate). The floor chosen is the highest whose tune recall loss is at most
   ``TOLERANCE`` (half the issue's 1-point bar, a margin for the held-out half). With that
   floor, the name floor chosen is the lowest whose negative-set mean tokens are at most
   ``TOKEN_GOAL`` (half the issue's 50-token bar, the same margin).
2. Ship it (``contextfold.memory.config.RELEVANCE_FLOOR``), then
   ``python benchmarks/calibrate_memory_floor.py --held-out`` scores conversations 6–10 with
   the floors off, the relevance floor alone, and both shipped floors. Nothing is chosen from
   it.

A diagnostic beside the curve: the same negative questions with the names swapped for the
conversation's own speakers ("What did Caroline research?" asked of Jon and Gina becomes "What
did Jon research?"). Their answers are still never said in the conversation, but nothing in them
names a stranger, so they show what the floors do for a question about something never said when
the name floor cannot help. It is reported, never chosen from.

Result: ``memory_floor_calibration-*.json`` / ``memory_floor-*.json`` and a ``.md`` beside each.
Point ``CONTEXTFOLD_HOME`` at a folder whose ``embedding-cache.db`` holds the LoCoMo turns'
vectors (``contextfold eval locomo`` writes it) to skip embedding them again.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import _common as common
from contextfold.eval.locomo import (
    LocomoConversation,
    LocomoQA,
    load_locomo,
    negative_questions,
    split_conversations,
)
from contextfold.eval.locomo_memory import MemoryEngineSystem, eval_config
from contextfold.eval.locomo_run import evidence_recall
from contextfold.eval.locomo_systems import SystemContext
from contextfold.memory.config import RELEVANCE_FLOOR, UNKNOWN_NAME_FLOOR, MemoryConfig
from contextfold.memory.relevance import KnownNames, names_in
from contextfold.store.sqlite import home_dir

BUDGET = 2048
NEGATIVES = 100
TOLERANCE = 0.005
TOKEN_GOAL = 25.0
CANDIDATES = [round(0.01 * i, 2) for i in range(0, 71)]
CALIBRATION = "memory_floor_calibration"
MEASURE = "memory_floor"


def swapped(qa: LocomoQA, conv: LocomoConversation, convs: list[LocomoConversation]) -> LocomoQA:
    """``qa`` (a negative question for ``conv``) with its own conversation's speakers renamed
    to ``conv``'s, in order."""
    own = next(c for c in convs if c.qa and qa in c.qa)
    text = qa.question
    for theirs, ours in zip(own.speakers, conv.speakers, strict=False):
        text = re.sub(rf"\b{re.escape(theirs)}\b", ours, text)
    return dataclasses.replace(qa, question=text)


def observe(split: str, data: Path, limit: int | None) -> dict[str, list[dict[str, Any]]]:
    """Every question of ``split`` asked once with the floor off: recall or tokens, and best
    similarity."""
    convs = split_conversations(load_locomo(data), split)[:limit]
    settings = eval_config().model_dump()
    settings["recall"]["relevance_floor"] = None
    settings["recall"]["unknown_name_floor"] = None
    cfg = MemoryConfig.model_validate(settings)
    ctx = SystemContext(embedding_cache=home_dir() / "embedding-cache.db")
    real: list[dict[str, Any]] = []
    negative: list[dict[str, Any]] = []
    renamed: list[dict[str, Any]] = []
    try:
        for conv in convs:
            system = MemoryEngineSystem(ctx, cfg)
            system.ingest(conv)
            assert system.engine is not None
            known = KnownNames(system.engine.store)
            # True: a real question; False: the negative set; None: it with names swapped.
            asks: list[tuple[LocomoQA, bool | None]] = [
                (qa, True) for qa in conv.qa if qa.category != 5 and qa.evidence
            ]
            negatives = negative_questions(conv, convs, per_conversation=NEGATIVES)
            asks += [(qa, False) for qa in negatives]
            if split == "tune":
                asks += [(swapped(qa, conv, convs), None) for qa in negatives]
            for qa, is_real in asks:
                got = system.engine.on_message_inbound(qa.question, budget=BUDGET)
                sims = [r.similarity for r in got.recalled if r.similarity is not None]
                row = {
                    "conversation": conv.sample_id,
                    "question_id": qa.question_id,
                    "category": qa.category,
                    "best_similarity": round(max(sims), 4) if sims else None,
                    "unknown_name": bool(known.unknown(conv.sample_id, names_in(qa.question))),
                }
                if is_real:
                    gold = [conv.turn(d).turn_text for d in qa.evidence]
                    row["recall"] = evidence_recall(gold, got.prepend_text)
                    real.append(row)
                else:
                    row["tokens"] = ctx.counter.count(got.prepend_text)
                    (negative if is_real is False else renamed).append(row)
            print(f"{split} {conv.sample_id}: {len(asks)} questions", file=sys.stderr)
    finally:
        ctx.close()
    rows = {"real": real, "negative": negative}
    if renamed:
        rows["renamed"] = renamed
    return rows


def _passes(row: dict[str, Any], floor: float | None, names: float | None = None) -> bool:
    best = row["best_similarity"]
    if best is None:
        return True
    if floor is not None and best < floor:
        return False
    return names is None or not row.get("unknown_name") or best >= names


def score(
    rows: dict[str, list[dict[str, Any]]], floor: float | None, names: float | None = None
) -> dict[str, Any]:
    real, negative = rows["real"], rows["negative"]

    def passes(row: dict[str, Any]) -> bool:
        return _passes(row, floor, names)

    recall = [r["recall"] if passes(r) else 0.0 for r in real]
    by_cat = {
        str(c): round(statistics.fmean(v), 4)
        for c in (1, 2, 3, 4)
        if (v := [r["recall"] if passes(r) else 0.0 for r in real if r["category"] == c])
    }
    tokens = [r["tokens"] if passes(r) else 0 for r in negative]
    extra: dict[str, Any] = {}
    if rows.get("renamed"):
        renamed = [r["tokens"] if passes(r) else 0 for r in rows["renamed"]]
        extra = {
            "renamed_mean_tokens": round(statistics.fmean(renamed), 1),
            "renamed_p95_tokens": round(common.percentile(renamed, 95), 1),
        }
    return {
        "floor": floor,
        "name_floor": names,
        "recall": round(statistics.fmean(recall), 4),
        "recall_by_category": by_cat,
        "real_withheld": sum(not passes(r) for r in real),
        "real_naming_unknown": sum(bool(r.get("unknown_name")) for r in real),
        "negative_naming_unknown": sum(bool(r.get("unknown_name")) for r in negative),
        "negative_mean_tokens": round(statistics.fmean(tokens), 1),
        "negative_p95_tokens": round(common.percentile(tokens, 95), 1),
        "negative_empty_share": round(sum(t == 0 for t in tokens) / len(tokens), 3),
        **extra,
    }


def calibrate(data: Path, limit: int | None) -> dict[str, Any]:
    rows = observe("tune", data, limit)
    off = score(rows, None)
    curve = [score(rows, f) for f in CANDIDATES]
    ok = [c for c in curve if off["recall"] - c["recall"] <= TOLERANCE]
    chosen = max(ok, key=lambda c: c["floor"])
    # The name floor, with the relevance floor as shipped (its choice above is the record of
    # how that one was made).
    name_curve = [score(rows, RELEVANCE_FLOOR, f) for f in CANDIDATES if f >= RELEVANCE_FLOOR]
    quiet = [c for c in name_curve if c["negative_mean_tokens"] <= TOKEN_GOAL]
    name_chosen = min(quiet, key=lambda c: c["name_floor"]) if quiet else None
    return {
        "split": "tune",
        "budget": BUDGET,
        "tolerance": TOLERANCE,
        "token_goal": TOKEN_GOAL,
        "questions": {"real": len(rows["real"]), "negative": len(rows["negative"])},
        "off": off,
        "curve": curve,
        "chosen": chosen,
        "name_curve": name_curve,
        "name_chosen": name_chosen,
        "rows": rows,
    }


def measure(data: Path, limit: int | None) -> dict[str, Any]:
    rows = observe("held-out", data, limit)
    return {
        "split": "held-out",
        "budget": BUDGET,
        "shipped_floor": RELEVANCE_FLOOR,
        "shipped_name_floor": UNKNOWN_NAME_FLOOR,
        "questions": {"real": len(rows["real"]), "negative": len(rows["negative"])},
        "off": score(rows, None),
        "floor_only": score(rows, RELEVANCE_FLOOR),
        "on": score(rows, RELEVANCE_FLOOR, UNKNOWN_NAME_FLOOR),
        "rows": rows,
    }


def _row(c: dict[str, Any], off: dict[str, Any]) -> str:
    floor = "off" if c["floor"] is None else f"{c['floor']:.2f}"
    names = "off" if c.get("name_floor") is None else f"{c['name_floor']:.2f}"
    return (
        f"| {floor} | {names} | {c['recall']:.4f} | {off['recall'] - c['recall']:+.4f} "
        f"| {c['recall_by_category'].get('1', 0):.3f} | {c['real_withheld']} "
        f"| {c['negative_mean_tokens']:,.1f} | {c['negative_p95_tokens']:,.0f} "
        f"| {c['negative_empty_share']:.3f} |"
    )


def markdown(result: dict[str, Any], path: Path) -> str:
    head = (
        "| floor | name floor | recall 1–4 | loss vs off | multi-hop | real questions withheld "
        "| negative mean tokens | negative p95 tokens | negative share empty |\n"
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    q = result["questions"]
    off = result["off"]
    lines = [
        f"# {result['name']} ({path.name})",
        "",
        f"{result['description']} Split **{result['split']}**; budget {result['budget']:,} "
        f"tokens; {q['real']:,} real questions (categories 1–4 with evidence), {q['negative']:,} "
        f"negative-set questions; {off['real_naming_unknown']} real and "
        f"{off['negative_naming_unknown']} negative questions name something the conversation "
        "never stored.",
        "",
        head,
    ]
    if "curve" in result:
        lines.append(_row(off, off))
        lines += [_row(c, off) for c in result["curve"] if round(c["floor"] * 100) % 5 == 0]
        lines += ["", f"Chosen (highest floor with tune loss ≤ {result['tolerance']}):", "", head]
        lines.append(_row(result["chosen"], off))
        if result.get("name_curve"):
            lines += [
                "",
                f"The name floor, with the relevance floor as shipped ({RELEVANCE_FLOOR}):",
                "",
                head,
            ]
            lines += [
                _row(c, off) for c in result["name_curve"] if round(c["name_floor"] * 100) % 5 == 0
            ]
            if result.get("name_chosen"):
                lines += [
                    "",
                    "Chosen (lowest name floor with negative mean tokens ≤ "
                    f"{result['token_goal']:g}):",
                    "",
                    head,
                    _row(result["name_chosen"], off),
                ]
                chosen = result["name_chosen"]
                if "renamed_mean_tokens" in chosen:
                    lines += [
                        "",
                        "Diagnostic, the negative set with its names swapped for the "
                        "conversation's own speakers (nothing names a stranger): "
                        f"{off['renamed_mean_tokens']:,.1f} mean tokens with the floors off, "
                        f"{chosen['renamed_mean_tokens']:,.1f} (p95 "
                        f"{chosen['renamed_p95_tokens']:,.0f}) with the floors chosen.",
                    ]
    else:
        lines += [_row(off, off)]
        if "floor_only" in result:
            lines.append(_row(result["floor_only"], off))
        lines.append(_row(result["on"], off))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.common_arguments(parser)
    parser.add_argument("--held-out", action="store_true", help="step 2: score the shipped floor")
    args = parser.parse_args(argv)
    data = (args.data_dir or common.default_data_dir()) / "locomo"
    limit = 2 if args.quick else None
    started = time.perf_counter()
    if args.held_out:
        name, body = MEASURE, measure(data, limit)
        description = (
            "Memory's relevance floor on LoCoMo conversations 6–10, measured once after it was "
            "chosen on 1–5: recall of real questions and tokens injected for the negative set, "
            "floor off and at the shipped floor."
        )
    else:
        name, body = CALIBRATION, calibrate(data, limit)
        description = (
            "Memory's relevance floor calibrated on LoCoMo conversations 1–5 only: the "
            "trade-off between recall of real questions and tokens injected for the negative "
            "set; conversations 6–10 are not read."
        )
    result = common.base_result(name, description, args.quick)
    result.update(body)
    result["seconds"] = round(time.perf_counter() - started, 1)
    path = common.write_result(result, args.results_dir, args.results_md)
    md = path.with_suffix(".md")
    md.write_text(markdown(result, path), encoding="utf-8")
    summary = {
        k: v for k, v in result.items() if k in ("off", "floor_only", "on", "chosen", "name_chosen")
    }
    print(json.dumps(summary, indent=2))
    print(f"wrote {path} and {md}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
