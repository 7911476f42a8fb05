"""One choice's output split into reasoning and content as it grows: each feed returns the
new part of each, the difference between two splits of the whole text so far."""

from __future__ import annotations

from server.respond.reasoning.base import ReasoningParser


class ReasoningStream:
    def __init__(self, parser: ReasoningParser) -> None:
        self.parser = parser
        self.text = ""
        self.reasoning_sent = ""
        self.content_sent = ""

    def feed(self, text: str, final: bool) -> tuple[str, str]:
        """Add new output; return (new reasoning, new content)."""
        self.text += text
        reasoning, content = self.parser.split(self.text, final)
        new_reasoning = tail_after(reasoning, self.reasoning_sent)
        new_content = tail_after(content, self.content_sent)
        self.reasoning_sent += new_reasoning
        self.content_sent += new_content
        return new_reasoning, new_content


def tail_after(whole: str, sent: str) -> str:
    """What `whole` adds to what was sent; nothing if it no longer extends it."""
    return whole[len(sent):] if whole.startswith(sent) else ""
