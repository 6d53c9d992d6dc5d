"""The LLM agent: a Proposer that asks a model behind any OpenAI-compatible endpoint for the next
kernel. prompt.py builds the messages, llm.py sends them, kernel_source.py takes the kernel out of
the reply; modelnew_agent.py asks the same way for a KernelBench ModelNew.

A prompt the server refuses for its length is asked again smaller (prompt.LEVELS: fewer history
rows, a shorter playbook, no inspirations); where even the smallest does not fit, the target is
parked with the reason (NoPromptFits). A reply cut off at the token limit is a truncated
candidate: nothing is judged, and the next prompt asks for a shorter reply.
"""
from __future__ import annotations

from typing import Callable

from autokernel.errors import Plateau
from autokernel.search import prompt
from autokernel.search.kernel_source import description_of, extract_last_python_block
from autokernel.search.proposer import Candidate, SearchContext


class NoPromptFits(Plateau):
    """Even the smallest prompt is too long for the model: the target is parked for good."""

    blocked = True


class LLMProposer:
    """Asks an LLM for the next kernel: prompt.py builds the messages, llm.py sends them,
    kernel_source.py takes the last python block of the reply."""

    name = "llm"

    def __init__(self, client, messages_for: Callable[[SearchContext], list[dict]] | None = None) -> None:
        self.client = client  # an autokernel.search.llm.LLMClient (or anything with its query())
        # what to ask: prompt.build_messages by default; another task (KernelBench) passes its own
        self.messages_for = messages_for
        self.level = 0  # the smallest prompt level that fitted so far: never asked bigger again

    def propose(self, ctx: SearchContext) -> Candidate:
        from autokernel.search.llm import PromptTooLong
        levels = [0] if self.messages_for else list(range(self.level, prompt.LEVELS))
        refusal = ""
        for level in levels:
            messages = self.messages_for(ctx) if self.messages_for else prompt.build_messages(ctx, level)
            try:
                reply = self.client.query(messages)
            except PromptTooLong as e:
                refusal = str(e)
                continue
            self.level = level
            return self._candidate(messages, reply)
        model = getattr(self.client, "model", "the model")
        raise NoPromptFits(f"even the smallest prompt is too long for {model}: {refusal[:300]}")

    def _candidate(self, messages: list[dict], reply) -> Candidate:
        truncated = bool(getattr(reply, "truncated", False))
        source = None if truncated else extract_last_python_block(reply.text)
        if truncated:
            description = "reply cut off at the token limit"
        else:
            description = description_of(reply.text) or ("LLM proposal" if source else "reply without a kernel")
        return Candidate(source=source, description=description, prompt=prompt.render(messages),
                         response=reply.text, prompt_tokens=reply.prompt_tokens,
                         completion_tokens=reply.completion_tokens, llm_seconds=reply.seconds,
                         model=getattr(reply, "model", "") or getattr(self.client, "model", "") or "llm",
                         truncated=truncated)

    def observe(self, candidate: Candidate, verdict: dict | None) -> None:
        pass  # the next prompt reads the history from the context
