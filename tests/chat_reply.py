"""A chat reply as the openai SDK reads it, whole or streamed, in one shape: content,
reasoning, reasoning_content, calls [(id, name, arguments)], finish and usage. The tests of
templates, tool calls and reasoning compare the two ways a client can read one reply."""

from __future__ import annotations

import json
from typing import Any

from openai import AsyncOpenAI


async def read_chat(api_url: str, request: dict[str, Any], stream: bool) -> dict[str, Any]:
    async with AsyncOpenAI(base_url=api_url, api_key="x", max_retries=0) as sdk:
        if not stream:
            response = await sdk.chat.completions.create(**request)
            choice = response.choices[0]
            extra = choice.message.model_extra or {}
            return {"content": choice.message.content or "", "reasoning": extra.get("reasoning") or "",
                    "reasoning_content": extra.get("reasoning_content") or "",
                    "calls": [(c.id, c.function.name, json.loads(c.function.arguments))
                              for c in choice.message.tool_calls or []],
                    "finish": choice.finish_reason, "usage": response.usage}
        out: dict[str, Any] = {"content": "", "reasoning": "", "reasoning_content": "", "finish": None,
                               "usage": None}
        calls: dict[int, list[Any]] = {}
        async for chunk in await sdk.chat.completions.create(
                **request, stream=True, stream_options={"include_usage": True}):
            out["usage"] = chunk.usage or out["usage"]
            if not chunk.choices:
                continue
            choice = chunk.choices[0]
            extra = choice.delta.model_extra or {}
            out["content"] += choice.delta.content or ""
            out["reasoning"] += extra.get("reasoning") or ""
            out["reasoning_content"] += extra.get("reasoning_content") or ""
            for call in choice.delta.tool_calls or []:
                if call.id:
                    calls[call.index] = [call.id, call.function.name, ""]  # type: ignore[union-attr]
                calls[call.index][2] += call.function.arguments or ""  # type: ignore[union-attr]
            out["finish"] = choice.finish_reason or out["finish"]
        out["calls"] = [(i, n, json.loads(a)) for i, n, a in calls.values()]
        return out
