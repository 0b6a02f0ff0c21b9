"""The OpenAI Responses API on a ``FakeLLMServer``: ``POST /v1/responses``, JSON and streamed.

``ResponsesFake(fake)`` adds the route. It answers ``fake.reply`` — a string, or a function of
the request body whose ``input`` is the *whole* conversation the provider holds (a string input
made one user item, a ``previous_response_id``'s stored conversation or a ``conversation``'s
items put before the new items)
returning a string or a ``ModelTurn``. Like OpenAI it keeps each response's conversation (its
input and output) unless the request says ``store: false``, so ``previous_response_id`` works;
an unknown one is a 400, and so is an ``input`` that is neither a string nor a list of objects.

Output: a ``reasoning`` item first when ``reasoning`` is set (with ``encrypted_content``, as
for a ``store: false`` client), then a ``message`` with one ``output_text`` part, then one
``function_call`` per tool call. Streams (``"stream": true``) send OpenAI's events, the text
a word per ``response.output_text.delta``, and end with ``response.completed`` — or with
``response.incomplete`` when ``status`` is ``"incomplete"``; ``cut_after`` ends the stream
after that many events (no terminal event: a stream broken off). ``events`` keeps the raw SSE
events of the last stream sent.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from fake_llm import FakeLLMServer, RecordedRequest, Reply, error_body, words_of


class ResponsesFake:
    def __init__(self, fake: FakeLLMServer) -> None:
        self.fake = fake
        self.stored: dict[str, list[Any]] = {}
        self.conversations: dict[str, list[Any]] = {}
        self.reasoning = False
        self.status = "completed"
        self.cut_after: int | None = None
        self.events: list[bytes] = []
        self._count = 0
        fake.route("POST", r"/v1/responses", self._handle)

    def _bad(self, request: RecordedRequest, message: str) -> Reply:
        body = error_body(request.path, 400, message)
        body["error"].update({"type": "invalid_request_error", "param": "input", "code": None})
        return Reply(400, body)

    def _handle(self, request: RecordedRequest, _: re.Match[str]) -> Reply:
        body = request.body
        if not isinstance(body, dict):
            return self._bad(request, "We could not parse the JSON body of your request.")
        value = body.get("input")
        if isinstance(value, str):
            items: list[Any] = [{"role": "user", "content": value}]
        elif isinstance(value, list) and all(isinstance(i, dict) for i in value):
            items = list(value)
        else:
            return self._bad(
                request, "Invalid type for 'input': expected a string or an array of items."
            )
        previous = body.get("previous_response_id")
        if previous is not None:
            if previous not in self.stored:
                return self._bad(request, f"Previous response with id '{previous}' not found.")
            items = [*self.stored[previous], *items]
        conversation = body.get("conversation")
        if isinstance(conversation, dict):
            conversation = conversation.get("id")
        if isinstance(conversation, str):
            held = self.conversations.setdefault(conversation, [])
            new, items = items, [*held, *items]
        turn = self.fake._turn({**body, "input": items})
        self._count += 1
        n = self._count
        output: list[dict[str, Any]] = []
        if self.reasoning:
            output.append(
                {
                    "id": f"rs_{n}",
                    "type": "reasoning",
                    "summary": [],
                    "encrypted_content": f"gAAAAB-opaque-{n}==",
                }
            )
        if turn.text or not turn.tool_calls:
            output.append(
                {
                    "id": f"msg_{n}",
                    "type": "message",
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": turn.text, "annotations": []}],
                }
            )
        for i, call in enumerate(turn.tool_calls):
            output.append(
                {
                    "id": f"fc_{n}_{i}",
                    "type": "function_call",
                    "status": "completed",
                    "call_id": call.id or f"call_{n}_{i}",
                    "name": call.name,
                    "arguments": json.dumps(call.arguments),
                }
            )
        words = len(json.dumps(items).split())
        response = {
            "id": f"resp_{n}",
            "object": "response",
            "created_at": int(time.time()),
            "status": self.status,
            "error": None,
            "incomplete_details": (
                {"reason": "max_output_tokens"} if self.status == "incomplete" else None
            ),
            "instructions": body.get("instructions"),
            "model": body.get("model", self.fake.model),
            "output": output,
            "parallel_tool_calls": True,
            "previous_response_id": previous,
            "store": body.get("store", True),
            "temperature": 1.0,
            "text": {"format": {"type": "text"}},
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools", []),
            "top_p": 1.0,
            "truncation": "disabled",
            "usage": {
                "input_tokens": words,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": len(turn.text.split()),
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": words + len(turn.text.split()),
            },
            "metadata": {},
        }
        if body.get("store", True) is not False:
            self.stored[response["id"]] = [*items, *output]
        if isinstance(conversation, str):
            self.conversations[conversation] += [*new, *output]
        if not body.get("stream"):
            return Reply(200, response)
        self.events = self._events(response)
        events = self.events if self.cut_after is None else self.events[: self.cut_after]
        headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        return Reply(200, None, headers, stream=events, gate=self.fake._gate)

    def _events(self, response: dict[str, Any]) -> list[bytes]:
        events: list[bytes] = []

        def event(kind: str, **data: Any) -> None:
            payload = {"type": kind, "sequence_number": len(events), **data}
            events.append(f"event: {kind}\ndata: {json.dumps(payload)}\n\n".encode())

        start = {**response, "status": "in_progress", "output": [], "usage": None}
        event("response.created", response=start)
        event("response.in_progress", response=start)
        for index, item in enumerate(response["output"]):
            at = {"output_index": index}
            if item["type"] == "message":
                text = item["content"][0]["text"]
                event(
                    "response.output_item.added",
                    **at,
                    item={**item, "status": "in_progress", "content": []},
                )
                part = {"type": "output_text", "text": "", "annotations": []}
                ids = {"item_id": item["id"], **at, "content_index": 0}
                event("response.content_part.added", **ids, part=part)
                for piece in words_of(text):
                    event("response.output_text.delta", **ids, delta=piece, logprobs=[])
                event("response.output_text.done", **ids, text=text, logprobs=[])
                event("response.content_part.done", **ids, part={**part, "text": text})
            elif item["type"] == "function_call":
                event(
                    "response.output_item.added",
                    **at,
                    item={**item, "status": "in_progress", "arguments": ""},
                )
                arguments = item["arguments"]
                half = len(arguments) // 2
                for piece in (arguments[:half], arguments[half:]):
                    event(
                        "response.function_call_arguments.delta",
                        item_id=item["id"],
                        **at,
                        delta=piece,
                    )
                event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    **at,
                    arguments=arguments,
                )
            else:
                event("response.output_item.added", **at, item=item)
            event("response.output_item.done", **at, item=item)
        terminal = (
            "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        )
        event(terminal, response=response)
        return events
