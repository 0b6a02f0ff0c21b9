"""Memory for a question asked inside a long message: a pasted page, then the question (or the
question, then the page).

A chat user pastes what they are reading and asks about the conversation; a coding agent's
message carries a log or a file beside its question. Each LoCoMo question (categories 1–4 with
evidence) is asked of the conversation's ``MemoryEngine`` (ingested as ``contextfold eval
locomo`` does, the default configuration) three ways at ``BUDGET`` tokens: **alone**; **page,
then question** (the first sentences of a SciFact abstract, about 150 words, a blank line, the
question); **question, then page**. The negative set (``negative_questions``: other
conversations' questions this one cannot answer, ``NEGATIVES`` per conversation) is asked the
same three ways. Each long form is asked twice on the same engine: **before**, the recall
without a long message's asking sentences (``question_focus`` answering ``None``: the message
is embedded, judged by the relevance floor and decomposed whole), and **now**, the default
(``memory.decompose``: the asking sentences ranked as one more part, judged by the floor, and
decomposed in place of the message). A short question is its own focus, so *alone* is asked
once.

Reported per split (LoCoMo's tune half, conversations 1–5, and held-out, 6–10; nothing here
was chosen from either: ``FOCUS_MIN_WORDS`` and ``FOCUS_SENTENCES`` were set before measuring):
evidence recall 1–4 and multi-hop recall, the real questions withheld by the relevance floors,
and the negative set's injected tokens (mean, p95). Pages are drawn with a fixed seed, the same
page for a question's long forms. The recall's time is measured apart (the runs above share an
embedding cache, which would answer a long form's second asking from memory): the first
conversation again, with MiniLM uncached, ``TIMED`` questions each asked alone, then after a
page now and before, garbage collected before each call.

Run: ``python benchmarks/bench_long_messages.py`` (``--quick``: one conversation, a few
questions). Point ``CONTEXTFOLD_HOME`` at a folder whose ``embedding-cache.db`` holds the LoCoMo
turns' vectors (``contextfold eval locomo`` writes it) to skip embedding them again.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from collections.abc import Callable
from typing import Any

import _common as common
from contextfold.eval.locomo import (
    LocomoConversation,
    load_locomo,
    negative_questions,
    split_conversations,
)
from contextfold.eval.locomo_memory import MemoryEngineSystem, eval_config
from contextfold.eval.locomo_run import evidence_recall
from contextfold.eval.locomo_systems import SystemContext
from contextfold.items import Message
from contextfold.memory import recall as recall_module
from contextfold.memory.decompose import question_focus
from contextfold.memory.engine import MemoryEngine
from contextfold.retrieval.embedders import MiniLMEmbedder
from contextfold.store.sqlite import home_dir
from contextfold.store.sqlite.memory import MemoryStore

BUDGET = 2048
TIMED = 80
NEGATIVES = 100
PAGE_SENTENCES = 6
FORMS: dict[str, Callable[[str, str], str]] = {
    "page, then question": lambda page, q: f"{page}\n\n{q}",
    "question, then page": lambda page, q: (
        f"{q}\n\nFor context, this is what I was reading:\n{page}"
    ),
}


def _asks(
    system: MemoryEngineSystem, question: str, pages: list[str], rng: random.Random
) -> dict[str, Any]:
    """The question alone, then in each long form before and now: (context, withheld)."""
    engine = system.engine
    assert engine is not None
    page = rng.choice(pages)
    got = engine.on_message_inbound(question, budget=BUDGET)
    out = {"alone": (got.prepend_text, got.withheld is not None)}
    for form, make in FORMS.items():
        text = make(page, question)
        for variant in ("before", "now"):
            recall_module.question_focus = (  # type: ignore[attr-defined]
                (lambda _text: None) if variant == "before" else question_focus
            )
            try:
                got = engine.on_message_inbound(text, budget=BUDGET)
            finally:
                recall_module.question_focus = question_focus  # type: ignore[attr-defined]
            out[f"{form}, {variant}"] = (got.prepend_text, got.withheld is not None)
    return out


def observe(convs: list[LocomoConversation], pages: list[str], quick: bool) -> list[dict[str, Any]]:
    ctx = SystemContext(embedding_cache=home_dir() / "embedding-cache.db")
    rng = random.Random(22)
    rows: list[dict[str, Any]] = []
    try:
        for conv in convs:
            system = MemoryEngineSystem(ctx)
            system.ingest(conv)
            real = [qa for qa in conv.qa if qa.category != 5 and qa.evidence]
            negatives = negative_questions(conv, convs, per_conversation=NEGATIVES)
            if quick:
                real, negatives = real[:12], negatives[:6]
            for qa, is_real in [(qa, True) for qa in real] + [(qa, False) for qa in negatives]:
                asked = _asks(system, qa.question, pages, rng)
                row: dict[str, Any] = {
                    "conversation": conv.sample_id,
                    "split": "tune" if conv.index < 5 else "held-out",
                    "question_id": qa.question_id,
                    "category": qa.category,
                    "real": is_real,
                }
                gold = [conv.turn(d).turn_text for d in qa.evidence] if is_real else []
                for key, (context, withheld) in asked.items():
                    row[key] = (
                        {"recall": evidence_recall(gold, context), "withheld": withheld}
                        if is_real
                        else {"tokens": ctx.counter.count(context), "withheld": withheld}
                    )
                rows.append(row)
            print(f"{conv.sample_id}: {len(real)} real, {len(negatives)} negative", file=sys.stderr)
    finally:
        ctx.close()
    return rows


def timing(conv: LocomoConversation, pages: list[str], quick: bool) -> dict[str, Any]:
    """Each of the conversation's first ``TIMED`` questions alone, then after a page now and
    before, through an engine whose MiniLM has no cache (one process, questions in turn)."""
    first = conv.speakers[0]
    messages = [
        Message(role="user" if t.speaker == first else "assistant", content=t.turn_text)
        for t in conv.turns
    ]
    engine = MemoryEngine(eval_config(), store=MemoryStore(), embedder=MiniLMEmbedder())
    try:
        engine.ingest_history(messages, timestamps=[t.timestamp for t in conv.turns])
        engine.recaller.ensure_vectors(engine.session_id)
        rng = random.Random(5)
        samples = {k: common.Samples() for k in ("alone", "page, then question, now", "before")}
        questions = [qa.question for qa in conv.qa if qa.category != 5][: 8 if quick else TIMED]
        for question in questions:
            long = FORMS["page, then question"](rng.choice(pages), question)
            for key, samples_ in samples.items():
                recall_module.question_focus = (  # type: ignore[attr-defined]
                    (lambda _text: None) if key == "before" else question_focus
                )
                try:
                    text = question if key == "alone" else long
                    samples_.add(
                        common.time_call(lambda t=text: engine.on_message_inbound(t, budget=BUDGET))
                    )
                finally:
                    recall_module.question_focus = question_focus  # type: ignore[attr-defined]
    finally:
        engine.close()
    return {
        "conversation": conv.sample_id,
        "turns": len(conv.turns),
        "questions": len(questions),
        "stats": {
            ("page, then question, before" if k == "before" else k): v.stats()
            for k, v in samples.items()
        },
    }


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ["alone"] + [f"{f}, {v}" for f in FORMS for v in ("before", "now")]
    out: dict[str, Any] = {}
    for split in ("tune", "held-out", "all"):
        mine = [r for r in rows if split in ("all", r["split"])]
        real = [r for r in mine if r["real"]]
        negative = [r for r in mine if not r["real"]]
        if not real:
            continue
        out[split] = {"real_questions": len(real), "negative_questions": len(negative)}
        for key in keys:
            tokens = [r[key]["tokens"] for r in negative]
            multi = [r[key]["recall"] for r in real if r["category"] == 1]
            out[split][key] = {
                "recall": round(statistics.fmean(r[key]["recall"] for r in real), 6),
                "multi_hop": round(statistics.fmean(multi), 6) if multi else None,
                "real_withheld": sum(r[key]["withheld"] for r in real),
                "negative_mean_tokens": round(statistics.fmean(tokens), 1) if tokens else None,
                "negative_p95_tokens": round(common.percentile(tokens, 95), 1) if tokens else None,
            }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.common_arguments(parser)
    args = parser.parse_args()
    data = args.data_dir or common.default_data_dir()
    common.check_data(data)
    convs = load_locomo(data / "locomo")
    if args.quick:
        convs = split_conversations(convs, "tune")[:1] + split_conversations(convs, "held-out")[:1]
    pages = [" ".join(d.sentences[:PAGE_SENTENCES]) for d in common.scifact_docs(data)]
    pages = [p for p in pages if len(p.split()) >= 80][:500]
    rows = observe(convs, pages, args.quick)
    timed = timing(convs[0], pages, args.quick)
    result = common.base_result("long_messages", __doc__.split("\n\n")[0], args.quick)
    result.update(
        {
            "budget": BUDGET,
            "pages": {"source": "SciFact corpus_train abstracts", "sentences": PAGE_SENTENCES},
            "forms": list(FORMS),
            "summary": summarise(rows),
            "timing": timed,
            "rows": rows,
        }
    )
    path = common.write_result(result, args.results_dir, args.results_md)
    print(f"wrote {path.name}")


if __name__ == "__main__":
    main()
